"""ngram-map-k and ngram-map-k4v: llama.cpp's n-gram map (common/ngram-map.cpp, common_ngram_map_draft and
common_ngram_map_accept; defaults in common/common.h, common_params_speculative_ngram_map).

Words as llama.cpp uses them, for a context of prompt + output whose last token was just sampled:

    n        key_size, the key n-gram: the last n tokens of the context (the sampled one included)
    m        the value m-gram after a key, and the most tokens drafted: the draft length asked for
             (llama.cpp's --spec-ngram-map-k-size-m / -k4v-size-m, which `export-config` writes)
    history  the context before the sampled token (llama.cpp's `inp`, cur_len tokens long)

One call, in order:
1. No draft while the history holds fewer than 2n + m tokens.
2. Find an earlier occurrence of the key (`match`, never position 0), one that m + 1 tokens follow in the
   history: first the position a hash table stored for the key's slot (if its tokens are the key; the slot's
   first occupant stays, so that is usually the key's first indexed occurrence), else the most recent
   occurrence among positions not indexed yet. The table indexes every position up to cur_len - n - m - 1
   once, newest first, except the n + m + 1 positions before the prompt's end (llama.cpp's loops skip them).
3. The key's record counts the calls that found it (hits); with fewer than min_hits, no draft.
4. k4v only: the record's four value slots count, for each occurrence of the key up to `match` (from where
   the last count stopped, `match` itself again each call), the m tokens after it; an m-gram that fills no
   slot once four are taken is not counted. The most counted value wins (the first slot among equals) only
   if it counts at least twice all the others together.
5. Draft the min(m, accepted) tokens after `match` itself, where accepted is how many the target kept of
   the last draft made from the same key and value (m before the first).

After a draft, on_accept(n) stores n as that value's accepted count: a key whose draft was wholly rejected
never drafts again in this request; one whose draft was half kept drafts half as much.

Where this differs from llama.cpp, and why:
- m is the draft length of each call, so it changes when the engine asks for fewer tokens (the end of the
  answer, --spec-adaptive); a value not yet drafted from drafts m (llama.cpp's initial m) of the current call.
- min_hits gates ngram-map-k too: llama.cpp reads --spec-ngram-map-k-min-hits but its key-only path returns
  before the check. At the default 1 the two agree.
- The map lives for one request (begin() starts over). llama.cpp keeps a server slot's map across requests
  and prunes positions past the previous prompt, which assumes the next prompt extends the last one.
- The hash table holds only the slots in use, and the key records and occurrences are found through
  dictionaries rather than by scanning; the positions found are the same.

    >>> d = NgramMapK(key_size=2)
    >>> context = [9, 1, 2, 3, 4, 5, 6, 7, 1, 2]
    >>> d.begin(context[:-1])
    >>> d.propose(context, draft_length=3).tokens
    (3, 4, 5)
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

from specdec.drafters.base import Draft
from specdec.drafters.ngram import IncrementalDrafter, NgramKey, check_order, check_positive

MAX_VALUES = 4  # value m-grams kept per key (the "4v"; llama.cpp's COMMON_NGRAM_MAX_VALUES)
MAX_COUNT = 16380  # counts stop here (COMMON_NGRAM_MAX_VALUE_COUNT)
HASH_SLOTS = 1 << 18  # the key table's slots (COMMON_NGRAM_HASH_MAP_SIZE)
LCG_FACTOR = 2654435761  # the key hash: h = h * LCG_FACTOR + token, in 32 bits


@dataclass
class Value:
    """A value m-gram after a key: where it starts in the history (0: an unused slot), how often it was
    counted, and how many tokens the target kept of the last draft made from it (None: none drafted yet)."""

    start: int = 0
    count: int = 0
    accepted: int | None = None


@dataclass
class KeyRecord:
    """A key n-gram that a call found earlier in the history: the calls that found it (hits), where its
    value counts stopped (stat_end), and its value slots."""

    hits: int = 0
    stat_end: int = 0
    values: list[Value] = field(default_factory=lambda: [Value() for _ in range(MAX_VALUES)])


@dataclass
class NgramMap(IncrementalDrafter):
    """The map both kinds share; key_only picks ngram-map-k (values[0] holds only its accepted count)."""

    key_size: int = 12
    min_hits: int = 1
    key_only: ClassVar[bool] = True

    def _check_args(self) -> None:
        check_positive(self.name, min_hits=self.min_hits)
        check_order(self.name, key_size=self.key_size)

    def _reset(self) -> None:
        super()._reset()
        self._prompt_len = 0  # llama.cpp's size_last_begin
        self._indexed_to = 0  # the last position the hash table indexed (key_map_last_idx)
        self._slots: dict[int, int] = {}  # hash slot -> the position of its first n-gram
        self._records: dict[NgramKey, KeyRecord] = {}
        self._occurrences: dict[NgramKey, list[int]] = {}  # key -> where it starts in the history, ascending
        self._last: Value | None = None  # the value the last draft came from

    def begin(self, prompt: Sequence[int], sampling=None, generator=None) -> None:
        super().begin(prompt)
        self._prompt_len = len(self._tokens)

    def _append(self, i: int) -> None:
        if not self.key_only and i + 1 >= self.key_size:  # the n-gram ending at token i is complete
            start = i + 1 - self.key_size
            self._occurrences.setdefault(tuple(self._tokens[start : i + 1]), []).append(start)

    def _slot(self, start: int) -> int:
        h = 0
        for token in self._tokens[start : start + self.key_size]:
            h = (h * LCG_FACTOR + token) & 0xFFFFFFFF
        return h % HASH_SLOTS

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        self._sync(context)
        self._last = None
        tokens, n, m = self._tokens, self.key_size, draft_length
        cur = len(tokens) - 1  # the history: all but the sampled token
        if m <= 0 or cur < 2 * n + m:
            return Draft()
        begin, span = min(self._prompt_len, cur), n + m + 1
        match = self._find(begin, span)
        self._index(begin, span)
        if match == 0:
            return Draft()
        key = tuple(tokens[-n:])
        record = self._records.setdefault(key, KeyRecord())
        record.hits = min(record.hits + 1, MAX_COUNT)
        if record.hits < self.min_hits:
            return Draft()
        value = record.values[0] if self.key_only else self._winner(record, key, match, m)
        if value is None:
            return Draft()
        self._last = value
        length = m if value.accepted is None else min(m, value.accepted)
        return Draft.chain(tuple(tokens[match + n : match + n + length]))

    def on_accept(self, num_accepted: int) -> None:
        if self._last is not None:
            self._last.accepted = num_accepted

    def _find(self, begin: int, span: int) -> int:
        """An earlier occurrence of the key (the last n tokens) that span = n + m + 1 tokens of the history
        follow, not at position 0: the one its hash slot stores, else the newest unindexed one; 0 if none."""
        tokens, n = self._tokens, self.key_size
        key = tokens[-n:]
        stored = self._slots.get(self._slot(len(tokens) - n), 0)
        if stored and stored < len(tokens) - 1 - span and tokens[stored : stored + n] == key:
            return stored
        for j in self._unindexed(begin, span):
            if tokens[j : j + n] == key:
                return j
        return 0

    def _unindexed(self, begin: int, span: int):
        """The positions the table has not indexed, newest first: the prompt's, then the output's (the
        history's last span tokens, and the span before the prompt's end, are not among them)."""
        cur = len(self._tokens) - 1
        if begin > span:
            yield from range(begin - span, self._indexed_to, -1)
        yield from range(cur - span, max(begin, self._indexed_to), -1)

    def _index(self, begin: int, span: int) -> None:
        """Index the unindexed positions, newest first; a slot keeps its first n-gram."""
        for j in self._unindexed(begin, span):
            self._slots.setdefault(self._slot(j), j)
        self._indexed_to = max(len(self._tokens) - 1 - span, self._indexed_to)

    def _winner(self, record: KeyRecord, key: NgramKey, match: int, m: int) -> Value | None:
        """Count the values after the key's occurrences up to match (k4v); the value that dominates, or None."""
        tokens, n = self._tokens, self.key_size
        starts = self._occurrences.get(key, [])
        for i in starts[bisect_left(starts, record.stat_end) : bisect_right(starts, match)]:
            after = i + n
            for value in record.values:
                if value.start == 0:
                    value.start, value.count, value.accepted = after, 0, None
                    break
                if tokens[after : after + m] == tokens[value.start : value.start + m]:
                    break
            else:
                continue  # four other values hold the slots: this one is not counted
            value.count = min(value.count + 1, MAX_COUNT)
        record.stat_end = match
        best = max(range(MAX_VALUES), key=lambda v: (record.values[v].count, -v))
        top = record.values[best].count
        others = sum(v.count for v in record.values) - top
        if others > 0 and top < 2 * others:
            return None
        return record.values[best]


@dataclass
class NgramMapK(NgramMap):
    """llama.cpp's ngram-map-k: drafts what followed the key's stored occurrence, no value statistics.

    Defaults key_size=12, min_hits=1: llama.cpp's (a 12-token key names one place in a text)."""

    name: str = field(default="ngram-map-k", init=False)


@dataclass
class NgramMapK4V(NgramMap):
    """llama.cpp's ngram-map-k4v: up to 4 value m-grams per key with counts; drafts only when one dominates.

    Defaults key_size=12, min_hits=1: llama.cpp's."""

    name: str = field(default="ngram-map-k4v", init=False)
    key_only: ClassVar[bool] = False
