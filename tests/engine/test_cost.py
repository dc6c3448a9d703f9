"""Draft length from measured verify costs."""

import pytest

from specdec.engine.cost import best_draft_length, expected_tokens, measure_forward_cost


def test_expected_tokens():
    assert expected_tokens(3, 0.0) == 1.0
    assert expected_tokens(3, 1.0) == 4.0
    assert expected_tokens(1, 0.5) == pytest.approx(1.5)


def test_cheap_verification_favours_long_drafts_and_costly_short_ones():
    flat = [0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    steep = [0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert best_draft_length(0.8, flat, 0.0, 5) == 5
    assert best_draft_length(0.8, steep, 0.0, 5) == 1
    assert best_draft_length(0.3, [0, 1.0, 1.0, 1.6, 2.2, 2.8], 0.0, 4) == 1
    # an expensive drafter shortens the draft
    assert best_draft_length(0.8, flat, 0.5, 5) < 5


def test_measured_cost_grows_and_frees_its_slot(tiny_model):
    cache = tiny_model.transformer.new_cache(256)
    cost = measure_forward_cost(tiny_model.transformer, cache, 4, context=16, repeats=1)
    assert len(cost) == 5 and cost[0] == 0.0 and all(c > 0 for c in cost[1:])
    assert cache.free_slots == [0] and cache.lengths == [0]
