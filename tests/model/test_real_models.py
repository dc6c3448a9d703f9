"""Parity with transformers on the real GGUF files (slow: loads both runtimes)."""

from __future__ import annotations

import os

import pytest
import torch

from helpers.models import fast_gguf_reader, real_model
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.slow

MIXED_TEXT = [
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n\tpivot = xs[0]  # 123456789\n",
    "Ünïcödé: naïve café, 日本語のテキスト, emoji 🤖🚀, Ελληνικά, кириллица — “quotes”…",
    "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\n",
    "   leading spaces\n\n\nnewlines\r\n and tabs\t\tx=1e-5; y = 0x1F; 3.14159 $%^&*",
    "I'm sure you've seen it; they'll say we'd done it. HTTPServer.getURL() snake_case_name",
]
NAMES = ["smollm2-135m", "qwen2.5-coder-0.5b"]


def _hf(model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model.info.path
    folder, file = os.path.dirname(path), os.path.basename(path)
    with fast_gguf_reader():
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    hf.eval()
    return tok, hf


@pytest.fixture(scope="module", params=NAMES)
def pair(request):
    model = real_model(request.param, "fp32")
    tok, hf = _hf(model)
    yield model, tok, hf
    del hf


def test_tokenizer_ids_match_transformers(pair):
    model, tok, _ = pair
    for text in MIXED_TEXT:
        assert model.tokenizer.encode(text, add_bos=False) == tok(text, add_special_tokens=False).input_ids, text
        ids = model.tokenizer.encode(text, add_bos=False)
        assert model.tokenizer.decode(ids) == tok.decode(ids)


def test_logits_match_transformers(pair):
    """fp32 logits within 1e-3 of transformers' (measured: ~4e-5 on smollm2, ~2e-5 on qwen 0.5b)."""
    model, tok, hf = pair
    ids = model.tokenizer.encode(MIXED_TEXT[0])
    tr = model.transformer
    ours = tr.forward(torch.tensor([ids]), tr.new_cache(256), [0], exact=False).logits[0]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    assert (ours - ref).abs().max().item() < 1e-3
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_64_greedy_tokens_match_transformers(pair):
    model, tok, hf = pair
    prompt = "Write a Python function that checks whether a number is prime.\n"
    ids = model.tokenizer.encode(prompt)
    engine = Engine(model, max_len=512)
    ours = engine.generate(ids, SamplingParams(), max_tokens=64)
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False, eos_token_id=None,
                          pad_token_id=model.tokenizer.eos_ids[0])
    ref = out[0, len(ids):].tolist()
    n = len(ours.token_ids)
    assert ours.token_ids == ref[:n]
    if ours.finish_reason == "stop":  # an early stop: the reference's next token ends the generation there too
        assert n < 64 and ref[n] in model.tokenizer.eos_ids, (n, ref[n:n + 1])
    else:
        assert (n, ours.finish_reason) == (64, "length")


def test_chat_template_matches_transformers(pair):
    model, tok, _ = pair
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "2+2?"}]
    ours = model.tokenizer.apply_chat_template(messages)
    ref = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == ref
