"""The one interface every drafter implements (docs/design.md, "Drafters").

A drafter proposes new tokens only and hears back how many were kept:

    drafter.begin(prompt, sampling, generator)       # a request starts
    draft = drafter.propose(context, draft_length=3)   # context: prompt + output so far
    ...verify...
    drafter.on_accept(num_accepted)

Every draft is a token tree (a chain is a tree with one child per node), so the engine
verifies one shape. No draft is a Draft with zero nodes, never None or an unchanged input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from specdec.sampling import SamplingParams
from specdec.verify.token_tree import TokenTree

__all__ = ["DEFAULT_DRAFT_LENGTH", "Draft", "Drafter", "DrafterBase", "TokenTree"]

# llama.cpp's --spec-draft-n-max default: the most tokens drafted per step unless told otherwise.
DEFAULT_DRAFT_LENGTH = 3


@dataclass(frozen=True)
class Draft:
    """Proposed tokens as a tree.

    tree: the drafted nodes; `Draft.chain(tokens)` for tokens in a row.
    draft_probs: (n, V) float32: row i is the drafter's processed distribution that node i
        was sampled from (its parent's distribution); None means a deterministic draft
        (one-hot at each node).
    """

    tree: TokenTree = TokenTree()
    draft_probs: torch.Tensor | None = None

    @staticmethod
    def chain(tokens: Sequence[int], draft_probs: torch.Tensor | None = None) -> "Draft":
        return Draft(TokenTree.chain(tokens), draft_probs)

    @property
    def tokens(self) -> tuple[int, ...]:
        """The drafted tokens in node order (for a chain: in the order they follow the context)."""
        return self.tree.tokens

    def __len__(self) -> int:
        return len(self.tree)

    @property
    def depth(self) -> int:
        """The positions the draft covers: a chain's length, a tree's deepest node (0: no draft)."""
        return max(self.tree.depths(), default=0)


class Drafter(Protocol):
    """What the engine needs from a drafter, and all it uses.

    name: the registry kind it was built as (counters are kept under it).
    hidden_layers: target layers whose hidden states it reads (transformers' hidden_states
        indices); () for drafters that read tokens only.
    cost_per_pass: True when a proposal costs one pass whatever its length (a block drafter);
        False when each drafted token costs about the same (autoregressive, lookups). Adaptive
        mode charges the measured draft time accordingly.
    """

    name: str
    hidden_layers: tuple[int, ...]
    cost_per_pass: bool

    def begin(self, prompt: Sequence[int], sampling: SamplingParams, generator: torch.Generator) -> None:
        """A new request starts with these prompt tokens, sampled with these settings."""

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        """A tree of new tokens to follow `context` (prompt + output so far), at most draft_length deep."""

    def on_accept(self, num_accepted: int) -> None:
        """How many of the last proposal's tokens the target kept."""

    def on_target_hidden(self, hidden: dict[int, torch.Tensor], tokens: Sequence[int]) -> None:
        """Hidden rows {layer: (n, H)} of the n tokens just committed to the target (hidden_layers only)."""

    def end(self, output: Sequence[int]) -> None:
        """The request finished with these output tokens (for cross-request memory)."""


class DrafterBase:
    """Default no-op hooks, so simple drafters only write `propose`."""

    name: str = "base"
    hidden_layers: tuple[int, ...] = ()
    cost_per_pass: bool = False

    def begin(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(),
              generator: torch.Generator | None = None) -> None:
        pass

    def on_accept(self, num_accepted: int) -> None:
        pass

    def on_target_hidden(self, hidden: dict[int, torch.Tensor], tokens: Sequence[int]) -> None:
        pass

    def end(self, output: Sequence[int]) -> None:
        pass
