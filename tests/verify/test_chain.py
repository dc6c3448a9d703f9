"""specdec.verify on chains: sampled verification is exactly the target's law, greedy is plain greedy."""

from __future__ import annotations

import pytest
import torch

from helpers.branches import Branches
from specdec.sampling.params import SamplingParams, process_logits
from specdec.verify import VerifyResult, draws, verify_greedy, verify_sampling
from verify_helpers import (MC_STEPS, PARAMS, UNUSED, VOCAB, chain_step, chi_square_p_value, gap_to_target,
                            mc_step, models, rows_with_argmax)


@pytest.mark.parametrize("params_name", PARAMS)
@pytest.mark.parametrize("sampled", [True, False], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_chain_sampling_is_exactly_the_target(monkeypatch, k, sampled, params_name):
    branches = Branches(monkeypatch)
    target, drafter = models(params_name)
    results = branches.distribution(lambda: chain_step(target, drafter, k, sampled, branches.draw))
    assert gap_to_target(results, target, 1) < 1e-9  # first token
    assert gap_to_target(results, target, 2) < 1e-9  # first two tokens
    assert gap_to_target(results, target, k + 1) < 1e-9  # everything one step can emit
    # The draft is used well, not only losslessly: the first draft is kept with
    # probability sum(min(target, draft)) (one-hot: target_probs[x]).
    kept = sum(w for r, w in results.items() if r.num_accepted >= 1)
    q = drafter.probs(()) if sampled else torch.nn.functional.one_hot(drafter.probs(()).argmax(), VOCAB)
    assert kept == pytest.approx(float(torch.minimum(target.probs(()), q).sum()), abs=1e-9)


def test_one_hot_draft_probs_rows_match_none(monkeypatch):
    """draft_probs given as explicit one-hot rows is the same algorithm as None."""
    branches = Branches(monkeypatch)
    target, _ = models("t1")
    tokens = [2, 0]
    target_probs = torch.stack([target.probs(tokens[:i]) for i in range(3)])  # (3, V)
    one_hot_rows = torch.nn.functional.one_hot(torch.tensor(tokens), VOCAB).double()  # (2, V)
    with_none = branches.distribution(lambda: verify_sampling(target_probs, tokens, None, UNUSED))
    with_rows = branches.distribution(lambda: verify_sampling(target_probs, tokens, one_hot_rows, UNUSED))
    assert with_none.keys() == with_rows.keys()
    assert all(with_none[r] == pytest.approx(with_rows[r], abs=1e-12) for r in with_none)


@pytest.mark.parametrize("name", [n for n in MC_STEPS if n.startswith("chain")])
def test_chi_square_real_generator(name):
    target, step = mc_step(name)
    assert chi_square_p_value(step, target) > 1e-3


def test_forced_rejection_with_equal_rows_falls_back_to_the_target(monkeypatch):
    """target == draft leaves an all-zero residual; a (numerically) forced rejection
    must still emit a token from target_probs."""
    monkeypatch.setattr(draws, "accept", lambda probability, generator=None: False)
    row = torch.tensor([0.0, 0.5, 0.5, 0.0])
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        result = verify_sampling(torch.stack([row, row]), [1], row[None], gen)
        assert result.num_accepted == 0 and result.tokens[0] in (1, 2)


def test_sampling_with_one_hot_target_is_greedy():
    """Greedy params make target_probs one-hot; sampling verification then equals greedy."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(50):
        logits = torch.randn(4, 6, generator=gen)  # (k+1, V)
        draft = torch.randint(0, 6, (3,), generator=gen).tolist()
        if trial % 2:
            draft[:2] = logits[:2].argmax(-1).tolist()
        target_probs = process_logits(logits, SamplingParams(temperature=0.0))
        assert verify_sampling(target_probs, draft, None, gen) == verify_greedy(logits, draft)


def test_greedy_all_accepted_emits_bonus():
    assert verify_greedy(rows_with_argmax(2, 0, 1, 3), [2, 0, 1]) == VerifyResult(3, (2, 0, 1, 3), (0, 1, 2))


def test_greedy_first_rejection_emits_recovered():
    assert verify_greedy(rows_with_argmax(2, 4, 1, 3), [2, 0, 1]) == VerifyResult(1, (2, 4), (0,))
    assert verify_greedy(rows_with_argmax(5, 0, 1, 3), [2, 0, 1]) == VerifyResult(0, (5,), ())


def test_greedy_empty_draft_and_ties():
    assert verify_greedy(rows_with_argmax(4), []) == VerifyResult(0, (4,), ())
    tie = torch.tensor([[0.0, 3.0, 3.0, 1.0], [1.0, 1.0, 0.0, 0.0]])  # argmax 1 (first max), then 0
    assert verify_greedy(tie, [2]) == VerifyResult(0, (1,), ())
    assert verify_greedy(tie, [1]) == VerifyResult(1, (1, 0), (0,))


def test_inputs_that_are_not_logits_probabilities_or_token_ids_are_refused():
    """A NaN row made argmax emit token 0; 1.7 was read as token 1; a target row scaled up made every
    acceptance likelier (a silently lossy verification); a negative or NaN entry went unnoticed."""
    logits = torch.tensor([[0.0, 9.0], [9.0, 0.0]])
    with pytest.raises(ValueError, match="target_logits hold NaN"):
        verify_greedy(torch.tensor([[0.0, float("nan")], [9.0, 0.0]]), [1])
    for row in ([float("-inf")] * 2, [0.0, float("inf")]):  # token 0, or the inf, was emitted silently
        with pytest.raises(ValueError, match="without a finite largest logit"):
            verify_greedy(torch.tensor([row, [9.0, 0.0]]), [1])
    with pytest.raises(ValueError, match=r"draft_tokens\[0\] = 1.7 is not a token id"):
        verify_greedy(logits, [1.7])
    with pytest.raises(ValueError, match=r"draft_tokens\[0\] = True is not a token id"):
        verify_greedy(logits, [True])
    probs = torch.tensor([[0.5, 0.5], [0.25, 0.75]])
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="target_probs rows must be probability distributions .* from 5 to 5"):
        verify_sampling(probs * 5, [1], None, gen)
    with pytest.raises(ValueError, match="draft_probs rows must be probability distributions"):
        verify_sampling(probs, [1], torch.tensor([[-0.5, 1.5]]), gen)
    with pytest.raises(ValueError, match="target_probs rows must be"):
        verify_sampling(torch.tensor([[float("nan"), 1.0], [0.5, 0.5]]), [1], None, gen)
    assert verify_greedy(logits, [1]).tokens == (1, 0)  # proper input still verifies
