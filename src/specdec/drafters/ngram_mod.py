"""ngram-mod: llama.cpp's hashed n-gram table (common/ngram-mod.cpp, common_ngram_mod, and its drafter in
common/speculative.cpp, common_speculative_impl_ngram_mod: begin, draft_one, accept; defaults in
common/common.h, common_params_speculative_ngram_mod; flags in common/arg.cpp, --spec-ngram-mod-*).

The table: table_size int32 slots (4 Mi in llama.cpp, no flag), each the token that followed the last
n_match-gram hashed there, -1 when empty. The hash of tokens t_0..t_{n-1} is h = h * 6364136223846793005
+ t_i in 64 bits, modulo table_size. No key is stored, so a slot answers for every n-gram that lands in it.

    begin(prompt)    add the prompt's n-grams; when more than a quarter of the slots are in use, empty the
                     table (the prompt's n-grams with it: they are not added again until a reset below)
    propose(ctx, k)  history = ctx without its last token (the one just sampled). Once it holds more than
                     32 tokens past the last indexed position, add its n-grams (each followed by a history
                     token). Then look up the last n_match tokens, append the token found, look up the
                     last n_match again, up to k times. An empty slot ends the chain; before n_min tokens
                     it ends with no draft (llama.cpp's n_min 48 is more than any draft length here, so by
                     default a draft is k tokens or none)
    on_accept(n)     a draft that kept under a quarter of its tokens extends a streak of poor drafts; the
                     fifth in a row empties the table and indexes the whole context again at the next
                     call. A better draft ends the streak.

The table outlives a request: what one request wrote, later requests on the same drafter draft from
(llama.cpp shares one table between all server slots; here each drafter set of the engine has its own).
k is the draft length asked for (llama.cpp's --spec-ngram-mod-n-max, which `export-config` writes).

    >>> d = NgramMod(n_match=2, n_min=1)
    >>> d.begin([5, 6, 7, 8, 5, 6])
    >>> d.propose([5, 6, 7, 8, 5, 6, 7], draft_length=3).tokens
    (8, 5, 6)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from specdec.drafters.base import Draft, DrafterBase

EMPTY = -1
MULTIPLIER = 6364136223846793005  # the hash's LCG factor, 64-bit arithmetic
MASK = (1 << 64) - 1
CHUNK = 32  # new history tokens are indexed once more than this many wait
MAX_OCCUPANCY = 0.25  # begin() empties a table fuller than this
LOW_ACCEPTANCE = 0.25  # a draft that kept less than this fraction is a poor one
LOW_STREAK = 5  # poor drafts in a row that empty the table
MAX_TABLE = 1 << 26  # 256 MB of int32 slots


@dataclass
class NgramMod(DrafterBase):
    """Defaults n_match=24, n_min=48, table_size=4 Mi: llama.cpp's (n_match below 16 draws its warning of
    poor quality: short n-grams collide in meaning, not only in the table)."""

    n_match: int = 24
    n_min: int = 48
    table_size: int = 4 * 1024 * 1024
    name: str = field(default="ngram-mod", init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.n_match <= 1024:
            raise ValueError(f"{self.name}: n_match must be from 1 to 1024 tokens (got {self.n_match})")
        if not 0 <= self.n_min <= 1024:
            raise ValueError(f"{self.name}: n_min must be from 0 to 1024 tokens (got {self.n_min})")
        if not 1 <= self.table_size <= MAX_TABLE:
            raise ValueError(f"{self.name}: table_size must be from 1 to {MAX_TABLE} slots (got {self.table_size})")
        self._table = np.full(self.table_size, EMPTY, dtype=np.int32)
        self._used = 0  # slots not EMPTY
        self._outer = pow(MULTIPLIER, self.n_match - 1, 1 << 64)  # the oldest token's weight in a hash
        self._indexed_to = 0  # n-grams starting before this position of the context are in the table (i_last)
        self._drafted = 0  # tokens in the last draft (n_draft_last)
        self._poor_streak = 0  # drafts in a row that kept under LOW_ACCEPTANCE of their tokens (n_low)

    def begin(self, prompt: Sequence[int], sampling=None, generator=None) -> None:
        self._indexed_to = self._drafted = 0
        n = self.n_match
        if len(prompt) < n:
            return
        self._add(prompt, 0, len(prompt) - n)
        self._indexed_to = len(prompt) - n
        if self._used / self.table_size > MAX_OCCUPANCY:
            self._clear()

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        if draft_length <= 0:
            return Draft()
        self._drafted = 0
        n, history = self.n_match, len(context) - 1
        if history < n:
            return Draft()
        if self._indexed_to + CHUNK < history:
            self._add(context, self._indexed_to, history - n)
            self._indexed_to = history - n
        window = [int(t) for t in context[-n:]]
        for i in range(draft_length):
            token = int(self._table[self._hash(window, i)])
            if token == EMPTY:
                if i < self.n_min:
                    return Draft()
                break
            window.append(token)
        self._drafted = len(window) - n
        return Draft.chain(tuple(window[n:]))

    def on_accept(self, num_accepted: int) -> None:
        if self._drafted == 0:
            return
        if num_accepted / self._drafted >= LOW_ACCEPTANCE:
            self._poor_streak = 0
            return
        self._poor_streak += 1
        if self._poor_streak >= LOW_STREAK:
            self._clear()
            self._poor_streak = self._indexed_to = 0

    def _hash(self, tokens: Sequence[int], start: int) -> int:
        """The slot of the n-gram tokens[start : start + n_match]."""
        h = 0
        for token in tokens[start : start + self.n_match]:
            h = (h * MULTIPLIER + token) & MASK
        return h % self.table_size

    def _add(self, tokens: Sequence[int], first: int, stop: int) -> None:
        """Write the token after each n-gram starting at first..stop-1 into its slot (later ones win)."""
        n, table = self.n_match, self._table
        if first >= stop:
            return
        tokens = [int(t) for t in tokens[first : stop + n]]
        h = 0
        for token in tokens[:n]:
            h = (h * MULTIPLIER + token) & MASK
        for i in range(stop - first):
            slot = h % self.table_size
            if table[slot] == EMPTY:
                self._used += 1
            table[slot] = tokens[i + n]
            h = ((h - tokens[i] * self._outer) * MULTIPLIER + tokens[i + n]) & MASK  # roll: drop i, take i + n

    def _clear(self) -> None:
        self._table.fill(EMPTY)
        self._used = 0
