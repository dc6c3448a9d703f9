"""Suffix decoding: local and global tries, eviction, the probability floor, draft length."""

import random

import pytest

from specdec.drafters.suffix import SuffixDrafter

SEG = list(range(100, 110))  # ten distinct tokens


def draft(drafter, context, max_tokens=8, prompt=None):
    drafter.begin(context if prompt is None else prompt)
    result = drafter.propose(context, max_tokens)
    assert result.tree.is_chain and len(result.tokens) <= max_tokens
    return result.tokens


def test_local_trie_drafts_what_followed():
    assert draft(SuffixDrafter(), [1, 2, 3, 4, 9, 1, 2, 3], max_tokens=3) == (4, 9, 1)


def test_the_unfinished_tail_does_not_dilute_the_probability():
    # (1, 2, 3) occurs twice but was followed once: 4 has probability 1, not 1/2.
    assert draft(SuffixDrafter(min_token_prob=0.9), [1, 2, 3, 4, 9, 1, 2, 3], max_tokens=1) == (4,)


def test_ties_go_to_the_most_recent_continuation():
    assert draft(SuffixDrafter(), [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3], max_tokens=3) == (5, 1, 2)


@pytest.mark.parametrize("factor", [1.0, 2.0])
def test_draft_length_grows_with_the_match_length(factor):
    text = SEG + [99] + SEG
    for match in range(1, 10):
        context = SEG + [99] + SEG[:match]
        expected = min(8, int(factor * match))
        drafted = draft(SuffixDrafter(max_spec_factor=factor), context)
        assert drafted == tuple(text[match : match + expected])


def test_a_match_as_deep_as_the_trie_still_leaves_room_to_draft():
    context = SEG + [99] + SEG[:9]
    # Depth 6: a 3-token match with a 3-token walk beats a 5-token match with a 1-token walk.
    assert draft(SuffixDrafter(max_tree_depth=6), context) == (SEG[9], 99, SEG[0])


def test_the_probability_floor_stops_on_ambiguous_branches():
    def fan_out(k):  # token 1 followed by k different tokens, then 1 again
        return sum(([1, 200 + i] for i in range(k)), []) + [1]

    # (a match of one token, 1: its own floor off, so that min_token_prob decides)
    wide = SuffixDrafter(max_spec_factor=10.0, one_token_match_prob=0.0)
    assert draft(wide, fan_out(11)) == ()  # 1/11 < 0.1
    assert draft(wide, fan_out(10)) == (209, 1)  # 1/10 passes; then certain until the tail
    assert draft(SuffixDrafter(max_spec_factor=10.0, min_token_prob=0.2, one_token_match_prob=0.0), fan_out(10)) == ()


def test_the_floor_applies_to_the_product_along_the_path():
    X, a, b, c, d = 1, 2, 3, 4, 5
    context = [X, a, c, 50, X, a, d, 51, X, b, 52, X]  # X -> a 2/3, then X a -> d 1/2
    def with_floor(p):
        drafter = SuffixDrafter(max_spec_factor=10.0, min_token_prob=p, one_token_match_prob=0.0)
        return draft(drafter, context, max_tokens=3)
    assert with_floor(0.7) == ()
    assert with_floor(0.5) == (a,)  # 2/3 * 1/2 = 1/3 < 0.5
    assert with_floor(0.3) == (a, d, 51)


def test_a_one_token_match_drafts_only_what_always_followed_it():
    # 7 was followed by 8 twice and by 9 once: 8 has 2/3, past min_token_prob but not past the
    # one-token floor; the two-token match (5, 7) was always followed by 9
    context = [7, 8, 1, 7, 8, 2, 5, 7, 9, 3]
    assert draft(SuffixDrafter(), context + [7]) == ()
    assert draft(SuffixDrafter(one_token_match_prob=0.6), context + [7]) == (8,)
    assert draft(SuffixDrafter(), context + [5, 7], max_tokens=2) == (9, 3)
    assert draft(SuffixDrafter(), [4, 6, 1, 4]) == (6,)  # one token, always followed by the same one
    with pytest.raises(ValueError, match="one_token_match_prob"):
        SuffixDrafter(one_token_match_prob=-0.1)


def test_global_trie_drafts_a_response_seen_in_an_earlier_request():
    rng = random.Random(1)
    response = rng.sample(range(1000, 2000), 30)
    d = SuffixDrafter()
    d.begin([5, 6, 7])
    d.end(response)
    context = [8, 9] + response[:4]
    assert draft(d, context) == tuple(response[4:8])  # 4 matched -> 4 drafted
    assert draft(SuffixDrafter(), context) == ()
    assert draft(SuffixDrafter(max_cached_requests=0), context) == ()
    # begin() resets the request's own trie but keeps the global one.
    assert draft(d, [8, 9] + response[:6]) == tuple(response[6:12])


def test_fifo_eviction_forgets_the_oldest_response_and_only_it():
    rng = random.Random(2)
    r1, r2, r3 = (rng.sample(range(1000, 5000), 40) for _ in range(3))
    d = SuffixDrafter(max_cached_requests=2)
    for r in (r1, r2, r3):
        d.end(r)
    assert d.num_cached_requests == 2
    assert draft(d, [7] + r1[:5]) == ()
    assert draft(d, [7] + r2[:5]) == tuple(r2[5:10])
    assert draft(d, [7] + r3[:5]) == tuple(r3[5:10])
    # Counts were subtracted exactly: the trie equals one that only ever saw r2 and r3.
    fresh = SuffixDrafter()
    fresh.end(r2)
    fresh.end(r3)
    assert d.global_size() == fresh.global_size() > 0
    for r in (r2, r3):  # evicting everything empties the trie
        d.end([])
    assert d.global_size() == 0


def test_eviction_decrements_counts_of_shared_paths():
    prefix = [11, 12, 13]
    ra, rb = prefix + [20, 21], prefix + [30, 31]
    d = SuffixDrafter(max_cached_requests=3, max_spec_factor=10.0)
    def next_token():
        return draft(d, [7] + prefix, max_tokens=1)
    for r in (ra, rb, rb):
        d.end(r)
    assert next_token() == (30,)  # a 1, b 2
    d.end(ra)  # evicts ra: b 2, a 1
    assert next_token() == (30,)
    d.end(ra)  # evicts rb: b 1, a 2
    assert next_token() == (20,)


def test_local_and_global_drafts_compete_on_expected_accepted_tokens():
    d = SuffixDrafter()
    for _ in range(3):
        d.end([1, 2, 3, 4, 5, 6])
    # Locally (1, 2, 3) went on with 7 and with 9 (1/2 each); globally with 4, 3 times of 3.
    context = [1, 2, 3, 7, 8, 1, 2, 3, 9, 1, 2, 3]
    assert draft(d, context, max_tokens=3) == (4, 5, 6)
    assert draft(SuffixDrafter(), context, max_tokens=3) == (9, 1, 2)


def test_rejects_impossible_settings():
    for kwargs in ({"max_tree_depth": 1}, {"max_cached_requests": -1}, {"max_spec_factor": 0},
                   {"min_token_prob": 1.5}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            SuffixDrafter(**kwargs)


def test_each_token_is_inserted_once_not_rebuilt(monkeypatch):
    from specdec.drafters import suffix

    inserted = []
    original = suffix._SuffixTrie.extend
    def counted(self, path, token):
        inserted.append(token)
        return original(self, path, token)

    monkeypatch.setattr(suffix._SuffixTrie, "extend", counted)
    context = [1, 2, 3, 4] * 25
    d = SuffixDrafter()
    d.begin(context[:50])
    for end in range(51, 101):
        d.propose(context[:end], 4)
    assert inserted == context
