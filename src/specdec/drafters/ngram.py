"""Model-free n-gram drafters: they copy what followed the current tail of the context.

All read only token ids, so they work for any model and cost microseconds:

    ngram-simple   last n tokens -> their most recent earlier occurrence -> copy what followed
    ngram-map-k    the same through a key -> (hits, last position) map; drafts after min_hits
    ngram-map-k4v  key -> up to 4 next-token candidates with counts; drafts only a clear winner
    ngram-cache    llama.cpp's three tiers: this context, earlier outputs, a static corpus
                   (drafters/ngram_cache.py)

Each keeps its own copy of the committed tokens and indexes every new token exactly once,
so a call costs O(new tokens + draft length), never a rescan of the whole context. The engine
passes prompt + committed output, which only grows within a request; begin() starts over.

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


# --- ngram-map-k --------------------------------------------------------------------------


@dataclass
class NgramMapK(IncrementalDrafter):
    """A map key -> (hits, last position); copies what followed the key's last occurrence
    once the key has occurred min_hits times before.

    Defaults key_size=3, min_hits=2: a 3-token key re-syncs quickly, and two earlier hits
    mean the pattern recurs (boilerplate, repeated structure) rather than matching by
    chance, which is what separates this kind from ngram-simple (which drafts on the first
    sighting). Use ngram-simple or suffix to copy a text that occurs once, as in editing.
    """

    key_size: int = 3
    min_hits: int = 2
    name: str = field(default="ngram-map-k", init=False)

    def _check_args(self) -> None:
        check_positive(self.name, min_hits=self.min_hits)
        check_order(self.name, key_size=self.key_size)

    def _reset(self) -> None:
        super()._reset()
        self._map: dict[NgramKey, list[int]] = {}  # key -> [hits, index after last occurrence]

    def _append(self, i: int) -> None:
        if i < self.key_size:
            return
        key = tuple(self._tokens[i - self.key_size : i])  # one token late, as in NgramSimple
        entry = self._map.get(key)
        if entry is None:
            self._map[key] = [1, i]
        else:
            entry[0] += 1
            entry[1] = i

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        self._sync(context)
        tokens = self._tokens
        if draft_length > 0 and len(tokens) >= self.key_size:
            entry = self._map.get(tuple(tokens[-self.key_size :]))
            if entry is not None and entry[0] >= self.min_hits:
                return Draft.chain(_copy_from(tokens, entry[1], draft_length))
        return Draft()


# --- ngram-map-k4v ------------------------------------------------------------------------

MAX_VALUES = 4  # next-token candidates kept per key (the "4v")


@dataclass
class NgramMapK4V(IncrementalDrafter):
    """key -> up to 4 next tokens with counts; drafts token by token while one dominates.

    A candidate is drafted when its count >= min_hits and >= dominance x the runner-up's
    count; the draft then continues from the key that ends with it. When a fifth distinct
    next token shows up, it replaces the least counted candidate (oldest among equals).

    Defaults key_size=3, min_hits=2, dominance=2.0: a winner seen twice and at least twice
    as often as any alternative is right most of the time; a 1:1 or 3:2 split is a coin
    toss that costs a verification row and gains nothing.
    """

    key_size: int = 3
    min_hits: int = 2
    dominance: float = 2.0
    name: str = field(default="ngram-map-k4v", init=False)

    def _check_args(self) -> None:
        check_positive(self.name, min_hits=self.min_hits)
        check_order(self.name, key_size=self.key_size)
        if self.dominance < 1.0:
            raise ValueError(f"{self.name}: dominance must be >= 1.0 (got {self.dominance})")

    def _reset(self) -> None:
        super()._reset()
        self._map: dict[NgramKey, list[list[int]]] = {}  # key -> [[token, count], ...]

    def _append(self, i: int) -> None:
        if i < self.key_size:
            return
        token = self._tokens[i]
        values = self._map.setdefault(tuple(self._tokens[i - self.key_size : i]), [])
        for value in values:
            if value[0] == token:
                value[1] += 1
                return
        if len(values) < MAX_VALUES:
            values.append([token, 1])
        else:
            weakest = min(range(MAX_VALUES), key=lambda v: values[v][1])
            values[weakest] = [token, 1]

    def _winner(self, key: NgramKey) -> int | None:
        best, best_count, runner_up = None, 0, 0
        for token, count in self._map.get(key, ()):
            if count > best_count:
                best, best_count, runner_up = token, count, best_count
            elif count > runner_up:
                runner_up = count
        if best_count >= self.min_hits and best_count >= self.dominance * runner_up:
            return best
        return None

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        self._sync(context)
        k = self.key_size
        tail = self._tokens[-k:]
        out: list[int] = []
        while len(out) < draft_length and len(tail) >= k:
            token = self._winner(tuple(tail[-k:]))
            if token is None:
                break
            out.append(token)
            tail.append(token)
        return Draft.chain(tuple(out))
