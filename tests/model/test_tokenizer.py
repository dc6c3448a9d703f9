"""Tokenizer.encode_at_most: the ids of a text that fits, None for one that does not, and a text far
past the limit is never tokenized whole (the server refuses a 20 MB prompt without stalling)."""

from __future__ import annotations

import copy


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
