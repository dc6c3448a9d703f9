"""Exact enumeration of every random draw of a program (the verifiers' and the drafters').

Installed with monkeypatch, `specdec.verify.draws.accept` and `.sample` (every random draw a
verifier makes) become branch points; with multinomial=True so do `torch.multinomial` and
`sample_token`'s draw (how the engine samples its first token and drafters sample their tokens
and trees).
distribution(program) replays the program once per combination of outcomes and returns
{outcome: exact probability}: the law of the program, with no sampling error.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import pytest
import torch

from specdec.sampling import params
from specdec.verify import draws


class Branches:
    def __init__(self, monkeypatch, multinomial: bool = False):
        self._choose: Callable = lambda options: pytest.fail("draw outside distribution()")
        monkeypatch.setattr(draws, "accept", self.accept)
        monkeypatch.setattr(draws, "sample", self.sample)
        if multinomial:
            monkeypatch.setattr(torch, "multinomial", self.multinomial)
            monkeypatch.setattr(params, "_draw", self.sample)

    def accept(self, probability: float, generator=None) -> bool:
        p = min(max(probability, 0.0), 1.0)
        return self._choose([(True, p), (False, 1.0 - p)])

    def sample(self, probs: torch.Tensor, generator=None) -> int:
        return self.draw(probs.tolist())

    def draw(self, weights: list[float]) -> int:
        """One index drawn with probability proportional to weights (the test's own draft sampling)."""
        total = sum(weights)
        return self._choose([(i, w / total) for i, w in enumerate(weights)])

    def multinomial(self, probs: torch.Tensor, num_samples: int, replacement: bool = False, generator=None,
                    out=None) -> torch.Tensor:
        """torch.multinomial of one (V,) row: num_samples draws in order, each without the earlier
        ones unless `replacement`, which is the law torch's sampler has."""
        if probs.dim() != 1 or out is not None:
            pytest.fail("Branches.multinomial takes one (V,) row")
        weights = probs.double().tolist()
        drawn = []
        for _ in range(num_samples):
            drawn.append(self.draw(weights))
            if not replacement:
                weights[drawn[-1]] = 0.0
        return torch.tensor(drawn)

    def distribution(self, program: Callable[[], object]) -> dict[object, float]:
        dist: dict[object, float] = defaultdict(float)
        pending: list[tuple[int, ...]] = [()]  # choice scripts still to replay
        while pending:
            script = pending.pop()
            path: list[int] = []
            weight = [1.0]

            def choose(options):
                options = [(value, w) for value, w in options if w > 0]
                if len(path) < len(script):
                    pick = script[len(path)]
                else:
                    pick = 0
                    pending.extend(tuple(path) + (alt,) for alt in range(1, len(options)))
                path.append(pick)
                weight[0] *= options[pick][1]
                return options[pick][0]

            self._choose = choose
            dist[program()] += weight[0]
        assert abs(sum(dist.values()) - 1.0) < 1e-9
        return dict(dist)
