"""ngram-mod on hand-made token sequences: chains of lookups, n_min, indexing in chunks, the streak of poor
drafts, the occupancy reset, memory across requests. The expected drafts of the first five tests are the
ones llama.cpp's common_speculative_impl_ngram_mod makes on the same calls (the replays in
test_ngram_reference.py hold longer texts); its table size is fixed there, so the tests of a small table
are specdec's alone."""

from __future__ import annotations

import pytest

from specdec.drafters.ngram_mod import NgramMod


def test_a_draft_is_a_chain_of_lookups_through_its_own_tokens():
    d = NgramMod(n_match=2, n_min=1)
    d.begin([5, 6, 7, 8, 5, 6])  # (5, 6) -> 7, (6, 7) -> 8, (7, 8) -> 5, (8, 5) -> 6
    assert d.propose([5, 6, 7, 8, 5, 6, 7], 5).tokens == (8, 5, 6, 7, 8)


@pytest.mark.parametrize("n_min, expected", [(4, (7, 8, 9, 5)), (5, ()), (48, ())])
def test_a_chain_shorter_than_n_min_is_no_draft(n_min, expected):
    d = NgramMod(n_match=2, n_min=n_min)
    d.begin([5, 6, 7, 8, 9, 5])  # the chain from (5, 6) is 7, 8, 9, 5, then (9, 5) was never followed
    assert d.propose([5, 6, 7, 8, 9, 5, 6], 5).tokens == expected


def test_the_output_is_indexed_once_33_tokens_wait():
    out = list(range(100, 140))
    text = list(range(10)) + out[:20] + out[:3] + out[3:]  # the output repeats its own first tokens at 30
    d = NgramMod(n_match=3, n_min=1)
    d.begin(text[:10])
    assert d.propose(text[:33], 2).tokens == ()  # 30..32 repeat 10..12, but 10.. is not indexed yet
    assert d.propose(text[:41], 2).tokens == (111, 112)  # 40 > 7 + 32: positions 7..36 are indexed now


@pytest.mark.parametrize("kept, drafts_at_the_end", [((0, 0, 0, 0, 0), ()), ((0, 0, 1, 0, 0), (3,))])
def test_five_poor_drafts_in_a_row_empty_the_table(kept, drafts_at_the_end):
    text = [1, 2, 3, 4, 1, 2, 5, 1, 2, 6, 1, 2, 7, 1, 2, 8, 1, 2, 9, 1, 2, 10]
    d = NgramMod(n_match=2, n_min=1)
    d.begin(text[:3])  # (1, 2) -> 3, and the target never writes 3 after (1, 2) again
    for end, n in zip((5, 8, 11, 14, 17), kept):
        assert d.propose(text[: end + 1], 1).tokens == (3,)
        d.on_accept(n)
    # under 33 tokens: the emptied table is not filled again from the context yet
    assert d.propose(text[:21], 1).tokens == drafts_at_the_end


def test_the_table_outlives_the_request():
    d = NgramMod(n_match=2, n_min=1)
    d.begin([1, 2, 3, 4, 5, 6, 7])
    assert d.propose([1, 2, 3, 4, 5, 6, 7, 8], 3).tokens == ()
    d.begin([9, 9, 3, 4])
    assert d.propose([9, 9, 3, 4, 5], 3).tokens == (6, 7)  # what the first request's prompt held


def test_after_the_streak_the_whole_context_is_indexed_again():
    text = list(range(40)) + [1, 2]
    d = NgramMod(n_match=2, n_min=1)
    d.begin(text[:41])
    for _ in range(5):
        assert d.propose(text, 1).tokens == (3,)
        d.on_accept(0)
    assert d.propose(text, 1).tokens == (3,)  # emptied, then the 41-token history was indexed at this call


def test_begin_empties_a_table_over_a_quarter_full():
    d = NgramMod(n_match=1, n_min=1, table_size=8)
    d.begin([5, 6, 5])  # slots for 5 and 6: 2 of 8, not over a quarter
    assert d.propose([5, 6, 5, 6], 1).tokens == (5,)
    d.begin([1, 2, 3])  # 1, 2 and 5, 6: half the table
    assert d.propose([1, 2, 3, 1], 1).tokens == ()
    assert d.propose([1, 2, 3, 5], 1).tokens == ()


def test_a_slot_answers_for_every_ngram_hashed_there():
    d = NgramMod(n_match=2, n_min=1, table_size=64)  # 64 divides 2**64: (1, 66) hashes as (1, 2) does
    d.begin([1, 2, 3])
    assert d.propose([1, 2, 3, 1, 66], 2).tokens == (3,)


@pytest.mark.parametrize("options, message", [
    ({"n_match": 0}, "n_match must be from 1 to 1024"), ({"n_match": 1025}, "n_match must be from 1 to 1024"),
    ({"n_min": -1}, "n_min must be from 0 to 1024"), ({"table_size": 0}, "table_size must be from 1 to"),
    ({"table_size": 1 << 27}, "table_size must be from 1 to 67108864 slots"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        NgramMod(**options)


def test_defaults_are_llama_cpps():
    d = NgramMod()
    assert (d.n_match, d.n_min, d.table_size, d.name) == (24, 48, 4 * 1024 * 1024, "ngram-mod")
