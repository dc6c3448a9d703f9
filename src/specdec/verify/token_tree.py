"""TokenTree: a draft as plain data (EAGLE's layout). A chain is a tree with one child per node.

    >>> tree = TokenTree(tokens=(5, 7, 2), parents=(-1, -1, 1))   # root -> {5, 7}, 7 -> 2
    >>> tree.depths(), tree.is_chain
    ([1, 1, 2], False)
    >>> TokenTree.chain([4, 9]).parents
    (-1, 0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class TokenTree:
    """Node i holds tokens[i]; parents[i] is the index of its parent node, or -1 when
    its parent is the last committed token (the root). Nodes are listed so that a
    parent always comes before its children, and siblings in the order the
    drafter ranks them (best first). depth(i) = 1 for children of the root.
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("TokenTree: tokens and parents must have the same length")
        for i, p in enumerate(self.parents):
            if not (-1 <= p < i):
                raise ValueError(f"TokenTree: node {i} has parent {p}; parents must come first")

    def __len__(self) -> int:
        return len(self.tokens)

    @staticmethod
    def chain(tokens: Sequence[int]) -> "TokenTree":
        return TokenTree(tuple(int(t) for t in tokens), tuple(range(-1, len(tokens) - 1)))

    @property
    def is_chain(self) -> bool:
        """True when node i's parent is node i-1 (the root for node 0): drafted tokens in a row."""
        return self.parents == tuple(range(-1, len(self.parents) - 1))

    def depths(self) -> list[int]:
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p < 0 else out[p] + 1)
        return out

    def children(self, node: int) -> list[int]:
        """Children of `node` (-1 = root) in ranked order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def ancestors(self, node: int) -> list[int]:
        """Path from the root's first child down to `node`, inclusive."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def attention_mask(self) -> torch.Tensor:
        """(n, n) bool: mask[i, j] is True when node i may attend to node j."""
        n = len(self.tokens)
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i in range(n):
            for j in self.ancestors(i):
                mask[i, j] = True
        return mask
