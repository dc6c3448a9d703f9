"""Gemma 4 text (dense) from llama.cpp's GGUF conversion of tests/model/data/gemma4-tiny/hf (f32.gguf, q8_0.gguf;
make_gguf.py runs llama.cpp's own convert_hf_to_gguf.py): its names, per-layer metadata arrays, rope_freqs and the
missing attn_v read into the runtime the folder builds (model/gemma4_gguf.py). f32 logits within 1e-5 of
transformers' on the folder (measured ~1.1e-6 of the largest); Q8_0 in fp32 within 1e-5 of transformers' run on the
file's own dequantized values; Q8_0 in its own blocks (8-bit activations, f16 cache) near them; greedy
speculation bitwise plain decoding; the gemma4 tokenizer the tokenizer.json it was converted from."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from gguf import GGUFReader

from helpers.gemma4 import FIXTURE, echo_assistant_folder
from helpers.gemma4_gguf import F32, Q8, gemma_tokenizer
from helpers.llama_converter import NO_TREE, convert_to_gguf, llama_cpp_tree
from helpers.oracle import assert_oracle_keeps_plain, plain
from specdec.engine.engine import Engine
from specdec.engine.config import SpecConfig
from specdec.model import kernels
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

HF = FIXTURE / "hf"
PROMPTS = [[(7 * i + 3) % 260 for i in range(24)], [5, 9, 33, 70, 12, 8, 100, 3], [200, 11]]

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def load(path, fmt="fp32"):
    return load_model(str(path), fmt, progress=False, weight_cache=False)


def logits(model, tokens, exact=True) -> torch.Tensor:
    tr = model.transformer
    cache = tr.new_cache(128)
    return tr.forward(torch.tensor([tokens]), cache, [cache.allocate()], exact=exact).logits[0]


def transformers_logits(prompts, values=None) -> list[torch.Tensor]:
    """transformers' Gemma4ForCausalLM on hf/, its tensors replaced by `values` (name -> tensor) where given."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(HF, dtype=torch.float32).eval()
    with torch.no_grad():
        state = ref.state_dict()
        for name, value in (values or {}).items():
            state[name].copy_(value.reshape(state[name].shape))
        if values and "lm_head.weight" in state:  # tied: the file's embedding
            state["lm_head.weight"].copy_(values["model.embed_tokens.weight"])
        return [ref(input_ids=torch.tensor([p])).logits[0] for p in prompts]


def assert_close(ours, theirs, rel=1e-5):
    err, scale = (ours - theirs).abs().max().item(), max(1.0, theirs.abs().max().item())
    assert err <= rel * scale, f"max |specdec - transformers| = {err:.2e}, largest logit {scale:.2f}"
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


def test_the_metadata_gives_the_folders_layout():
    """Per-layer kv heads and MLP widths, the sliding pattern, shared KV, per-layer inputs, the rotated pairs
    (rope_freqs.weight) and values = keys (no attn_v) read as config.json says them."""
    theirs, ours = load(HF).config, load(F32).config
    assert ours.gemma4 == theirs.gemma4
    fields = ("sliding_layers", "sliding_window", "head_dim", "num_kv_heads", "num_heads", "intermediate_size",
              "rope_theta", "rope_local_theta", "final_logit_softcap", "tie_embeddings", "vocab_size",
              "embed_scale", "attention_scale")
    assert [getattr(ours, f) for f in fields] == [getattr(theirs, f) for f in fields]


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "prefill"])
def test_f32_file_gives_transformers_logits(exact):
    model, theirs = load(F32), transformers_logits(PROMPTS)
    for prompt, ref in zip(PROMPTS, theirs):
        assert_close(logits(model, prompt, exact), ref)


def test_q8_0_file_gives_transformers_logits_on_its_values():
    """fp32: the Q8_0 file's values exactly as transformers runs them. In its own blocks (the GGUF kernel's 8-bit
    activations and the f16 cache): the rounding's error only (measured 0.36 on logits up to 13.5)."""
    checkpoint = load(Q8).checkpoint
    theirs = transformers_logits(PROMPTS, {n: checkpoint.get(n) for n in checkpoint.names()})
    for prompt, ref in zip(PROMPTS, theirs):
        assert_close(logits(load(Q8), prompt), ref)
    if kernels.gguf() is None:
        return
    model = load(Q8, "gguf")
    assert model.info.weights_dtype == "gguf" and model.info.quant == "Q8_0"
    for prompt, ref in zip(PROMPTS, theirs):
        ours = logits(model, prompt)
        assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.75
        assert (ours - ref).abs().max() < 0.1 * ref.abs().max()


MODELS = [(F32, "fp32"), (Q8, "gguf")]


@pytest.mark.parametrize("path,fmt", MODELS, ids=[f"{p.stem}-{f}" for p, f in MODELS])
def test_greedy_speculation_is_plain_decoding(path, fmt):
    """Drafts accepted and rejected (the oracle's), and the suffix drafter's own: the plain answer every time."""
    if fmt == "gguf" and kernels.gguf() is None:
        pytest.skip("no GGUF kernel here (no cc or no AVX2)")
    target, n = load(path, fmt), 20
    for prompt in PROMPTS:
        answer = assert_oracle_keeps_plain(target, prompt, n)
        suffix = Engine(target, SpecConfig(drafters=("suffix",), draft_n_max=4, draft_n_min=1), max_len=128)
        assert suffix.generate(prompt + prompt, SamplingParams(), max_tokens=n).token_ids == \
            plain(target, prompt + prompt, n)


@pytest.mark.parametrize("path,fmt", MODELS, ids=[f"{p.stem}-{f}" for p, f in MODELS])
def test_the_assistant_folder_drafts_for_the_gguf_target(path, fmt, tmp_path):
    """draft-mtp with the assistant folder (-md) on the GGUF target: the random assistant's drafts rejected, the
    echo assistant's (helpers/gemma4, its head hf/'s embedding) accepted; plain decoding's tokens both times."""
    if fmt == "gguf" and kernels.gguf() is None:
        pytest.skip("no GGUF kernel here (no cc or no AVX2)")
    target, n = load(path, fmt), 20
    accepted = {}
    for name, helper in (("random", FIXTURE / "assistant"), ("echo", echo_assistant_folder(tmp_path / "echo"))):
        engine = Engine(target, SpecConfig(drafters=("draft-mtp",), draft_model=str(helper), draft_n_max=3),
                        max_len=128)
        for prompt in PROMPTS[:2]:
            r = engine.generate(prompt, SamplingParams(), max_tokens=n)
            assert r.token_ids == plain(target, prompt, n) and r.stats.drafted > 0
            accepted[name] = accepted.get(name, 0) + r.stats.accepted
    assert accepted["echo"] > 0


def test_the_gemma4_tokenizer_is_the_tokenizer_json_it_was_converted_from():
    """Merges over '▁' pieces, byte fallback, newline runs apart; a BOS first, as the file says; text back."""
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        gemma_tokenizer(Path(tmp))
        ref = Tokenizer.from_file(str(Path(tmp) / "tokenizer.json"))
    ours = load(F32).tokenizer
    for text in ["abc abcd ed", " ab\n\nabc d", "héllo ✓ zz", "a b c d e", "\n\n\n"]:
        ids = ours.encode(text)
        assert ids == [2] + ref.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids[1:]) == text
    assert ours.eos_ids == [1] and ours.encode("ab cd") == [2, 266, 260, 270]


@pytest.mark.slow  # ~10 s: llama.cpp's converter on the fixture folder
def test_llama_cpp_converter_writes_what_the_fixture_holds(tmp_path):
    tree = llama_cpp_tree()
    if tree is None:
        pytest.skip(f"{NO_TREE} (set LLAMA_CPP_DIR to its source tree, or LLAMA_CPP_BIN to its build/bin)")
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(HF, folder)
    gemma_tokenizer(folder)
    fresh, kept = GGUFReader(convert_to_gguf(folder, tmp_path / "f32.gguf", "f32", tree)), GGUFReader(F32)
    assert [(t.name, t.shape.tolist()) for t in fresh.tensors] == [(t.name, t.shape.tolist()) for t in kept.tensors]
    assert all((a.data == b.data).all() for a, b in zip(fresh.tensors, kept.tensors))
    skip = ("general.",)
    assert {k for k in fresh.fields if not k.startswith(skip)} == {k for k in kept.fields if not k.startswith(skip)}
