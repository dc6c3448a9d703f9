"""Gemma 3 text models: logits against transformers (HF folder and GGUF), the exactness properties
speculation rests on with sliding-window layers, and the real gemma3-270m file."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import make_gemma3_gguf_model, make_gemma3_hf_model
from specdec.drafters.base import TokenTree
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model import kernels
from specdec.model.catalogue import model_path
from specdec.model.linear import CONVERTED_FORMATS
from specdec.model.load import load_model
from specdec.model.segments import Segment
from specdec.sampling import SamplingParams

TOKENS = [(7 * i + 3) % 500 for i in range(40)]  # 8x the default window of 5
# four layers, two of them global; a global RoPE with linear scaling, an attention scale other than
# 1/sqrt(head_dim), softcapped logits, an untied head, one kv head for four query heads
MIXED = dict(layers=4, kv_heads=1, window=3, query_pre_attn_scalar=24, final_logit_softcapping=5.0,
             tie_word_embeddings=False,
             layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
             rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
                              "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
FORMATS = [pytest.param(f, marks=pytest.mark.skipif(f == "w8a8" and kernels.w8a8() is None,
                                                    reason="no W8A8 kernel here (no cc or no AVX2)"))
           for f in CONVERTED_FORMATS]


def specdec_logits(path, tokens=TOKENS, exact=True) -> torch.Tensor:
    tr = load_model(str(path), "fp32", progress=False).transformer
    cache = tr.new_cache(256)
    return tr.forward(torch.tensor([tokens]), cache, [cache.allocate()], exact=exact).logits[0]  # (T, V)


def transformers_logits(folder, tokens=TOKENS) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    with torch.no_grad():
        return ref(torch.tensor([tokens])).logits[0]


def greedy(model, prompt, n, max_len=256) -> list[int]:
    """specdec's plain greedy output (Engine; an EOS ends it and is not part of it)."""
    return Engine(model, max_len=max_len).generate(prompt, SamplingParams(), max_tokens=n).token_ids


def transformers_greedy(ref, prompt, n, eos_ids) -> list[int]:
    """transformers' greedy output under the same stopping rule (its EOS dropped, as the Engine drops it)."""
    eos = sorted(eos_ids)
    out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                       pad_token_id=eos[0])[0, len(prompt):].tolist()
    return out[:-1] if out and out[-1] in eos else out


# -- against transformers ------------------------------------------------------------------------
@pytest.mark.parametrize("config", [{}, MIXED], ids=["every-6th-global", "mixed"])
def test_hf_folder_matches_transformers(tmp_path, config):
    from transformers import AutoModelForCausalLM

    folder = make_gemma3_hf_model(tmp_path / "g", **config)
    theirs = transformers_logits(folder)
    for exact in (True, False):
        ours = specdec_logits(folder, exact=exact)
        assert (ours - theirs).abs().max() < 1e-4, f"exact={exact}: {(ours - theirs).abs().max():.2e}"
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    model = load_model(str(folder), "fp32", progress=False)
    prompt = TOKENS[:12]
    ours = greedy(model, prompt, 32)
    assert len(ours) > 8  # long enough to cross the window a few times
    assert ours == transformers_greedy(ref, prompt, 32, model.tokenizer.eos_ids)


def test_the_sliding_window_is_what_made_them_agree(tmp_path):
    """The same weights with a window wider than the sequence: far from transformers' windowed logits."""
    theirs = transformers_logits(make_gemma3_hf_model(tmp_path / "windowed"))
    unwindowed = specdec_logits(make_gemma3_hf_model(tmp_path / "wide", window=64))
    assert (unwindowed[:5] - theirs[:5]).abs().max() < 1e-4  # within the first window they agree
    assert (unwindowed - theirs).abs().max() > 1e-2


LINEAR = {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
          "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}}


@pytest.mark.parametrize("config", [{}, {"rope_parameters": LINEAR}], ids=["plain-rope", "linear-rope"])
def test_gguf_gives_the_hf_folder_logits(tmp_path, config):
    """llama.cpp's layout: gemma3 tensor names, 1 + w stored for every norm, no output.weight; linear RoPE
    scaling (rope.scaling.type) for the global layers only."""
    hf = load_model(str(make_gemma3_hf_model(tmp_path / "hf", **config)), "fp32", progress=False)
    gg = load_model(str(make_gemma3_gguf_model(tmp_path / "g.gguf", **config)), "fp32", progress=False)
    assert gg.info.arch == "gemma3" and gg.config.sliding_layers == hf.config.sliding_layers == (0, 1, 2, 3, 4)
    assert (gg.config.sliding_window, gg.config.attn_scale, gg.config.embed_scale) == (5, 0.25, 8.0)
    assert gg.config.rope_freq_factors == hf.config.rope_freq_factors == (None if not config else (4.0,) * 8)
    ids = torch.tensor([TOKENS])
    a = hf.transformer.forward(ids, hf.transformer.new_cache(64), [0]).logits
    b = gg.transformer.forward(ids, gg.transformer.new_cache(64), [0]).logits
    assert (a - b).abs().max() < 1e-5
    if config:  # and the scaling is transformers': the HF folder against transformers
        assert (a[0] - transformers_logits(tmp_path / "hf")).abs().max() < 1e-4


def test_refused_gemma_settings_are_clear_errors(tmp_path):
    from specdec.model.errors import ModelFileError

    for extra, message in (({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
                           ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
                           ({"hidden_activation": "gelu"}, "hidden_act 'gelu' is not supported")):
        folder = make_gemma3_hf_model(tmp_path / message.split()[0], **extra)
        with pytest.raises(ModelFileError, match=message):
            load_model(str(folder), "fp32", progress=False)
    multimodal = make_gemma3_hf_model(tmp_path / "multimodal", model_type="gemma3")
    with pytest.raises(ModelFileError, match="'gemma3' is multimodal Gemma 3 .* gemma3_text"):
        load_model(str(multimodal), "fp32", progress=False)


def test_the_converted_weights_cache_keeps_the_gemma_tensors(tmp_path):
    """The four norms survive transformer_tensors -> transformer_from_tensors (model/weight_cache.py's path)."""
    from specdec.model.build import transformer_from_tensors, transformer_tensors

    tr = load_model(str(make_gemma3_hf_model(tmp_path / "g", **MIXED)), "int8", progress=False).transformer
    tensors = transformer_tensors(tr)
    assert "layers.0.attn_out_norm" in tensors and "layers.3.mlp_out_norm" in tensors
    again = transformer_from_tensors(tr.config, "int8", tensors)
    ids = torch.tensor([TOKENS])
    assert torch.equal(tr.forward(ids, tr.new_cache(64), [0]).logits,
                       again.forward(ids, again.new_cache(64), [0]).logits)


# -- exactness with sliding windows --------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    return make_gemma3_hf_model(tmp_path_factory.mktemp("gemma3") / "mixed", **MIXED)


PROMPT = TOKENS[:10]  # past the window (3) already
NEW = [40, 41, 300, 301, 7, 8, 99]


def _prefill(tr, cache, slot, ids):
    return tr.forward(torch.tensor([ids]), cache, [slot], exact=False, last_only=True)


@pytest.mark.parametrize("fmt", FORMATS)
def test_multi_token_forward_equals_single_steps_bitwise(mixed_dir, fmt):
    tr = load_model(str(mixed_dir), fmt, progress=False).transformer
    cache = tr.new_cache(64)
    slot = cache.allocate()
    _prefill(tr, cache, slot, PROMPT)
    start = cache.lengths[slot]
    singles = [tr.forward(torch.tensor([[t]]), cache, [slot]).logits[0, 0] for t in NEW]
    cache.truncate(slot, start)  # rollback, then all at once
    multi = tr.forward(torch.tensor([NEW]), cache, [slot]).logits[0]
    for i in range(len(NEW)):
        assert torch.equal(multi[i], singles[i]), f"row {i} differs in {fmt}"
    cache.truncate(slot, start)  # rollback again, then one by one: identical to the first time
    assert all(torch.equal(tr.forward(torch.tensor([[t]]), cache, [slot]).logits[0, 0], s)
               for t, s in zip(NEW, singles))


@pytest.mark.parametrize("fmt", ["fp32", "int8"])
def test_tree_deeper_than_the_window_equals_the_path_alone(mixed_dir, fmt):
    """A path of depth 5 under a window of 3: each node sees its window counted by its position,
    among its ancestors only; then keep() and one more step match decoding the path alone."""
    tr = load_model(str(mixed_dir), fmt, progress=False).transformer
    cache = tr.new_cache(64)
    slot = cache.allocate()
    _prefill(tr, cache, slot, PROMPT)
    start = cache.lengths[slot]
    tree = TokenTree((40, 99, 300, 12, 7, 8, 9, 13), (-1, -1, 0, 0, 2, 4, 5, 4))
    path_nodes = [0, 2, 4, 5, 6]
    path = [tree.tokens[i] for i in path_nodes]
    singles = [tr.forward(torch.tensor([[t]]), cache, [slot]).logits[0, 0] for t in path]
    cache.truncate(slot, start)
    positions = torch.tensor([[start + d - 1 for d in tree.depths()]])
    logits = tr.forward(torch.tensor([list(tree.tokens)]), cache, [slot], positions=positions,
                        tree_mask=tree.attention_mask()[None]).logits[0]
    for node, single in zip(path_nodes, singles):
        assert torch.equal(logits[node], single), f"node {node}"
    cache.keep(slot, start, path_nodes)
    after_tree = tr.forward(torch.tensor([[8]]), cache, [slot]).logits[0, 0]
    cache.truncate(slot, start)
    for t in path:
        tr.forward(torch.tensor([[t]]), cache, [slot])
    assert torch.equal(after_tree, tr.forward(torch.tensor([[8]]), cache, [slot]).logits[0, 0])


def test_ragged_batch_gives_each_sequence_its_solo_outputs_bitwise(mixed_dir):
    tr = load_model(str(mixed_dir), "int8", progress=False).transformer
    tree = TokenTree((40, 99, 300, 12, 7), (-1, -1, 0, 0, 2))

    def fresh():
        cache = tr.new_cache(64, num_slots=3)
        slots = [cache.allocate() for _ in range(3)]
        for slot, n in zip(slots, (5, 10, 7)):
            _prefill(tr, cache, slot, PROMPT[:n])
        return cache, slots

    def run(cache, slots, which):
        start = cache.lengths[slots[2]]
        segments = [Segment(torch.tensor(PROMPT[5:]), slots[0], exact=False, last_only=True),
                    Segment(torch.tensor(NEW[:4]), slots[1]),
                    Segment(torch.tensor(list(tree.tokens)), slots[2],
                            positions=torch.tensor([start + d - 1 for d in tree.depths()]),
                            tree_mask=tree.attention_mask())]
        return tr.forward_batch([segments[i] for i in which], cache)

    cache, slots = fresh()
    together = run(cache, slots, [0, 1, 2])
    for i in range(3):
        solo_cache, solo_slots = fresh()
        (alone,) = run(solo_cache, solo_slots, [i])
        assert torch.equal(together[i].logits, alone.logits), f"sequence {i}"


@pytest.mark.parametrize("drafter", ["ngram-simple", "suffix"])
def test_greedy_speculation_equals_plain_decoding(mixed_dir, drafter):
    """Prompts (found by search) on which the tiny model's output repeats enough for the drafters:
    the first has almost every draft accepted, the second most rejected."""
    model = load_model(str(mixed_dir), "int8", progress=False)
    engine = Engine(model, max_len=256)
    drafted = accepted = 0
    for prompt in ([174, 381] * 3, [427, 336, 44, 3, 307, 101] * 8):
        out = engine.generate(prompt, SamplingParams(), max_tokens=48, spec=SpecConfig(drafters=(drafter,)))
        assert out.token_ids == greedy(model, prompt, 48)
        assert len(out.token_ids) == 48
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert 0 < accepted < drafted, "both the accepted and the rejected branch must have run"


# -- the real file -------------------------------------------------------------------------------
# a natural sentence pattern (Gemma's ids for "The capital of France is the capital of the city of
# Paris. ..."), repeated past the 512-token window so that the local layers mask
_SENTENCE = [818, 5279, 529, 7001, 563, 506, 5279, 529, 506, 2891, 529, 7001, 236761, 1030, 563, 506, 7488, 3207,
             528, 7001, 532, 506, 1855, 7488, 3207, 528, 3879, 236761, 1030, 563, 5628, 528, 506, 6029, 529, 506,
             2891, 532, 563, 506, 5279, 529, 506, 4128, 529, 506, 1638, 1463, 236761, 108]
LONG_PROMPT = [2] + _SENTENCE * 11  # 551 tokens


@pytest.mark.slow
def test_gemma3_270m_matches_transformers_on_the_same_gguf():
    """specdec fp32 vs transformers dequantizing the same Q4_K_M file to fp32: logits over a prompt longer
    than the sliding window, and 64 greedy tokens."""
    from transformers import AutoModelForCausalLM

    path = model_path("gemma3-270m")
    if not path.is_file():
        pytest.skip("gemma3-270m is not pulled (specdec pull gemma3-270m)")
    from helpers.models import fast_gguf_reader

    with fast_gguf_reader():
        ref = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    with torch.no_grad():
        theirs = ref(torch.tensor([LONG_PROMPT])).logits[0]
    model = load_model("gemma3-270m", "fp32", progress=False)
    assert model.config.sliding_window == 512 and len(model.config.sliding_layers) == 15
    tr = model.transformer
    cache = tr.new_cache(1024)
    ours = tr.forward(torch.tensor([LONG_PROMPT]), cache, [cache.allocate()]).logits[0]
    diff = (ours - theirs).abs().max().item()
    print(f"gemma3-270m fp32, {len(LONG_PROMPT)} tokens: max abs logit difference {diff:.2e}")
    assert diff < 1e-3
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    ours_greedy = greedy(model, LONG_PROMPT, 64, max_len=1024)
    assert len(ours_greedy) == 64
    assert ours_greedy == transformers_greedy(ref, LONG_PROMPT, 64, model.tokenizer.eos_ids)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["ngram-simple", "suffix"])
def test_gemma3_270m_greedy_speculation_equals_plain_past_the_window(drafter):
    """gguf (the default format): verify forwards whose rows straddle the 512-token window."""
    if not model_path("gemma3-270m").is_file():
        pytest.skip("gemma3-270m is not pulled (specdec pull gemma3-270m)")
    from helpers.models import real_model

    model = real_model("gemma3-270m", "gguf")
    engine = Engine(model, max_len=1024)
    plain = engine.generate(LONG_PROMPT, SamplingParams(), max_tokens=48).token_ids
    out = engine.generate(LONG_PROMPT, SamplingParams(), max_tokens=48, spec=SpecConfig(drafters=(drafter,)))
    assert out.stats.accepted > 0
    assert out.token_ids == plain
