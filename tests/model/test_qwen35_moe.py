"""Qwen3.5-MoE and Qwen3-Next (the hybrid of Gated DeltaNet and gated attention, the MLPs mixtures with a gated
shared expert) against the reference, and speculation on them.

Checkpoints the reference wrote: folders written by transformers' own Qwen3_5Moe classes (the text model, the
published multimodal layout, experts one by one and fused) and Qwen3Next classes (fused in_proj_qkvz / in_proj_ba,
dense layers where mlp_only_layers says), and llama.cpp's conversions of the text ones (tests/model/data/
qwen35moe-tiny and qwen3next-tiny, by its own convert_hf_to_gguf.py, architectures qwen35moe, qwen3next). fp32 logits agree
with transformers' within 1e-5 of the largest; the MTP layer (its MLP a mixture too) agrees with transformers'
own Qwen3_5MoeDecoderLayer behind the MTP projection; greedy speculative output is plain decoding alone and in
a batch (drafts accepted and rejected: the recurrent state rolled back); sampled output follows the target's law.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGUFReader

from helpers.distribution import engine_law
from helpers.drafts import Biased, likely_bias
from helpers.oracle import assert_batched_oracles_keep_plain, assert_oracle_keeps_plain, plain
from helpers.qwen35moe import (FIXTURE, NEXT_FIXTURE, NO_TREE, convert_to_gguf, fixture_folder, llama_cpp_tree,
                               mtp_reference, transformers_folder)
from helpers.reference import assert_close, specdec_logits, transformers_logits
from helpers.spec import spec_for_model
from helpers.tree_law import mtp_law
from specdec.cli.inspect import inspect_model
from specdec.drafters.mtp import load_mtp_head
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model import kernels
from specdec.model.load import load_model
from specdec.model.moe import MoE
from specdec.sampling import SamplingParams

TOKENS = [(7 * i + 3) % 260 for i in range(40)]
PROMPTS = [TOKENS[2:12], TOKENS[12:19], TOKENS[20:33]]
F16, Q8 = FIXTURE / "f16.gguf", FIXTURE / "q8_0.gguf"
NEXT_F16, NEXT_Q8 = NEXT_FIXTURE / "f16.gguf", NEXT_FIXTURE / "q8_0.gguf"
FIXTURES = {"text": FIXTURE, "next": NEXT_FIXTURE}  # the folder layout each fixture was converted from

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def load(path, fmt="fp32"):
    return load_model(str(path), fmt, progress=False, weight_cache=False)


@pytest.fixture(scope="module", params=list(FIXTURES), ids=["qwen35moe", "qwen3next"])
def folder(request, tmp_path_factory):
    """The folder a fixture's GGUF files were converted from (helpers/qwen35moe.fixture_folder)."""
    return fixture_folder(tmp_path_factory.mktemp(request.param) / "hf", request.param)


def fixture_of(folder):
    return FIXTURES["next" if "next" in folder.parent.name else "text"]


def reference_logits(path, tokens=TOKENS) -> torch.Tensor:
    return transformers_logits(path, tokens)


def logits(model, tokens=TOKENS, exact=True) -> torch.Tensor:
    return specdec_logits(model, tokens, exact)


# -- against transformers -----------------------------------------------------------------------------------
LAYOUTS = [("text", False, False, {}), ("published", True, False, {}), ("text", False, True, {}),
           ("next", False, False, {}), ("next", True, False, dict(mlp_only_layers=[1], norm_topk_prob=False))]


@pytest.mark.parametrize("layout,tie,fused,sizes", LAYOUTS, ids=["text-experts-one-by-one", "published-tied", "fused",
                                                                 "qwen3next", "qwen3next-dense-layer-1-unnormed"])
def test_folders_transformers_wrote_give_its_logits_and_greedy_tokens(tmp_path, layout, tie, fused, sizes):
    from transformers import AutoModelForCausalLM

    path = transformers_folder(tmp_path / layout, layout, seed=3, tie=tie, fused=fused, **sizes)
    model = load(path)
    c, nxt = model.config, layout == "next"
    assert (c.arch, c.linear_attention.layers, c.rope_dims, c.tie_embeddings, c.linear_attention.tiled) == \
        ("qwen3next" if nxt else "qwen35moe", (0, 1, 2), 4, tie, False)
    moe_layers = tuple(i for i in range(4) if i not in sizes.get("mlp_only_layers", []))
    assert (c.moe.experts, c.moe.experts_per_token, c.moe.layers, c.moe.shared_intermediate, c.moe.shared_gate,
            c.moe.norm_topk) == (4, 2, moe_layers, 32, True, sizes.get("norm_topk_prob", True))
    assert [isinstance(layer.moe, MoE) for layer in model.transformer.layers] == [i in moe_layers for i in range(4)]
    # its MTP layer lights draft-mtp up, declared (mtp_num_hidden_layers) or not (Qwen3-Next's config.json)
    assert c.mtp_layers_declared == (0 if nxt else 1) and "draft-mtp" in [d.kind for d in spec_for_model(model)[0].drafters]
    theirs = reference_logits(path)
    for exact in (True, False):
        assert_close(logits(model, exact=exact), theirs)
    prompt = PROMPTS[0]
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ours = Engine(model, max_len=256).generate(prompt, SamplingParams(), max_tokens=16).token_ids
    theirs = ref.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=2,
                          pad_token_id=2)[0, len(prompt):].tolist()
    assert ours == (theirs[:-1] if theirs[-1] == 2 else theirs) and len(ours) > 8


def test_llama_cpp_files_give_transformers_logits(folder):
    """f16 (the weights exactly): llama.cpp's names, stacked experts, shared-expert gate, value heads (tiled in
    qwen35moe, grouped in qwen3next), Qwen3-Next's fused ssm_ba (1e-5);
    Q8_0 in its own blocks (the experts computed from them): the quantization's error only (a row whose choice of
    experts it flips moves further: the median row is bounded)."""
    theirs, fixture = reference_logits(folder), fixture_of(folder)
    model = load(fixture / "f16.gguf")
    assert model.config.arch == ("qwen3next" if fixture == NEXT_FIXTURE else "qwen35moe") and model.config.moe.shared_gate
    assert model.config.linear_attention.tiled == (fixture == FIXTURE) and model.config.mtp_layers_declared == 1
    assert_close(logits(model), theirs)
    for fmt in ("fp32",) + (("gguf",) if kernels.gguf() is not None else ()):
        ours = logits(load(fixture / "q8_0.gguf", fmt))
        assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.8
        assert (ours - theirs).abs().max(-1).values.median() < 0.1 * theirs.abs().max()


@pytest.mark.parametrize("source", ["folder", "llama.cpp-f16"])
def test_the_mtp_layer_is_transformers_moe_block_behind_the_projection(source, folder):
    """Logits and fed-forward rows of the MTP layer (its MLP a mixture with the gated shared expert) over the
    target's own rows, against transformers' Qwen3_5MoeDecoderLayer holding the checkpoint's mtp.layers.0."""
    from transformers import AutoModelForCausalLM

    model = load(folder if source == "folder" else fixture_of(folder) / "f16.gguf")
    head, where = load_mtp_head(model, 128)
    assert where == "MTP layers in the checkpoint" and head.mods[0].block.moe.cfg == model.config.moe
    T, L = 24, model.config.num_layers
    tr = model.transformer
    cache = tr.new_cache(64)
    out = tr.forward(torch.tensor([TOKENS[:T]]), cache, [cache.allocate()], exact=True, hidden_layers=(L,))
    feats = head.feature({L: out.hidden[L][0, : T - 1]})[None]  # (1, T-1, H) the target's normed rows
    with torch.no_grad():
        got, fed, _, _ = head.step(0, feats, torch.tensor([TOKENS[1:T]]), torch.arange(T - 1)[None], None, None,
                                   torch.ones(1, T - 1, T - 1, dtype=torch.bool).tril())
        ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        hidden = ref.model(input_ids=torch.tensor([TOKENS[:T]])).last_hidden_state[0, : T - 1]
    want, want_fed = mtp_reference(folder, hidden, TOKENS[1:T], list(range(T - 1)))
    assert (got[0] - want).abs().max().item() < 1e-5 * want.abs().max().item()
    assert torch.equal(got[0].argmax(-1), want.argmax(-1))
    assert (fed[0] - want_fed).abs().max().item() < 1e-5 * want_fed.abs().max().item()


@pytest.mark.slow  # a few seconds: llama.cpp's converter on the fixture folder
def test_llama_cpp_converter_writes_what_the_fixture_holds(tmp_path, folder):
    tree = llama_cpp_tree()
    if tree is None:
        pytest.skip(f"{NO_TREE} (set LLAMA_CPP_DIR to its source tree, or LLAMA_CPP_BIN to its build/bin)")
    fresh = GGUFReader(convert_to_gguf(folder, tmp_path / "f16.gguf", tree=tree))
    kept = GGUFReader(fixture_of(folder) / "f16.gguf")
    assert [(t.name, t.shape.tolist()) for t in fresh.tensors] == [(t.name, t.shape.tolist()) for t in kept.tensors]
    assert all((a.data == b.data).all() for a, b in zip(fresh.tensors, kept.tensors))


# -- speculation --------------------------------------------------------------------------------------------
MODELS = [(F16, "fp32"), (F16, "int8"), (Q8, "gguf"), (NEXT_F16, "fp32"), (NEXT_Q8, "gguf")]


@pytest.fixture(scope="module", params=MODELS, ids=[f"{p.parent.name[:-5]}-{p.stem}-{f}" for p, f in MODELS])
def target(request):
    path, fmt = request.param
    if fmt == "gguf" and kernels.gguf() is None:
        pytest.skip("no GGUF kernel here (no cc or no AVX2)")
    return load(path, fmt)


def test_draft_mtp_lights_up_by_itself(target):
    assert target.config.mtp_layers_declared == 1
    spec, _ = spec_for_model(target)
    assert "draft-mtp" in [d.kind for d in spec.drafters]
    report = inspect_model(str(target.info.path))
    assert report["runnable"] and report["mtp"]["weights_present"] and "draft-mtp" in report["auto"]["types"]
    assert "lights up draft-mtp" in report["family_note"] and "tiny reference checkpoints only" in report["family_note"]


def test_a_verify_is_bitwise_its_single_steps(target):
    """k rows verified together (routed, experts and shared expert included) are k one-token steps, bit for bit."""
    tr = target.transformer
    caches = []
    for _ in range(2):
        cache = tr.new_cache(64)
        slot = cache.allocate()
        tr.forward(torch.tensor([PROMPTS[0]]), cache, [slot], exact=False)
        caches.append((cache, slot))
    (one, s1), (many, s2) = caches
    steps = [tr.forward(torch.tensor([[t]]), one, [s1]).logits[0, 0] for t in TOKENS[30:36]]
    verify = tr.forward(torch.tensor([TOKENS[30:36]]), many, [s2]).logits[0]
    assert all(torch.equal(a, b) for a, b in zip(steps, verify))


def test_greedy_speculation_is_plain_decoding_through_every_rollback(target):
    n = 20
    for prompt in PROMPTS:
        answer = assert_oracle_keeps_plain(target, prompt, n)
        r = Engine(target, SpecConfig(drafters=("draft-mtp",)), max_len=128).generate(prompt, SamplingParams(),
                                                                                         max_tokens=n)
        assert r.token_ids == answer and r.stats.drafted > 0


def test_batched_requests_give_their_solo_answers(target):
    """Three requests in one forward a step (the third joining late, prefilling beside the others' verify), with
    an oracle's drafts and then with draft-mtp's."""
    n = [18, 12, 14]
    assert_batched_oracles_keep_plain(target, PROMPTS, n)
    answers = [plain(target, p, k) for p, k in zip(PROMPTS, n)]
    engine = Engine(target, SpecConfig(drafters=("draft-mtp",)), max_len=128, max_sequences=3)
    reqs = [engine.admit(p, SamplingParams(), k) for p, k in zip(PROMPTS, n)]
    while not all(r.finished for r in reqs):
        engine.step_batch([r for r in reqs if not r.finished])
    assert [r.output for r in reqs] == answers and all(r.stats.drafted > 0 for r in reqs)


SAMPLING = dict(temperature=1.0, top_k=2)


def test_sampled_output_follows_the_target_law(monkeypatch):
    """Exact law (every random draw enumerated, helpers/tree_law.py) of 4 sampled tokens drafted by the model's own
    MTP layer (its mixture included), its head biased towards the tokens the target can emit so that drafts are
    accepted at some steps and rejected at others."""
    model = load(F16)
    prompt = PROMPTS[0]
    likely = {t for seq in engine_law(model, prompt, SamplingParams(**SAMPLING), depth=3) for t in seq[1:]}
    head, _ = load_mtp_head(model, 64)
    head.lm_head = Biased(head.lm_head, likely_bias(model, likely))
    law, gap = mtp_law(monkeypatch, model, head, prompt, **SAMPLING)
    assert 0 < law.accepted < 2
    assert gap < 1e-6
