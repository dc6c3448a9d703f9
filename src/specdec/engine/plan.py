"""What one request adds to a batched step (Plan), and the verify rows' layout for a token tree."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.engine.request import Request
from specdec.model.segments import Segment
from specdec.verify import TokenTree


@dataclass
class Plan:
    """One request's part of a step: the rows it adds to the forward and what to do with them after."""

    req: Request
    segment: Segment
    tokens: list[int]  # the rows' token ids
    draft: Draft | None = None  # None: a prefill chunk
    drafter: Drafter | None = None
    start: int = 0  # cache length before the forward
    draft_s: float = 0.0
    rollback_s: float = 0.0
    new: list[int] = field(default_factory=list)  # tokens emitted by this step


def tree_layout(tree: TokenTree, start: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(positions (1+n,), tree_mask (1+n, 1+n)) for the verify forward of [last committed
    token] + the tree's n nodes from cache offset `start`.

    A chain needs neither: the transformer's causal default is the same mask, and its
    contiguous-key path is the one plain decoding runs. (None, None) then.
    """
    if tree.is_chain:
        return None, None
    n = len(tree) + 1
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[:, 0] = True
    mask[1:, 1:] = tree.attention_mask()
    return torch.tensor([start] + [start + d for d in tree.depths()]), mask
