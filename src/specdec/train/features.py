"""The frozen target's outputs over the training sequences, computed once and kept (FeatureCache).

Every epoch runs the same sequences through the same frozen target, so after the first epoch the target's
forward (most of a step's time when the head is one layer and the target thirty) is work done again. The
cache keeps, per sequence, what the losses read (train/target.py's TargetOutputs): the hidden states of the
head's layers, the final hidden state and the top ids, in the target's dtype, up to a budget of bytes; a
sequence over the budget is computed again each time it comes.

A sequence is always computed on its own (a batch of one, no padding), whether it is kept or not, so the
numbers a loss gets do not depend on what else shared its batch or on what the cache held: a resumed run
(with an empty cache) trains the head an uninterrupted one trains.
"""

from __future__ import annotations

import torch

from specdec.train.target import DenseTarget, TargetOutputs


class FeatureCache:
    """DenseTarget.outputs, memoised per sequence (its token ids) up to `budget` bytes."""

    def __init__(self, target: DenseTarget, budget: int):
        self.target, self.config, self.budget = target, target.config, budget
        self.kept: dict[tuple, tuple[dict, torch.Tensor, torch.Tensor]] = {}
        self.bytes = self.hits = self.misses = 0

    def outputs(self, tokens: torch.Tensor, valid: torch.Tensor, hidden_layers=()) -> TargetOutputs:
        """tokens, valid: (B, T), each row's real tokens first (loop.pad_batch's padding); padded positions
        get zeros (the losses never read them)."""
        B, T = tokens.shape
        layers = tuple(sorted(hidden_layers))
        rows = [self._row(tokens[b, : int(n)], layers) for b, n in enumerate(valid.sum(1).tolist())]
        hidden = {i: self._pad([r[0][i] for r in rows], T) for i in layers}
        return TargetOutputs(self.target, hidden, self._pad([r[1] for r in rows], T), self._pad([r[2] for r in rows], T))

    def _row(self, ids: torch.Tensor, layers: tuple) -> tuple[dict, torch.Tensor, torch.Tensor]:
        key = (layers, ids.cpu().numpy().tobytes())
        got = self.kept.get(key)
        if got is not None:
            self.hits += 1
            return got
        self.misses += 1
        out = self.target.outputs(ids[None], None, layers)
        got = ({i: h[0] for i, h in out.hidden.items()}, out.last[0], out.top[0])
        size = sum(t.numel() * t.element_size() for t in (*got[0].values(), got[1], got[2]))
        if self.bytes + size <= self.budget:
            self.kept[key] = got
            self.bytes += size
        return got

    @staticmethod
    def _pad(rows: list[torch.Tensor], T: int) -> torch.Tensor:
        """Rows of (L_b, ...) -> (B, T, ...), zeros after each row's L_b."""
        out = rows[0].new_zeros((len(rows), T, *rows[0].shape[1:]))
        for b, r in enumerate(rows):
            out[b, : r.shape[0]] = r
        return out
