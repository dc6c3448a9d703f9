"""Promise 1, for every row of the matrix: greedy speculative output is plain greedy output, token for
token, on the real smollm2-135m in the default weight format (its GGUF file's blocks).

Each row drafts on two prompts with text that repeats and must have drafted; drafts are rejected in every
row, and accepted in every row whose drafter is not random (tests/lossless/conftest.py says which)."""

from __future__ import annotations

import pytest

from helpers.matrix import RANDOM_ON_REAL, ROWS

pytestmark = pytest.mark.slow

GREEDY_PROMPTS = ("edit", "assign")


@pytest.mark.parametrize("row", list(ROWS))
def test_greedy_output_is_plain_greedy_output(row, gguf_smollm, plain_answers, real_variants):
    drafted = accepted = 0
    for variant in real_variants(row):
        engine = variant.engine(gguf_smollm)
        for name in GREEDY_PROMPTS:
            ids, plain = plain_answers[name]
            out = engine.generate(ids, variant.sampling(gguf_smollm, plain), max_tokens=len(plain), spec=variant.spec)
            assert out.token_ids == plain, f"{row} ({variant.what}) changed the answer to the {name} prompt"
            drafted += out.stats.drafted
            if variant.grammar is not None:  # the grammar drafter drafted the forced half, and it was kept
                assert out.stats.by_drafter["grammar"].accepted > 0, f"{row}: no forced draft was accepted"
            accepted += out.stats.accepted
    assert drafted > 0, f"{row} never drafted: this test would prove nothing"
    assert accepted < drafted, f"{row}: no draft was rejected, so rejection was not verified"
    if row not in RANDOM_ON_REAL:
        assert accepted > 0, f"{row}: no draft was accepted"
