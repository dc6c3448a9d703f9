"""ngram-map-k and ngram-map-k4v on hand-made token sequences: which occurrence drafts, how accept counts cut
drafts, the value counts and the dominance rule. Every expected draft here is the one llama.cpp's
common_ngram_map makes on the same calls (checked through scripts/llama_ngram_replay.cpp's API use; the
replays in test_ngram_reference.py hold the rest)."""

from __future__ import annotations

import pytest

from specdec.drafters.ngram_map import NgramMapK, NgramMapK4V


def drafts(drafter, draft_length: int, text: list[int], prompt_len: int, calls) -> list[tuple[int, ...]]:
    """begin(text[:prompt_len]), then for each call: an int c drafts after text[:c + 1] (text[c] was just
    sampled); ("accept", n) reports n kept."""
    drafter.begin(text[:prompt_len])
    out = []
    for call in calls:
        if isinstance(call, tuple):
            drafter.on_accept(call[1])
        else:
            out.append(drafter.propose(text[: call + 1], draft_length).tokens)
    return out


# --- ngram-map-k ---


def test_map_k_drafts_from_the_stored_occurrence_not_the_newest():
    # key (1, 2) follows 0 at 1 (then 3 4) in the prompt and at 11 (then 5 6) in the output
    text = [0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 1, 2, 5, 6, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0]
    assert drafts(NgramMapK(key_size=2), 2, text, 11, [12, 22]) == [(3, 4), (3, 4)]


def test_map_k_drafts_as_many_as_the_keys_last_draft_kept():
    text = [9] + [1, 2, 3, 4, 5, 6, 7, 8] * 3 + [1, 2, 3, 4]
    d, k = NgramMapK(key_size=2), 3
    # key (1, 2): 3 tokens, then 1 after 1 was kept, then none after none was; key (2, 3) is its own
    assert drafts(d, k, text, 9, [10, ("accept", 1), 18, ("accept", 0), 26, 27]) == [(3, 4, 5), (3,), (), (4, 5, 6)]


def test_map_k_needs_an_occurrence_past_position_0_that_m_plus_1_tokens_follow():
    d, k = NgramMapK(key_size=2), 2
    assert drafts(d, k, [1, 2, 3, 4, 5, 6, 7, 1, 2], 8, [8]) == [()]  # only at position 0
    assert drafts(d, k, [9, 1, 2, 3, 4, 5, 6, 1, 2], 8, [8]) == [(3, 4)]
    assert drafts(d, k, [9, 9, 9, 9, 9, 9, 1, 2, 3, 1, 2], 10, [10]) == [()]  # 3, 1 follow it: not 3 tokens
    d, k = NgramMapK(key_size=4), 1  # a history under 2n + m = 9 tokens: no draft, though the key occurred
    assert drafts(d, k, [9, 1, 2, 3, 4, 1, 2, 3, 4], 8, [8]) == [()]
    assert drafts(d, k, [9, 9, 1, 2, 3, 4, 1, 2, 3, 4], 9, [9]) == [(1,)]


def test_map_k_min_hits_counts_the_calls_that_found_the_key():
    text = [9] + [1, 2, 3, 4, 5, 6, 7, 8] * 3 + [1, 2, 3, 4]
    assert drafts(NgramMapK(key_size=2, min_hits=2), 3, text, 9, [10, 18]) == [(), (3, 4, 5)]


# --- ngram-map-k4v ---

# key 1 is followed by 20 21 three times, then (the newest, where the draft is taken) by 30 31
SKEWED = [9, 1, 20, 21, 8, 1, 20, 21, 7, 1, 20, 21, 6, 1, 30, 31, 5, 40, 41, 42, 43, 44, 45, 1]
# key 1 followed by 20 21 and 30 31 once each in the prompt, then three times at 15, 17, 19
EVEN = [9, 1, 20, 21, 8, 1, 30, 31, 5, 40, 41, 42, 43, 44, 45, 1, 46, 1, 47, 1]


def test_k4v_gates_on_the_counts_but_drafts_what_followed_the_match():
    # (20, 21) counts 3 against 1: it dominates, yet the draft is what followed the match (llama.cpp's
    # common_ngram_map_draft copies from match_pos, not from the winning value)
    assert drafts(NgramMapK4V(key_size=1), 2, SKEWED, 23, [23]) == [(30, 31)]


def test_k4v_counts_the_match_again_at_every_call():
    # 1:1 is no winner; each later call counts the match's value once more: 2:1 dominates
    assert drafts(NgramMapK4V(key_size=1), 2, EVEN, 15, [15, 17, 19]) == [(), (30, 31), (30, 31)]


def test_k4v_min_hits_comes_before_any_count():
    assert drafts(NgramMapK4V(key_size=1, min_hits=2), 2, EVEN, 15, [15, 17, 19]) == [(), (), (30, 31)]


def test_k4v_accept_counts_belong_to_the_value():
    assert drafts(NgramMapK4V(key_size=1), 2, EVEN, 15, [15, 17, ("accept", 1), 19]) == [(), (30, 31), (30,)]


def test_k4v_a_fifth_value_is_not_counted():
    tail = [1, 70, 6] * 7 + [10, 11, 12, 13, 1]
    # 20, 30, 50, 60 hold the four slots: 70's seven occurrences count for nothing, and 1:1:1:1 has no winner
    assert drafts(NgramMapK4V(key_size=1), 1, [9, 1, 20, 2, 1, 30, 3, 1, 50, 4, 1, 60, 5] + tail, 38,
                  [38]) == [()]
    # 70 among the first four: 8 against 3
    assert drafts(NgramMapK4V(key_size=1), 1, [9, 1, 70, 2, 1, 30, 3, 1, 50, 4, 1, 60, 5] + tail, 38,
                  [38]) == [(70,)]


# --- options ---


@pytest.mark.parametrize("cls", [NgramMapK, NgramMapK4V])
def test_defaults_are_llama_cpps_and_bad_options_are_refused(cls):
    assert (cls().key_size, cls().min_hits) == (12, 1)
    with pytest.raises(ValueError, match="key_size must be at least 1"):
        cls(key_size=0)
    with pytest.raises(ValueError, match="min_hits must be at least 1"):
        cls(min_hits=0)
    with pytest.raises(ValueError, match="key_size must be at most 64 tokens"):
        cls(key_size=65)
