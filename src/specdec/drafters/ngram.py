"""Model-free n-gram drafters: they copy what followed the current tail of the context.

All four read only token ids, so they work for any model and cost microseconds:

    ngram-simple   last n tokens -> their most recent earlier occurrence -> copy what followed
    ngram-map-k    the same through a key -> (hits, last position) map; drafts after min_hits
    ngram-map-k4v  key -> up to 4 next-token candidates with counts; drafts only a clear winner
    ngram-cache    llama.cpp's three tiers: this context, earlier outputs, a static corpus

Each keeps its own copy of the committed tokens and indexes every new token exactly once,
so a call costs O(new tokens + draft length), never a rescan of the whole context. The engine
passes prompt + committed output, which only grows within a request; begin() starts over.

    >>> d = NgramSimple()
    >>> d.begin([1, 2, 3, 4, 9])
    >>> d.propose([1, 2, 3, 4, 9, 1, 2, 3], max_tokens=3).tokens
    (4, 9, 1)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from specdec.drafters.base import Draft, DrafterBase

NgramKey = tuple[int, ...]


@dataclass
class _IncrementalDrafter(DrafterBase):
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

    def begin(self, prompt: Sequence[int]) -> None:
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


def _check_positive(kind: str, **values: int) -> None:
    for arg, value in values.items():
        if value < 1:
            raise ValueError(f"{kind}: {arg} must be at least 1 (got {value})")


# --- ngram-simple -------------------------------------------------------------------------


@dataclass
class NgramSimple(_IncrementalDrafter):
    """Copy what followed the most recent earlier occurrence of the last n tokens.

    n runs from n_max down to n_min; the longest n-gram that occurred before wins (it pins
    the position best), the most recent occurrence among equals.

    Defaults n_min=2, n_max=6: in code editing the output copies the prompt's file except
    where it is edited, and after each edit drafting should resume as soon as the text is
    back in step. Two BPE tokens re-sync almost at once; six (about 20 characters of code)
    usually name a unique place in a file, and because longer n is tried first the
    ambiguous short match is only a fallback. llama.cpp's default n=12 waits 12 tokens
    after every edit before it drafts again.
    """

    n_min: int = 2
    n_max: int = 6
    name: str = field(default="ngram-simple", init=False)

    def _check_args(self) -> None:
        _check_positive(self.name, n_min=self.n_min)
        if self.n_max < self.n_min:
            raise ValueError(f"{self.name}: n_max ({self.n_max}) must be >= n_min ({self.n_min})")

    def _reset(self) -> None:
        super()._reset()
        # follow[n - n_min][ngram] = index of the token after its most recent occurrence
        self._follow: list[dict[NgramKey, int]] = [{} for _ in range(self.n_min, self.n_max + 1)]

    def _append(self, i: int) -> None:
        # Index the n-grams ending at i-1 under i, one token late: the current tail is
        # then never in its own index and a lookup finds an *earlier* occurrence.
        tokens = self._tokens
        for n in range(self.n_min, min(self.n_max, i) + 1):
            self._follow[n - self.n_min][tuple(tokens[i - n : i])] = i

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        self._sync(context)
        tokens = self._tokens
        if max_tokens > 0:
            for n in range(min(self.n_max, len(tokens)), self.n_min - 1, -1):
                start = self._follow[n - self.n_min].get(tuple(tokens[-n:]))
                if start is not None:
                    return Draft(tokens=_copy_from(tokens, start, max_tokens), source=self.name)
        return Draft(source=self.name)


# --- ngram-map-k --------------------------------------------------------------------------


@dataclass
class NgramMapK(_IncrementalDrafter):
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
        _check_positive(self.name, key_size=self.key_size, min_hits=self.min_hits)

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

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        self._sync(context)
        tokens = self._tokens
        if max_tokens > 0 and len(tokens) >= self.key_size:
            entry = self._map.get(tuple(tokens[-self.key_size :]))
            if entry is not None and entry[0] >= self.min_hits:
                return Draft(tokens=_copy_from(tokens, entry[1], max_tokens), source=self.name)
        return Draft(source=self.name)


# --- ngram-map-k4v ------------------------------------------------------------------------

MAX_VALUES = 4  # next-token candidates kept per key (the "4v")


@dataclass
class NgramMapK4V(_IncrementalDrafter):
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
        _check_positive(self.name, key_size=self.key_size, min_hits=self.min_hits)
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

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        self._sync(context)
        k = self.key_size
        tail = self._tokens[-k:]
        out: list[int] = []
        while len(out) < max_tokens and len(tail) >= k:
            token = self._winner(tuple(tail[-k:]))
            if token is None:
                break
            out.append(token)
            tail.append(token)
        return Draft(tokens=tuple(out), source=self.name)


# --- ngram-cache --------------------------------------------------------------------------

# Confidence thresholds per n-gram size 1, 2, 3, 4+ (llama.cpp's ngram-cache values): the
# n-gram must have been followed at least MIN_SAMPLES times, and the drafted token in at
# least MIN_PERCENT % of them. This request's own text is trusted more (lax) than other
# requests or a corpus (strict).
LAX_MIN_SAMPLES, LAX_MIN_PERCENT = (2, 2, 1, 1), (66, 50, 50, 50)
STRICT_MIN_SAMPLES, STRICT_MIN_PERCENT = (4, 3, 2, 2), (75, 66, 66, 66)

NgramCounts = dict[NgramKey, dict[int, int]]  # ngram -> {next token: count}


def _count_ngrams(
    counts: NgramCounts, tokens: Sequence[int], i: int, n_min: int, n_max: int
) -> None:
    """Count token i after each n-gram (n_min <= n <= n_max) that ends just before it."""
    token = tokens[i]
    for n in range(n_min, min(n_max, i) + 1):
        nexts = counts.setdefault(tuple(tokens[i - n : i]), {})
        nexts[token] = nexts.get(token, 0) + 1


def _pick(
    nexts: dict[int, int],
    prior: dict[int, int] | None,
    n: int,
    min_samples: tuple[int, ...],
    min_percent: tuple[int, ...],
) -> int | None:
    """The most likely next token if it passes the thresholds for n-gram size n.

    Counts are weighted by the static corpus (`prior`, counts after the last static_n
    tokens) as llama.cpp does: a token the corpus knows counts 100x its corpus count.
    """
    best, best_score, best_count, total = None, 0, 0, 0
    for token, count in nexts.items():
        score = count * (100 * prior[token] if prior and token in prior else 1)
        if score > best_score:
            best, best_score, best_count = token, score, count
        total += count
    level = min(n, len(min_samples)) - 1
    if total < min_samples[level] or 100 * best_count < min_percent[level] * total:
        return None
    return best


def load_corpus(path: str | os.PathLike) -> list[list[int]]:
    """Read a static corpus of token ids: a list of documents (n-grams never span two).

    Formats, by extension:
      .json  a list of ids, or a list of lists of ids (one per document) - what save_corpus writes
      .npy   a 1-D integer array (one document)
      other  text: whitespace-separated decimal ids, one document per line
    """
    p = Path(path)
    expected = "a JSON list of token ids (or of such lists), a 1-D integer .npy, or a text of ids"
    if not p.is_file():
        raise FileNotFoundError(f"ngram-cache corpus {p} does not exist; give {expected}")
    try:
        if p.suffix == ".npy":
            array = np.load(p, allow_pickle=False)
            if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
                raise ValueError(f"found a {array.ndim}-D {array.dtype} array")
            docs = [array.tolist()]
        elif p.suffix == ".json":
            data = json.loads(p.read_text())
            if isinstance(data, list) and data and all(isinstance(d, list) for d in data):
                docs = data
            else:
                docs = [data]
        else:
            lines = [line for line in p.read_text().splitlines() if line.strip()]
            docs = [[int(word) for word in line.split()] for line in lines]
        for doc in docs:
            if not isinstance(doc, list) or not all(type(t) is int and t >= 0 for t in doc):
                raise ValueError("found something other than non-negative integer ids")
    except (ValueError, OSError, UnicodeDecodeError) as err:
        raise ValueError(f"ngram-cache corpus {p} is not {expected}: {err}") from None
    if not any(docs):
        raise ValueError(f"ngram-cache corpus {p} holds no token ids; give {expected}")
    return docs


def save_corpus(path: str | os.PathLike, docs: Sequence[Sequence[int]]) -> None:
    """Write documents of token ids in the .json format load_corpus reads."""
    Path(path).write_text(json.dumps([[int(t) for t in doc] for doc in docs]))


@dataclass
class NgramCache(_IncrementalDrafter):
    """llama.cpp's ngram-cache: greedy token-by-token drafting from three tiers of counts.

    For each drafted position, the n-grams ending there (longest first) are looked up in
      1. context: this request's prompt + output          (lax thresholds)
      2. dynamic: outputs of earlier requests, via end()   (strict thresholds)
      3. static:  a corpus file, static_n-grams only       (strict thresholds)
    and the first tier that yields a confident token wins; the static counts also weight
    the other tiers' candidates. Drafting stops at the first position with no confident token.

    Defaults ngram_min=1, ngram_max=4, static_n=2 are llama.cpp's; its thresholds (above)
    keep 1-grams from drafting unless the continuation is nearly unanimous. The dynamic
    tier counts outputs only (not prompts) and, as in llama.cpp, is not bounded.
    """

    ngram_min: int = 1
    ngram_max: int = 4
    static_n: int = 2
    static_path: str | os.PathLike | None = None
    static_corpus: Sequence[Sequence[int]] | None = field(default=None, repr=False)
    name: str = field(default="ngram-cache", init=False)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs) -> "NgramCache":
        """An ngram-cache whose static tier is the corpus in `path` (see load_corpus)."""
        return cls(static_path=path, **kwargs)

    def _check_args(self) -> None:
        _check_positive(self.name, ngram_min=self.ngram_min, static_n=self.static_n)
        if self.ngram_max < self.ngram_min:
            raise ValueError(
                f"{self.name}: ngram_max ({self.ngram_max}) must be >= ngram_min ({self.ngram_min})"
            )
        if self.static_path is not None and self.static_corpus is not None:
            raise ValueError(f"{self.name}: give static_path or static_corpus, not both")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.static_path is not None:
            docs = load_corpus(self.static_path)
        else:
            docs = self.static_corpus or []
        self._static: NgramCounts = {}
        for doc in docs:
            doc = [int(t) for t in doc]
            for i in range(self.static_n, len(doc)):
                _count_ngrams(self._static, doc, i, self.static_n, self.static_n)
        self._dynamic: NgramCounts = {}

    def _reset(self) -> None:
        super()._reset()
        self._context: NgramCounts = {}

    def _append(self, i: int) -> None:
        _count_ngrams(self._context, self._tokens, i, self.ngram_min, self.ngram_max)

    def end(self, output: Sequence[int]) -> None:
        output = [int(t) for t in output]
        for i in range(1, len(output)):
            _count_ngrams(self._dynamic, output, i, self.ngram_min, self.ngram_max)

    def _next(self, tail: list[int]) -> int | None:
        prior = None
        if len(tail) >= self.static_n:
            prior = self._static.get(tuple(tail[-self.static_n :]))
        sizes = range(min(self.ngram_max, len(tail)), self.ngram_min - 1, -1)
        for tier, min_samples, min_percent in (
            (self._context, LAX_MIN_SAMPLES, LAX_MIN_PERCENT),
            (self._dynamic, STRICT_MIN_SAMPLES, STRICT_MIN_PERCENT),
        ):
            for n in sizes:
                nexts = tier.get(tuple(tail[-n:]))
                if nexts:
                    token = _pick(nexts, prior, n, min_samples, min_percent)
                    if token is not None:
                        return token
        if prior:
            return _pick(prior, None, self.static_n, STRICT_MIN_SAMPLES, STRICT_MIN_PERCENT)
        return None

    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        self._sync(context)
        tail = self._tokens[-max(self.ngram_max, self.static_n) :]
        out: list[int] = []
        while len(out) < max_tokens:
            token = self._next(tail)
            if token is None:
                break
            out.append(token)
            tail.append(token)
        return Draft(tokens=tuple(out), source=self.name)
