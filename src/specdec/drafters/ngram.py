"""Model-free n-gram drafters: they copy what followed the current tail of the context.

All read only token ids, so they work for any model and cost microseconds:

    ngram-simple   last n tokens -> their most recent earlier occurrence -> copy what followed
    ngram-map-k    llama.cpp's n-gram map: a key's stored occurrence, draft lengths cut to what
                   the target kept of the key's last draft (drafters/ngram_map.py)
    ngram-map-k4v  the same map with up to 4 value m-grams per key, counted; drafts only when one
                   dominates (drafters/ngram_map.py)
    ngram-mod      llama.cpp's hashed n-gram -> next token table, kept across requests; drafts a
                   chain of lookups (drafters/ngram_mod.py)
    ngram-cache    llama.cpp's three tiers: this context, earlier outputs, a static corpus
                   (drafters/ngram_cache.py)

IncrementalDrafter keeps a copy of the committed tokens and indexes every new token exactly
once, so a call costs O(new tokens + draft length), never a rescan of the whole context. The
engine passes prompt + committed output, which only grows within a request; begin() starts over.

    >>> d = NgramSimple()
    >>> d.begin([1, 2, 3, 4, 9])
    >>> d.propose([1, 2, 3, 4, 9, 1, 2, 3], draft_length=3).tokens
    (4, 9, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from specdec.drafters.base import Draft, DrafterBase

NgramKey = tuple[int, ...]


@dataclass
class IncrementalDrafter(DrafterBase):
    """Keeps a copy of the committed tokens and hands each new one to `_append` once."""

    def __post_init__(self) -> None:
        self._check_args()
        self._reset()

    def _check_args(self) -> None:
        pass

    def _reset(self) -> None:
        self._tokens: list[int] = []

    def _append(self, i: int) -> None:
        """Index token i (already in self._tokens)."""

    def begin(self, prompt: Sequence[int], sampling=None, generator=None) -> None:
        self._reset()
        self._sync(prompt)

    def _sync(self, context: Sequence[int]) -> None:
        seen = len(self._tokens)
        if len(context) < seen or (seen and int(context[seen - 1]) != self._tokens[-1]):
            # Not a continuation of what we indexed (begin() was skipped, or the caller
            # rewrote the context): start over rather than draft from another text.
            self._reset()
            seen = 0
        for token in context[seen:]:
            self._tokens.append(int(token))
            self._append(len(self._tokens) - 1)


def _copy_from(tokens: list[int], start: int, k: int) -> tuple[int, ...]:
    """Up to k tokens copied from tokens[start:], continuing periodically past the end.

    The tail of `tokens` matched the text just before `start`, so the text is assumed to
    repeat with period len(tokens) - start (an overlapping LZ77-style copy):
    tokens [7, 8, 7, 8], start 2 -> (7, 8, 7, 8, ...).
    """
    period = len(tokens) - start
    out: list[int] = []
    for j in range(k):
        out.append(tokens[start + j] if j < period else out[j - period])
    return tuple(out)


MAX_ORDER = 64  # longest n-gram key: every token is indexed under each order, so the cost grows with it


def check_positive(kind: str, **values: int) -> None:
    for arg, value in values.items():
        if value < 1:
            raise ValueError(f"{kind}: {arg} must be at least 1 (got {value})")


def check_order(kind: str, **values: int) -> None:
    """n-gram lengths from 1 to MAX_ORDER (order_max=10**7 took 12 GB and a minute over 2000 tokens)."""
    check_positive(kind, **values)
    for arg, value in values.items():
        if value > MAX_ORDER:
            raise ValueError(f"{kind}: {arg} must be at most {MAX_ORDER} tokens (got {value})")


# --- ngram-simple -------------------------------------------------------------------------


@dataclass
class NgramSimple(IncrementalDrafter):
    """Copy what followed the most recent earlier occurrence of the last n tokens.

    n runs from order_max down to order_min; the longest n-gram that occurred before wins (it pins
    the position best), the most recent occurrence among equals.

    Defaults order_min=2, order_max=6 (n-gram orders, not draft lengths): in code editing the output copies the prompt's file except
    where it is edited, and after each edit drafting should resume as soon as the text is
    back in step. Two BPE tokens re-sync almost at once; six (about 20 characters of code)
    usually name a unique place in a file, and because longer n is tried first the
    ambiguous short match is only a fallback. llama.cpp's default n=12 waits 12 tokens
    after every edit before it drafts again.
    """

    order_min: int = 2
    order_max: int = 6
    name: str = field(default="ngram-simple", init=False)

    def _check_args(self) -> None:
        check_order(self.name, order_min=self.order_min, order_max=self.order_max)
        if self.order_max < self.order_min:
            raise ValueError(f"{self.name}: order_max ({self.order_max}) must be >= order_min ({self.order_min})")

    def _reset(self) -> None:
        super()._reset()
        # follow[n - order_min][ngram] = index of the token after its most recent occurrence
        self._follow: list[dict[NgramKey, int]] = [{} for _ in range(self.order_min, self.order_max + 1)]

    def _append(self, i: int) -> None:
        # Index the n-grams ending at i-1 under i, one token late: the current tail is
        # then never in its own index and a lookup finds an *earlier* occurrence.
        tokens = self._tokens
        for n in range(self.order_min, min(self.order_max, i) + 1):
            self._follow[n - self.order_min][tuple(tokens[i - n : i])] = i

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        self._sync(context)
        tokens = self._tokens
        if draft_length > 0:
            for n in range(min(self.order_max, len(tokens)), self.order_min - 1, -1):
                start = self._follow[n - self.order_min].get(tuple(tokens[-n:]))
                if start is not None:
                    return Draft.chain(_copy_from(tokens, start, draft_length))
        return Draft()
