"""SamplingParams and process_logits: each filter against distributions worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.sampling import SamplingParams, process_logits, sample_token

P = [0.5, 0.3, 0.15, 0.05]  # a distribution whose filters are easy to apply by hand


def logits_of(probs, temperature: float = 1.0) -> torch.Tensor:
    """Logits that temperature `temperature` turns back into `probs`."""
    return torch.tensor([math.log(p) * temperature for p in probs])


def expect(probs: torch.Tensor, wanted) -> None:
    """probs is float32, zero exactly where `wanted` is, and equal to it up to float32 rounding."""
    wanted = torch.tensor(wanted, dtype=torch.float64)
    assert probs.dtype == torch.float32 and probs.shape == wanted.shape
    assert torch.equal(probs == 0, wanted == 0), f"{probs} has another support than {wanted}"
    torch.testing.assert_close(probs.double(), wanted, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
    (dict(temperature=float("inf")), "temperature must be a finite number >= 0, got inf"),
    (dict(seed=2**64), r"seed must be an integer in \[-2\*\*63, 2\*\*64\)"),
    (dict(seed=-(2**63) - 1), r"seed must be an integer in"),
    (dict(top_k=-1), r"top_k must be >= 0 \(0 = off\)"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(min_p=-0.1), r"min_p must be in \[0, 1\]"),
    (dict(min_p=1.1), r"min_p must be in \[0, 1\]"),
    (dict(temperature="1.0"), r"temperature must be a number, got '1.0'"),  # was a bare comparison TypeError
    (dict(temperature=True), r"temperature must be a number, got True"),  # was temperature 1
    (dict(min_p=None), r"min_p must be a number, got None"),
    (dict(top_k=2.5), r"top_k must be a whole number, got 2.5"),  # failed in torch.topk at the first step
    (dict(seed=1.5), r"seed must be a whole number, got 1.5"),  # failed after the engine took a cache slot
    (dict(seed=True), r"seed must be a whole number, got True"),
    (dict(temperature=1.0, top_k=None), r"top_k must be a whole number, got None"),  # a comparison TypeError
    (dict(temperature=10**400), r"temperature must be a finite number >= 0"),  # OverflowError inside torch
])
def test_bad_settings_are_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_a_numpy_integer_seed_seeds_like_the_int():
    import numpy as np

    a = SamplingParams(temperature=1.0, seed=np.int64(3)).generator()
    b = SamplingParams(temperature=1.0, seed=3).generator()
    assert torch.rand(4, generator=a).tolist() == torch.rand(4, generator=b).tolist()


def test_defaults_are_greedy_with_every_filter_off():
    params = SamplingParams()
    assert params.greedy and (params.top_k, params.top_p, params.min_p) == (0, 1.0, 0.0)
    assert not SamplingParams(temperature=0.7).greedy


def test_greedy_is_the_one_hot_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 3.0, 0.0]])  # (2, V); the first of tied maxima wins
    expect(process_logits(logits, SamplingParams()), [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_temperature_divides_the_logits():
    expect(process_logits(logits_of(P, 2.0), SamplingParams(temperature=2.0)), P)
    # T = 0.5 squares the probabilities: 0.25, 0.09, 0.0225, 0.0025 over their sum 0.365
    expect(process_logits(logits_of(P), SamplingParams(temperature=0.5)), [0.25 / 0.365, 0.09 / 0.365,
                                                                           0.0225 / 0.365, 0.0025 / 0.365])


@pytest.mark.parametrize("k, wanted", [
    (1, [1.0, 0.0, 0.0, 0.0]),
    (2, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]),
    (3, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
    (4, P),
    (9, P),  # more than the vocabulary: off
])
def test_top_k(k, wanted):
    expect(process_logits(logits_of(P), SamplingParams(temperature=1.0, top_k=k)), wanted)


@pytest.mark.parametrize("top_p, wanted", [
    # the smallest most-probable set whose mass reaches top_p: mass before each token 0, 0.5, 0.8, 0.95
    (0.4, [1.0, 0.0, 0.0, 0.0]),
    (0.7, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]),
    (0.9, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),
    (0.99, P),
    (1.0, P),
])
def test_top_p(top_p, wanted):
    expect(process_logits(logits_of(P), SamplingParams(temperature=1.0, top_p=top_p)), wanted)


def test_top_p_keeps_tokens_where_they_are():
    """The sort is undone: the vocabulary order of the input is the order of the output."""
    shuffled = [0.15, 0.5, 0.05, 0.3]
    expect(process_logits(logits_of(shuffled), SamplingParams(temperature=1.0, top_p=0.7)),
           [0.0, 0.5 / 0.8, 0.0, 0.3 / 0.8])


@pytest.mark.parametrize("min_p, wanted", [
    # tokens below min_p * 0.5 (the top probability) are dropped
    (0.05, P),  # floor 0.025
    (0.2, [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0]),  # floor 0.1
    (0.5, [0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0]),  # floor 0.25
    (1.0, [1.0, 0.0, 0.0, 0.0]),  # floor 0.5: only the top token
])
def test_min_p(min_p, wanted):
    expect(process_logits(logits_of(P), SamplingParams(temperature=1.0, min_p=min_p)), wanted)


def test_filters_apply_in_order_temperature_top_k_top_p_min_p():
    q = [0.4, 0.3, 0.2, 0.1]
    # top_k 3 leaves 4/9, 3/9, 2/9; top_p 0.75 then keeps 4/9 and 3/9 (mass before 0, 4/9, 7/9): 4/7, 3/7.
    # top_p first would have kept three tokens (mass before 0, 0.4, 0.7).
    expect(process_logits(logits_of(q, 1.5), SamplingParams(temperature=1.5, top_k=3, top_p=0.75)),
           [4 / 7, 3 / 7, 0.0, 0.0])
    # top_p 0.9 leaves 4/9, 3/9, 2/9; min_p 0.6 then drops what is below 0.6 * 4/9 = 0.267: 4/7, 3/7.
    expect(process_logits(logits_of(q), SamplingParams(temperature=1.0, top_p=0.9, min_p=0.6)),
           [4 / 7, 3 / 7, 0.0, 0.0])


def test_extreme_temperature_and_top_p_give_the_argmax_not_nan():
    """temperature 1e-300 overflowed the logits to inf and top_p 1e-300 rounded to 0 in float32, dropping
    every token: both made NaN rows ("cannot sample ... sum to nan")."""
    logits = torch.tensor([[1.0, 3.0, 2.0, 3.0], [0.5, -1.0, 4.0, 0.0]])
    cold = process_logits(logits, SamplingParams(temperature=1e-300))
    assert torch.equal(cold, torch.tensor([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 1.0, 0.0]]))  # ties share, as the limit
    narrow = process_logits(logits, SamplingParams(temperature=1.0, top_p=1e-300))
    assert torch.equal(narrow[1], torch.tensor([0.0, 0.0, 1.0, 0.0])) and narrow[0].sum() == 1.0


def test_a_temperature_past_float32s_range_is_its_limit_not_nan():
    """1e39 is inf in float32, and -inf / inf is NaN: a row with a masked token (EAGLE-3's draft rows always
    have them) became NaN. The limit: uniform over the tokens not masked."""
    probs = process_logits(torch.tensor([1.0, 2.0, float("-inf")]), SamplingParams(temperature=1e39))
    assert torch.equal(probs, torch.tensor([0.5, 0.5, 0.0]))


def test_rows_are_processed_independently():
    logits = torch.stack([logits_of(P), logits_of([0.05, 0.15, 0.3, 0.5])])  # (2, V)
    out = process_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    expect(out, [[0.5 / 0.8, 0.3 / 0.8, 0.0, 0.0], [0.0, 0.0, 0.3 / 0.8, 0.5 / 0.8]])


def test_seeded_generators_repeat_their_draws():
    probs = torch.tensor(P)
    a, b = SamplingParams(temperature=1.0, seed=3).generator(), SamplingParams(temperature=1.0, seed=3).generator()
    draws = [sample_token(probs, a) for _ in range(50)]
    assert draws == [sample_token(probs, b) for _ in range(50)]
    assert set(draws) <= {0, 1, 2, 3} and len(set(draws)) > 1
    other = SamplingParams(temperature=1.0, seed=4).generator()
    assert [sample_token(probs, other) for _ in range(50)] != draws


def test_sample_token_never_draws_a_zero_probability_token():
    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.0, 0.7, 0.0, 0.3])
    assert {sample_token(probs, gen) for _ in range(200)} == {1, 3}


def _blocks_row():
    # 2500 tokens: two whole blocks of 1024 (sample_token's SAMPLE_BLOCK) and a tail of 452; mass on
    # both sides of a block boundary, in the tail, and none in the second block
    w = torch.zeros(2500)
    w[[5, 1023]] = torch.tensor([0.5, 0.25])
    w[[2048, 2499]] = torch.tensor([1.0, 0.25])
    return w


@pytest.mark.parametrize("weights", [torch.tensor([0.2, 0.0, 0.5, 1.3, 0.0]), _blocks_row()],
                         ids=["one-block", "blocks"])
def test_sample_token_draws_each_token_with_its_probability(weights):
    # the weights need not sum to 1: token i is drawn with weights[i] / weights.sum()
    gen = torch.Generator().manual_seed(5)
    n = 20000
    counts = torch.bincount(torch.tensor([sample_token(weights, gen) for _ in range(n)]), minlength=len(weights))
    p = weights / weights.sum()
    sigma = (n * p * (1 - p)).sqrt()
    assert counts[weights == 0].sum() == 0
    assert ((counts - n * p).abs() <= 4.5 * sigma + 1e-9).all(), counts[weights > 0].tolist()


def test_sample_token_at_the_top_of_the_range_draws_the_last_possible_token(monkeypatch):
    from specdec.sampling import params

    # u = total exactly (a uniform draw just under 1 rounded up): never the zero-probability tail
    monkeypatch.setattr(params.torch, "rand", lambda *a, **k: torch.tensor(1.0, dtype=torch.float64))
    assert sample_token(torch.tensor([0.3, 0.7, 0.0, 0.0]), torch.Generator()) == 1
    row = _blocks_row()
    row[2499] = 0.0
    assert sample_token(row, torch.Generator()) == 2048  # the last block with mass, its last token with it


@pytest.mark.parametrize("row", [[0.0, 0.0], [float("nan"), 1.0], [float("inf"), 1.0], [-0.5, 1.0]])
def test_sample_token_refuses_a_row_that_is_not_weights(row):
    with pytest.raises(ValueError, match="cannot sample"):
        sample_token(torch.tensor(row), torch.Generator().manual_seed(0))


def test_sample_tokens_draws_distinct_tokens_in_order_without_replacement():
    from specdec.sampling import sample_tokens

    gen = torch.Generator().manual_seed(7)
    weights = torch.tensor([0.6, 0.0, 0.3, 0.1])
    n = 20000
    pairs = [tuple(sample_tokens(weights, 2, gen)) for _ in range(n)]
    assert all(a != b and 1 not in (a, b) for a, b in pairs)
    # P(first a, then b) = w_a * w_b / (1 - w_a)
    for (a, b), law in {(0, 2): 0.6 * 0.3 / 0.4, (2, 0): 0.3 * 0.6 / 0.7, (3, 0): 0.1 * 0.6 / 0.9}.items():
        got = pairs.count((a, b))
        assert abs(got - n * law) <= 4.5 * (n * law * (1 - law)) ** 0.5, ((a, b), got, n * law)
    assert sorted(sample_tokens(weights, 3, gen)) == [0, 2, 3]
    assert torch.equal(weights, torch.tensor([0.6, 0.0, 0.3, 0.1]))  # the caller's row is left as it was
    with pytest.raises(ValueError, match="cannot sample"):
        sample_tokens(weights, 4, gen)
