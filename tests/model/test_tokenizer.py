"""Tokenizer.encode_at_most: the ids of a text that fits, None for one that does not, and a text far
past the limit is never tokenized whole (the server refuses a 20 MB prompt without stalling); the eos ids
a Hugging Face folder names."""

from __future__ import annotations

import copy
import json

import pytest

from helpers.tiny import make_hf_model
from specdec.engine.engine import Engine
from specdec.model.errors import ModelFileError
from specdec.model.load import load_model
from specdec.sampling import SamplingParams


class Recording:
    """The tokenizers backend, noting the length of every text it encodes."""

    def __init__(self, backend):
        self.backend, self.lengths = backend, []

    def encode(self, text, **kwargs):
        self.lengths.append(len(text))
        return self.backend.encode(text, **kwargs)


def test_encode_at_most_gives_the_ids_or_none_at_the_limit(tiny_model):
    tok = tiny_model.tokenizer
    for text in ("def f(x):\n    return x + 1\n", "é" * 40, "word " * 30):
        ids = tok.encode(text)
        assert tok.encode_at_most(text, len(ids)) == ids
        assert tok.encode_at_most(text, len(ids) + 5) == ids
        assert tok.encode_at_most(text, len(ids) - 1) is None


def test_a_text_far_past_the_limit_is_refused_from_its_head(tiny_model):
    tok = copy.copy(tiny_model.tokenizer)
    tok.backend = Recording(tiny_model.tokenizer.backend)
    assert tok.encode_at_most("word " * 200_000, 100) is None
    assert max(tok.backend.lengths) == 16 * 101  # the head only, not the million characters


def test_generation_config_eos_ids_stop_generation(tmp_path):
    """generation_config.json's eos_token_id stops a run as transformers stops (Llama 3 Instruct names
    <|eot_id|> only there): greedy decoding ends at the first such token, finish_reason "stop"."""
    folder = make_hf_model(tmp_path / "m")
    prompt = [5, 17, 33, 101]
    free = Engine(load_model(str(folder), "fp32", progress=False)).generate(prompt, SamplingParams(), max_tokens=12)
    stop_at = next(i for i, t in enumerate(free.token_ids) if t != 2 and i >= 3)  # a token past the start
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, free.token_ids[stop_at]]}))
    model = load_model(str(folder), "fp32", progress=False)
    assert model.tokenizer.eos_ids[-1] == free.token_ids[stop_at] and 2 in model.tokenizer.eos_ids
    out = Engine(model).generate(prompt, SamplingParams(), max_tokens=12)
    first = free.token_ids.index(free.token_ids[stop_at])  # the token may also come earlier
    assert (out.token_ids, out.finish_reason) == (free.token_ids[:first], "stop")  # the stop token is not output

    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": "</s>"}))
    with pytest.raises(ModelFileError, match="generation_config.json.*eos_token_id is '</s>', not a token id"):
        load_model(str(folder), "fp32", progress=False)
