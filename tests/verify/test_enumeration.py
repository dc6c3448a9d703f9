"""The lossless checks themselves: the enumeration is exact, and both checks reject broken verifiers."""

from __future__ import annotations

import pytest
import torch

from helpers.branches import Branches
from specdec.verify import draws
from verify_helpers import (BROKEN, SHAPES, chain_step, chi_square_p_value, gap_to_target, mc_step, models,
                            tree_step)


def test_branches_give_every_outcome_its_exact_probability(monkeypatch):
    """A program whose second draw depends on the first, against its law worked out by hand."""
    branches = Branches(monkeypatch)

    def program():
        if draws.accept(0.3):  # 0.3
            return ("kept", draws.sample(torch.tensor([0.5, 0.0, 0.5])))  # token 1 is never drawn
        return ("drawn", branches.draw([0.2, 0.8]))  # 0.7 * (0.2, 0.8)

    law = branches.distribution(program)
    assert law.keys() == {("kept", 0), ("kept", 2), ("drawn", 0), ("drawn", 1)}
    for outcome, p in {("kept", 0): 0.15, ("kept", 2): 0.15, ("drawn", 0): 0.14, ("drawn", 1): 0.56}.items():
        assert law[outcome] == pytest.approx(p, abs=1e-12)


@pytest.mark.parametrize(
    "broken, step",
    [
        ("accept-always", "chain"),
        ("recover-from-target", "chain"),
        ("accept-always", "tree-3x1"),
        ("draws-from-flattened-rows", "tree-3x1-one-hot"),
        ("draws-from-flattened-rows", "tree-2x2-one-hot"),
        ("siblings-with-replacement", "tree-3x1"),
        ("siblings-with-replacement", "tree-2x2"),
    ],
)
def test_exact_check_rejects_a_broken_verifier(monkeypatch, broken, step):
    branches = Branches(monkeypatch)
    BROKEN[broken](monkeypatch)
    target, drafter = models("t1")
    if step == "chain":
        program = lambda: chain_step(target, drafter, 2, True, branches.draw)  # noqa: E731
    else:
        shape, sampled = SHAPES[step.split("-")[1]], not step.endswith("one-hot")
        program = lambda: tree_step(target, drafter, shape, sampled, branches.draw)  # noqa: E731
    assert gap_to_target(branches.distribution(program), target, 2) > 1e-3


@pytest.mark.parametrize(
    "broken, name", [("accept-always", "chain-k3-draft-probs"), ("draws-from-flattened-rows", "chain-k2-one-hot")]
)
def test_chi_square_rejects_a_broken_verifier(monkeypatch, broken, name):
    BROKEN[broken](monkeypatch)
    target, step = mc_step(name)
    assert chi_square_p_value(step, target) < 1e-3
