"""Which tokens each cache slot holds, so that a new sequence can start from another's prefix.

The prefix cache keeps the KV rows of sequences that ended in their slots (llama-server's slot reuse, not
vLLM's block pool: a slot's rows are contiguous, written by absolute position, so a row cannot be shared
in place). A new prompt takes the slot holding the longest common prefix of it, or has that prefix copied
into another slot, and prefills only the rest. Memory is the preallocated cache: nothing beyond its slots
is ever kept; a slot's content is evicted when a sequence takes the slot over, least recently used first.

    index = PrefixIndex(num_slots)
    choice = index.choose(prompt, free_slots, running, limit)  # Choice(slot, source, length)
    ... copy choice.length rows from choice.source into choice.slot when source is not None ...
    index.remember(slot, tokens)   # the tokens whose rows the slot holds, when its sequence ends
    index.forget(slot)             # its rows are about to be overwritten

A slot's content is a list of token ids: row i of the slot holds the keys and values of tokens[i] after
tokens[:i]. Running sequences are matched too (their committed rows, given by the caller), so requests
that run at the same time share a system prompt: the prefix is copied out of the running slot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share. Compared a block at a time (list slices compare in C)."""
    n = min(len(a), len(b))
    lo, step = 0, 256
    while lo + step <= n and a[lo : lo + step] == b[lo : lo + step]:
        lo += step
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return lo


@dataclass(frozen=True)
class Choice:
    """Where a new sequence starts: `slot` to run in, and `length` rows of its prompt already there (source
    None: the slot holds them) or to be copied from slot `source` first. length 0: a cold start."""

    slot: int
    length: int = 0
    source: int | None = None


class PrefixIndex:
    """The token content of every free slot, and when each last ended a sequence (for LRU eviction)."""

    def __init__(self, num_slots: int):
        self.tokens: list[list[int]] = [[] for _ in range(num_slots)]  # rows the slot holds; [] = none
        self.ended: list[int] = [0] * num_slots  # ticks of the clock when the slot's sequence ended; 0 = never
        self.clock = 0

    def remember(self, slot: int, tokens: Sequence[int]) -> None:
        """The slot's sequence ended holding rows for `tokens`."""
        self.clock += 1
        self.tokens[slot] = list(tokens)
        self.ended[slot] = self.clock

    def forget(self, slot: int) -> None:
        self.tokens[slot] = []
        self.ended[slot] = 0

    def held(self) -> int:
        """Rows held by free slots for later sequences (what /metrics reports as cached)."""
        return sum(len(t) for t in self.tokens)

    def choose(self, prompt: Sequence[int], free: Sequence[int], running: Mapping[int, Sequence[int]],
               limit: int) -> Choice:
        """The slot for `prompt` among the free ones, and how much of its prompt it finds cached (at most
        `limit` tokens: a prompt needs one row computed at least, for its first token's logits).

        running: {slot: tokens whose rows that busy slot holds}. The longest match wins (a free slot over a
        running one at equal length). A free slot whose whole content is a prefix of the prompt is taken as
        it is (a conversation's next turn); one whose content goes on past the match keeps it, and the match
        is copied into another free slot (empty first, else least recently used), unless it is the only
        free slot. With no match, the new sequence takes an empty or the least recently used free slot.
        """
        if not free:
            raise RuntimeError("no free cache slot")
        best, best_len = None, 0
        for slot in free:
            n = min(common_prefix(prompt, self.tokens[slot]), limit)
            if n > best_len or (n == best_len and n and self._whole(slot, n) and not self._whole(best, n)):
                best, best_len = slot, n
        for slot, tokens in running.items():
            n = min(common_prefix(prompt, tokens), limit)
            if n > best_len:
                best, best_len = slot, n
        if best_len == 0:
            return Choice(self._victim(free))
        if best in free and (self._whole(best, best_len) or len(free) == 1):
            return Choice(best, best_len)
        return Choice(self._victim([s for s in free if s != best]), best_len, best)

    def _whole(self, slot: int | None, n: int) -> bool:
        """Whether the free slot holds nothing past its first n rows."""
        return slot is not None and len(self.tokens[slot]) == n

    def _victim(self, free: Sequence[int]) -> int:
        """The free slot whose content matters least: an empty one, else the least recently ended."""
        return min(free, key=lambda s: (bool(self.tokens[s]), self.ended[s]))
