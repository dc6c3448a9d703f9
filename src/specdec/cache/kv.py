"""Preallocated KV cache for speculation.

Layout: k, v: (num_layers, num_slots, num_kv_heads, max_len, head_dim), written by
absolute position. Each slot (one sequence) has a length pointer; rollback moves it
(O(1)), and the buffer never reallocates during generation. Tree verification
writes every tree node after the committed prefix; `keep` then moves the accepted
path's entries down so the prefix is contiguous again.
"""

from __future__ import annotations

import torch


class KVCache:
    # Whether a slot's first n rows can start another sequence as they are (the prefix cache, cache/prefix.py):
    # true of keys and values, which each position holds on its own. A subclass that keeps more than that (a
    # recurrent state, cache/recurrent.py) must say False unless it can give the state at any kept length.
    holds_prefixes = True

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, num_slots: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", spare: int = 0):
        """spare: positions past max_len that no sequence keeps, zero-filled with the rest: the device
        runtime's padded rows write there, and its fixed-shape attention reads every position
        (model/device_program.py). Without spare positions the buffer is left unfilled."""
        shape = (num_layers, num_slots, num_kv_heads, max_len + spare, head_dim)
        # empty, not zeros: nothing reads a position before it is written, and the OS commits the
        # pages of a large buffer only when touched, so slots that never run cost no memory
        make = torch.zeros if spare else torch.empty
        self.k = make(shape, dtype=dtype, device=device)
        self.v = make(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.lengths = [0] * num_slots
        self.free_slots = list(range(num_slots - 1, -1, -1))

    @property
    def num_slots(self) -> int:
        return len(self.lengths)

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def allocate(self, slot: int | None = None, keep: int = 0) -> int:
        """A free slot (`slot` itself when given) whose first `keep` rows stay from its last sequence (the
        prefix cache; default 0: an empty slot); raises RuntimeError when all are in use."""
        if not self.free_slots:
            raise RuntimeError(f"all {self.num_slots} KV cache slots are in use")
        if not 0 <= keep <= self.max_len:
            raise ValueError(f"cannot keep {keep} rows of a {self.max_len}-row slot")
        if slot is None:
            slot = self.free_slots.pop()
        else:
            self.free_slots.remove(slot)  # ValueError for a slot in use
        self.lengths[slot] = keep
        return slot

    def release(self, slot: int) -> None:
        self.lengths[slot] = 0
        if slot not in self.free_slots:
            self.free_slots.append(slot)

    def restorable(self, slot: int, length: int) -> bool:
        """Whether truncate(slot, length) can roll back there: any length up to the slot's (a hybrid model's
        cache, cache/recurrent.py, holds the recurrent state of its last few lengths only)."""
        return 0 <= length <= self.lengths[slot]

    def truncate(self, slot: int, length: int) -> None:
        """Roll back `slot` to its first `length` positions."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        self.lengths[slot] = length

    def copy_prefix(self, source: int, slot: int, length: int) -> None:
        """Give `slot` the first `length` rows of slot `source` (every layer's keys and values): a sequence
        that shares those tokens goes on from there. Rows are written by absolute position, so they are valid
        at the same offsets in any slot."""
        if not 0 <= length <= self.max_len:
            raise ValueError(f"cannot copy {length} rows of a {self.max_len}-row slot")
        self.k[:, slot, :, :length] = self.k[:, source, :, :length]
        self.v[:, slot, :, :length] = self.v[:, source, :, :length]
        self.lengths[slot] = length

    def keep(self, slot: int, start: int, offsets: list[int]) -> None:
        """Keep the entries at start+offsets[i] as positions start+i; drop everything after.

        Used after tree verification: offsets are the accepted nodes' indices in the tree.
        """
        if offsets != list(range(len(offsets))):
            src = torch.tensor([start + o for o in offsets])
            n = len(offsets)
            self.k[:, slot, :, start : start + n] = self.k[:, slot, :, src]
            self.v[:, slot, :, start : start + n] = self.v[:, slot, :, src]
        self.lengths[slot] = start + len(offsets)
