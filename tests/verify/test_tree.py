"""specdec.verify on token trees: sampled verification is exactly the target's law, greedy is plain greedy."""

from __future__ import annotations

import pytest
import torch

from helpers.branches import Branches
from specdec.verify import TokenTree, VerifyResult, verify_greedy, verify_tree_greedy, verify_tree_sampling
from verify_helpers import (MC_STEPS, PARAMS, SHAPES, UNUSED, chi_square_p_value, gap_to_target, mc_step,
                            models, rows_with_argmax, tree_step)


@pytest.mark.parametrize("params_name", PARAMS)
@pytest.mark.parametrize("sampled", [True, False], ids=["draft-probs", "one-hot"])
@pytest.mark.parametrize("shape", SHAPES)
def test_tree_sampling_is_exactly_the_target(monkeypatch, shape, sampled, params_name):
    branches = Branches(monkeypatch)
    target, drafter = models(params_name)
    results = branches.distribution(lambda: tree_step(target, drafter, SHAPES[shape], sampled, branches.draw))
    assert gap_to_target(results, target, 1) < 1e-9
    assert gap_to_target(results, target, 2) < 1e-9
    assert gap_to_target(results, target, 3) < 1e-9
    if params_name == "t1":  # full support: later siblings do get tried and kept
        assert sum(w for r, w in results.items() if r.accepted_path[:1] == (1,)) > 1e-3


def test_tree_rows_may_already_exclude_earlier_siblings(monkeypatch):
    """Row i may be the parent's distribution or the law of node i given its earlier
    siblings; both describe the same draft, so the verifier's law must be the same."""
    branches = Branches(monkeypatch)
    target, drafter = models("t1")
    draft_tree = TokenTree((2, 0, 3), (-1, -1, -1))
    target_probs = torch.stack([target.probs(())] + [target.probs((t,)) for t in draft_tree.tokens])  # (4, V)
    parent_rows = drafter.probs(()).repeat(3, 1)  # (3, V)
    conditioned = parent_rows.clone()
    conditioned[1:, 2] = 0.0
    conditioned[2:, 0] = 0.0
    conditioned /= conditioned.sum(-1, keepdim=True)
    laws = [
        branches.distribution(lambda: verify_tree_sampling(target_probs, draft_tree, rows, UNUSED))
        for rows in (parent_rows, conditioned)
    ]
    assert laws[0].keys() == laws[1].keys() and len(laws[0]) > 4
    assert all(laws[0][r] == pytest.approx(laws[1][r], abs=1e-12) for r in laws[0])


@pytest.mark.parametrize("name", [n for n in MC_STEPS if n.startswith("tree")])
def test_chi_square_real_generator(name):
    target, step = mc_step(name)
    assert chi_square_p_value(step, target) > 1e-3


def test_one_hot_tree_allows_repeated_sibling_tokens():
    """A deterministic draft may repeat a token among siblings; the repeat is never kept."""
    gen = torch.Generator().manual_seed(0)
    target_probs = torch.tensor([[0.0, 0.5, 0.5, 0.0]] * 3)  # (3, V)
    for _ in range(20):
        result = verify_tree_sampling(target_probs, TokenTree((1, 1), (-1, -1)), None, gen)
        assert result.accepted_path in ((), (0,))


def test_tree_greedy_picks_the_matching_sibling():
    # root -> {5, 7}; 5 -> {1}; 7 -> {2, 3}
    draft_tree = TokenTree(tokens=(5, 7, 1, 2, 3), parents=(-1, -1, 0, 1, 1))
    logits = rows_with_argmax(7, 1, 3, 0, 4, 2, vocab=8)  # rows: root, node 0..4
    assert verify_tree_greedy(logits, draft_tree) == VerifyResult(2, (7, 3, 2), (1, 4))
    logits = rows_with_argmax(7, 1, 6, 0, 4, 2, vocab=8)  # no child of node 1 matches 6
    assert verify_tree_greedy(logits, draft_tree) == VerifyResult(1, (7, 6), (1,))
    logits = rows_with_argmax(0, 1, 6, 0, 4, 2, vocab=8)
    assert verify_tree_greedy(logits, draft_tree) == VerifyResult(0, (0,), ())
    assert verify_tree_greedy(rows_with_argmax(3), TokenTree((), ())) == VerifyResult(0, (3,), ())
    twins = TokenTree((7, 7), (-1, -1))  # the first of equal siblings wins
    assert verify_tree_greedy(rows_with_argmax(7, 1, 2, vocab=8), twins) == VerifyResult(1, (7, 1), (0,))


def test_speculative_greedy_equals_plain_greedy():
    """Chain and tree greedy verification reproduce plain greedy decoding, ties included."""
    gen = torch.Generator().manual_seed(7)
    table: dict[tuple[int, ...], torch.Tensor] = {}

    def logits_after(seq):  # (V,) small integers, so ties are common
        return table.setdefault(tuple(seq), torch.randint(0, 3, (5,), generator=gen).float())

    plain: list[int] = []
    while len(plain) < 30:
        plain.append(int(logits_after(plain).argmax()))
    for use_tree in (False, True):
        out: list[int] = []
        while len(out) < 30:
            guess = plain[len(out): len(out) + 3]
            draft = [t if torch.rand((), generator=gen) < 0.7 else (t + 1) % 5 for t in guess]
            if use_tree:  # the draft as the second sibling of a wrong first one
                parents = (-1, -1) + tuple(range(1, len(draft)))
                draft_tree = TokenTree(((draft[0] + 2) % 5,) + tuple(draft), parents)
                paths = [[]] + [[draft_tree.tokens[i] for i in draft_tree.ancestors(n)]
                                for n in range(len(draft_tree))]
                result = verify_tree_greedy(torch.stack([logits_after(out + p) for p in paths]), draft_tree)
            else:
                rows = [logits_after(out + draft[:i]) for i in range(len(draft) + 1)]
                result = verify_greedy(torch.stack(rows), draft)
            out.extend(result.tokens)
        assert out[:30] == plain
