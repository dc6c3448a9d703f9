"""Gemma 4 text (dense) against the reference: tests/model/data/gemma4-tiny/hf, written by transformers' own
Gemma4ForCausalLM (tests/helpers/gemma4.py: sliding and global layers of different head widths and RoPE, values
equal to keys on the global layers, KV-sharing layers with a double-wide MLP, per-layer inputs, layer scalars,
soft-capped logits). fp32 logits agree with transformers' within 1e-5 of the largest (measured ~1e-6); greedy
tokens are transformers' own; exact rows are bitwise one-token steps, alone and in a batch."""

from __future__ import annotations

import pytest
import torch

from helpers.gemma4 import FIXTURE, published_folder
from helpers.reference import assert_close, specdec_logits as logits
from specdec.engine.engine import Engine
from specdec.model.errors import ModelFileError
from specdec.model.gemma4_layout import kv_sources
from specdec.model.load import load_model
from specdec.model.segments import Segment
from specdec.sampling import SamplingParams

HF = FIXTURE / "hf"
PROMPTS = [[(7 * i + 3) % 260 for i in range(24)], [5, 9, 33, 70, 12, 8, 100, 3], [200, 11]]

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def load(path=HF, fmt="fp32"):
    return load_model(str(path), fmt, progress=False, weight_cache=False)


def reference(folder=HF):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def test_config_reads_every_feature_of_the_checkpoint():
    c = load().config
    g = c.gemma4
    assert (c.arch, c.sliding_layers, c.sliding_window, c.head_dim, c.num_kv_heads, c.attention_scale) == \
        ("gemma4", (0, 1, 3, 4), 4, 16, 2, 1.0)
    assert (g.global_head_dim, g.global_kv_heads, g.rotated_pairs, g.kv_source, g.k_eq_v, g.double_wide,
            g.ple_size) == (32, 1, 4, (0, 1, 2, 3, 3, 2), True, True, 8)
    assert c.final_logit_softcap == 30.0 and c.tie_embeddings


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "prefill"])
def test_logits_are_transformers(exact):
    model, ref = load(), reference()
    for prompt in PROMPTS:
        with torch.no_grad():
            theirs = ref(input_ids=torch.tensor([prompt])).logits[0]
        assert_close(logits(model, prompt, exact), theirs)


def test_a_published_multimodal_folder_runs_its_text_model(tmp_path):
    folder, ref = published_folder(tmp_path / "published")
    model = load(folder)
    assert model.config.gemma4 is not None and model.info.arch == "gemma4"
    for prompt in PROMPTS[:2]:
        with torch.no_grad():
            theirs = ref(input_ids=torch.tensor([prompt])).logits[0]
        assert_close(logits(model, prompt), theirs)


def test_greedy_tokens_are_transformers_generate():
    model, ref = load(), reference()
    prompt = PROMPTS[1]
    ours = Engine(model, max_len=128).generate(prompt, SamplingParams(), max_tokens=20).token_ids
    theirs = ref.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=2,
                          pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == (theirs[: theirs.index(2)] if 2 in theirs else theirs) and len(ours) > 8


def test_exact_rows_are_one_token_steps_alone_and_in_a_batch():
    """A k-token exact forward (and one sharing the batch with another sequence's prefill) gives bitwise the
    logits of k one-token steps: what greedy speculation's equality with plain decoding rests on."""
    tr = load().transformer
    prompt, more = PROMPTS[0][:12], PROMPTS[0][12:18]
    cache = tr.new_cache(64, num_slots=2)
    a, b = cache.allocate(), cache.allocate()
    tr.forward(torch.tensor([prompt]), cache, [a], exact=False)
    steps = [tr.forward(torch.tensor([[t]]), cache, [a]).logits[0, -1] for t in more]
    cache.truncate(a, len(prompt))
    at_once = tr.forward(torch.tensor([more]), cache, [a]).logits[0]
    assert torch.equal(torch.stack(steps), at_once)
    cache.truncate(a, len(prompt))
    out = tr.forward_batch([Segment(torch.tensor(more), a), Segment(torch.tensor(PROMPTS[1]), b, exact=False)],
                           cache)
    assert torch.equal(out[0].logits[0], at_once)


def test_kv_sources_follow_transformers():
    from transformers import Gemma4TextConfig

    kinds = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention", "full_attention"] * 2
    for shared in (0, 3, 5):
        modes = Gemma4TextConfig(num_hidden_layers=10, layer_types=kinds, num_kv_shared_layers=shared).kv_sharing_modes
        ours = kv_sources(kinds, shared)
        assert [i for i, s in enumerate(ours) if s != i] == [i for i, m in enumerate(modes) if m == "reuse"]
    assert kv_sources(kinds, 3)[-3:] == (5, 5, 6)


def test_refused_variants_say_why(tmp_path):
    import json
    import shutil

    for key, words in (("enable_moe_block", "mixture-of-experts"), ("use_bidirectional_attention", "causal")):
        folder = tmp_path / key
        shutil.copytree(HF, folder)
        cfg = json.loads((folder / "config.json").read_text())
        cfg[key] = True if key == "enable_moe_block" else "all"
        (folder / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(ModelFileError, match=words):
            load(folder)
    with pytest.raises(ModelFileError, match="drafter"):
        load(FIXTURE / "assistant")


def test_cache_keeps_and_copies_the_rows_of_both_kinds():
    """A verified tree's kept path moves down, and a prefix copies to another slot, in the sliding and the
    global layers' buffers alike (they differ in width: two buffers)."""
    tr = load().transformer
    cache = tr.new_cache(16, num_slots=2)
    a, b = cache.allocate(), cache.allocate()
    for k in (cache.k, cache.v, cache.global_k, cache.global_v):
        k[:, a] = torch.arange(16, dtype=k.dtype)[None, None, :, None].expand_as(k[:, a])
    cache.lengths[a] = 8
    cache.keep(a, 3, [0, 2, 4])  # nodes 0, 2, 4 of a tree at offsets 3.. kept as positions 3, 4, 5
    cache.copy_prefix(a, b, 6)
    for k in (cache.k, cache.v, cache.global_k, cache.global_v):
        for slot in (a, b):
            assert k[0, slot, 0, :6, 0].tolist() == [0, 1, 2, 3, 5, 7]
    assert cache.lengths == [6, 6]


def test_memory_estimate_counts_every_tensor():
    """bench/memory's estimate from config.json alone (what inspect prints) is the built model's bytes: the
    global layers' widths, the KV-sharing layers' missing k/v, per-layer inputs and both RoPE tables counted."""
    from specdec.bench.memory import estimate_weight_bytes, transformer_bytes

    for fmt in ("fp32", "bf16"):
        model = load(fmt=fmt)
        assert estimate_weight_bytes(model.config, fmt) == transformer_bytes(model.transformer)
