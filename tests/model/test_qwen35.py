"""Qwen3.5 / Qwen3.6 dense hybrids (Gated DeltaNet + gated attention) against the reference, and the exactness
speculation rests on with a recurrent state.

Checkpoints the reference wrote: folders written by transformers' own Qwen3_5 classes (the text model and the
published multimodal layout), and llama.cpp's conversions of one of them (tests/model/data/qwen35-tiny, by its
own convert_hf_to_gguf.py: its tensor names, its reordered value heads, its ssm_a). fp32 logits agree with
transformers' within 1e-5 of the largest; greedy tokens are transformers' own.
"""

from __future__ import annotations

import pytest
import torch
from gguf import GGUFReader

from helpers.qwen35 import FIXTURE, NO_TREE, convert_to_gguf, llama_cpp_tree, transformers_folder
from helpers.reference import assert_close, specdec_logits, transformers_logits
from specdec.cache.recurrent import RecurrentRollbackError
from specdec.engine.engine import Engine
from specdec.model import kernels
from specdec.model.errors import ModelFileError
from specdec.model.load import load_model
from specdec.model.segments import Segment
from specdec.sampling import SamplingParams

TOKENS = [(7 * i + 3) % 260 for i in range(40)]
PROMPT = TOKENS[:10]
HF, F32, Q8 = FIXTURE / "hf", FIXTURE / "f32.gguf", FIXTURE / "q8_0.gguf"


def reference_logits(folder, tokens=TOKENS) -> torch.Tensor:
    return transformers_logits(folder, tokens)


def logits(model, tokens=TOKENS, exact=True) -> torch.Tensor:
    return specdec_logits(model, tokens, exact)



pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def load(path, fmt="fp32"):
    return load_model(str(path), fmt, progress=False, weight_cache=False)


# -- against transformers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout,tie", [("text", False), ("published", True)], ids=["text-own-head", "published-tied"])
def test_folders_transformers_wrote_give_its_logits_and_greedy_tokens(tmp_path, layout, tie):
    from transformers import AutoModelForCausalLM

    folder = transformers_folder(tmp_path / layout, layout, seed=3, tie=tie)
    model = load(folder)
    la = model.config.linear_attention
    assert (model.config.arch, la.layers, la.tiled, model.config.rope_dims, model.config.tie_embeddings) == \
        ("qwen35", (0, 1, 2), False, 4, tie)
    theirs = reference_logits(folder)
    for exact in (True, False):
        assert_close(logits(model, exact=exact), theirs)
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ours = Engine(model, max_len=256).generate(PROMPT, SamplingParams(), max_tokens=16).token_ids
    theirs = ref.generate(torch.tensor([PROMPT]), max_new_tokens=16, do_sample=False, eos_token_id=2,
                          pad_token_id=2)[0, len(PROMPT):].tolist()
    assert ours == (theirs[:-1] if theirs[-1] == 2 else theirs) and len(ours) > 8


def test_llama_cpp_files_give_transformers_logits():
    """f32: llama.cpp's names, tiled value heads and ssm_a read right (1e-5); Q8_0 in its own blocks: the
    quantization's error only (the argmax of most rows kept)."""
    theirs = reference_logits(HF)
    assert_close(logits(load(F32)), theirs)
    assert load(F32).config.linear_attention.tiled
    for fmt in ("fp32",) + (("gguf",) if kernels.gguf() is not None else ()):
        ours = logits(load(Q8, fmt))
        assert (ours.argmax(-1) == theirs.argmax(-1)).float().mean() >= 0.9
        assert (ours - theirs).abs().max() < 0.3 * theirs.abs().max()


def test_the_value_head_order_is_what_made_the_gguf_agree():
    """The same file read as if its value heads were in transformers' order: far from transformers."""
    from dataclasses import replace

    model = load(F32)
    la = model.config.linear_attention
    object.__setattr__(model.transformer, "config", replace(model.config, linear_attention=replace(la, tiled=False)))
    assert (logits(model) - reference_logits(HF)).abs().max() > 1e-2


@pytest.mark.slow  # ~20 s: llama.cpp's converter on the fixture folder
def test_llama_cpp_converter_writes_what_the_fixture_holds(tmp_path):
    """The fixture's GGUF is what this llama.cpp's converter writes today (names, shapes, metadata)."""
    tree = llama_cpp_tree()
    if tree is None:
        pytest.skip(f"{NO_TREE} (set LLAMA_CPP_DIR to its source tree, or LLAMA_CPP_BIN to its build/bin)")
    fresh = GGUFReader(convert_to_gguf(HF, tmp_path / "f32.gguf", tree=tree))
    kept = GGUFReader(F32)
    assert [(t.name, t.shape.tolist()) for t in fresh.tensors] == [(t.name, t.shape.tolist()) for t in kept.tensors]
    assert all((a.data == b.data).all() for a, b in zip(fresh.tensors, kept.tensors))
    skip = ("general.", "tokenizer.ggml.")
    assert {k for k in fresh.fields if not k.startswith(skip)} == {k for k in kept.fields if not k.startswith(skip)}


# -- exactness ----------------------------------------------------------------------------------------------
FORMATS = [(HF, "fp32"), (HF, "int8"), (Q8, "gguf")]


@pytest.mark.parametrize("path,fmt", FORMATS, ids=[f for _, f in FORMATS])
def test_a_verify_is_bitwise_its_single_steps_state_included(path, fmt):
    if fmt == "gguf" and kernels.gguf() is None:
        pytest.skip("no GGUF kernel here (no cc or no AVX2)")
    tr = load(path, fmt).transformer
    caches = []
    for _ in range(2):
        cache = tr.new_cache(64)
        slot = cache.allocate()
        tr.forward(torch.tensor([PROMPT]), cache, [slot], exact=False)
        caches.append((cache, slot))
    (one, s1), (many, s2) = caches
    steps = [tr.forward(torch.tensor([[t]]), one, [s1]).logits[0, 0] for t in TOKENS[10:16]]
    verify = tr.forward(torch.tensor([TOKENS[10:16]]), many, [s2]).logits[0]
    assert all(torch.equal(a, b) for a, b in zip(steps, verify))
    for length in range(10, 17):  # the state after every length, conv window and recurrent state
        for ring in ("conv", "ssm"):
            a, b = getattr(one, ring), getattr(many, ring)
            assert torch.equal(a[:, s1, one.place(length)], b[:, s2, many.place(length)]), (ring, length)
    assert torch.equal(one.k[:, s1, :, :16], many.k[:, s2, :, :16])


def test_rolling_back_is_a_pointer_move_and_gives_the_states_of_the_kept_path():
    tr = load(HF).transformer
    cache = tr.new_cache(64)
    slot = cache.allocate()
    tr.forward(torch.tensor([PROMPT]), cache, [slot], exact=False)
    tr.forward(torch.tensor([[99, 98, 97, 96, 95]]), cache, [slot])  # a draft, all of it rejected but one
    before = cache.ssm.clone()
    cache.keep(slot, 10, [0, 1])
    assert cache.lengths[slot] == 12 and torch.equal(cache.ssm, before)  # no state moved
    after_rollback = tr.forward(torch.tensor([[TOKENS[12]]]), cache, [slot]).logits[0, 0]
    fresh = tr.new_cache(64)
    s = fresh.allocate()
    tr.forward(torch.tensor([PROMPT]), fresh, [s], exact=False)
    tr.forward(torch.tensor([[99]]), fresh, [s])
    tr.forward(torch.tensor([[98]]), fresh, [s])
    assert torch.equal(after_rollback, tr.forward(torch.tensor([[TOKENS[12]]]), fresh, [s]).logits[0, 0])


def test_the_ring_keeps_every_length_a_forward_passed_and_says_when_one_is_gone():
    tr = load(HF).transformer
    cache = tr.new_cache(128)
    slot = cache.allocate()
    d = cache.history
    tr.forward(torch.tensor([TOKENS[:30]]), cache, [slot], exact=False)  # a prefill wider than the ring
    assert cache.anchor[slot] == 0 and cache.oldest[slot] == 30 - d + 1
    assert cache.restorable(slot, 30 - d + 1) and not cache.restorable(slot, 30 - d) and cache.restorable(slot, 0)
    with pytest.raises(RecurrentRollbackError, match="holds the recurrent state of lengths"):
        cache.truncate(slot, 10)
    tr.forward(torch.tensor([TOKENS[30:30 + d + 2]]), cache, [slot])  # a verify wider than the ring widens it
    assert cache.history == d + 3 and all(cache.restorable(slot, n) for n in range(30, 30 + d + 3))
    cache.truncate(slot, 31)
    again = tr.forward(torch.tensor([[TOKENS[31]]]), cache, [slot]).logits[0, 0]
    fresh = tr.new_cache(128)
    s = fresh.allocate()
    tr.forward(torch.tensor([TOKENS[:30]]), fresh, [s], exact=False)
    tr.forward(torch.tensor([TOKENS[30:31]]), fresh, [s])
    assert torch.equal(again, tr.forward(torch.tensor([[TOKENS[31]]]), fresh, [s]).logits[0, 0])
    cache.truncate(slot, 0)  # the zero state: a fresh start
    first = tr.forward(torch.tensor([TOKENS[:3]]), cache, [slot], exact=False).logits
    other = tr.new_cache(128)
    assert torch.equal(first, tr.forward(torch.tensor([TOKENS[:3]]), other, [other.allocate()], exact=False).logits)


def test_batched_rows_are_bitwise_each_sequence_alone():
    tr = load(HF).transformer
    prompts = [TOKENS[:10], TOKENS[5:12], TOKENS[20:33]]
    alone = []
    for p in prompts:
        cache = tr.new_cache(64)
        slot = cache.allocate()
        tr.forward(torch.tensor([p]), cache, [slot], exact=False)
        alone.append(tr.forward(torch.tensor([[1, 2, 3]]), cache, [slot]).logits[0])
    cache = tr.new_cache(64, num_slots=3)
    slots = [cache.allocate() for _ in prompts]
    tr.forward_batch([Segment(torch.tensor(p), s, exact=False) for p, s in zip(prompts, slots)], cache)
    together = tr.forward_batch([Segment(torch.tensor([1, 2, 3]), s) for s in slots], cache)
    assert all(torch.equal(a, b.logits[0]) for a, b in zip(alone, together))


def test_trees_and_other_devices_are_refused_with_the_reason(monkeypatch):
    import specdec.model.load as load_module

    model = load(HF)
    cache = model.transformer.new_cache(64)
    slot = cache.allocate()
    tree = torch.ones(3, 3, dtype=torch.bool).tril()
    with pytest.raises(ValueError, match="Gated DeltaNet.*chains of drafts, not trees"):
        model.transformer.forward_batch([Segment(torch.tensor([1, 2, 3]), slot, tree_mask=tree)], cache)
    monkeypatch.setattr(load_module, "pick_device", lambda device: device)  # as on a machine with a GPU
    with pytest.raises(ValueError, match="hybrid model .*CPU only; use --device cpu"):
        load_model(str(HF), "fp32", progress=False, device="cuda")
    from specdec.engine.config import SpecConfig

    with pytest.raises(ValueError, match="one recurrent state per sequence, so specdec verifies chains only"):
        Engine(model, SpecConfig(drafters=("draft-mtp",), tree_topk=2), max_len=64).generate(PROMPT, max_tokens=2)


def test_config_values_specdec_does_not_compute_are_refused(tmp_path):
    import json
    import shutil

    folder = tmp_path / "m"
    shutil.copytree(HF, folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"]["rope_type"] = "yarn"
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match="rope type 'yarn' is not supported"):
        load(folder)
    cfg["rope_parameters"]["rope_type"] = "default"
    cfg["linear_num_value_heads"] = 3
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelFileError, match="3 value heads for 2 key heads"):
        load(folder)
