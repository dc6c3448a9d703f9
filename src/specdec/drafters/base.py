"""The one interface every drafter implements (STYLE.md convention 1).

A drafter proposes new tokens only and hears back how many were kept:

    draft = drafter.propose(context, max_tokens=3)   # context: prompt + output so far
    ...verify...
    drafter.on_accept(num_accepted)

No draft is a Draft with zero tokens, never None or an unchanged input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch


@dataclass(frozen=True)
class TokenTree:
    """A draft tree as plain data.

    Node i holds tokens[i]; parents[i] is the index of its parent node, or -1 when
    its parent is the last committed token (the root). Nodes are listed so that a
    parent always comes before its children, and siblings in the order the
    drafter ranks them (best first). depth(i) = 1 for children of the root.
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("TokenTree: tokens and parents must have the same length")
        for i, p in enumerate(self.parents):
            if not (-1 <= p < i):
                raise ValueError(f"TokenTree: node {i} has parent {p}; parents must come first")

    def __len__(self) -> int:
        return len(self.tokens)

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

    @staticmethod
    def chain(tokens: Sequence[int]) -> "TokenTree":
        return TokenTree(tuple(tokens), tuple(range(-1, len(tokens) - 1)))


@dataclass(frozen=True)
class Draft:
    """Proposed tokens.

    tokens: the chain of drafted ids (for a tree: empty, see `tree`).
    draft_probs: (k, V) float32, the drafter's processed distribution at each drafted
        position; None means a deterministic draft (one-hot at each token).
    tree: a TokenTree when the drafter proposes several candidates per position;
        then draft_probs, when given, is (n, V): row i is the distribution the
        drafter sampled node i from (its parent's distribution).
    """

    tokens: tuple[int, ...] = ()
    draft_probs: torch.Tensor | None = None
    tree: TokenTree | None = None
    source: str = ""  # name of the drafter that produced it (for per-drafter stats)

    def __len__(self) -> int:
        return len(self.tree) if self.tree is not None else len(self.tokens)


EMPTY_DRAFT = Draft()


class Drafter(Protocol):
    """What the engine needs from a drafter."""

    name: str

    def begin(self, prompt: Sequence[int]) -> None:
        """A new request starts with these prompt tokens."""

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        """Up to max_tokens new tokens to follow `context` (prompt + output so far)."""

    def on_accept(self, num_accepted: int) -> None:
        """How many of the last proposal's tokens the target kept."""

    def end(self, output: Sequence[int]) -> None:
        """The request finished with these output tokens (for cross-request memory)."""


@dataclass
class DrafterBase:
    """Default no-op hooks, so simple drafters only write `propose`."""

    name: str = field(default="base", init=False)

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def on_accept(self, num_accepted: int) -> None:
        pass

    def end(self, output: Sequence[int]) -> None:
        pass
