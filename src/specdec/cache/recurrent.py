"""The cache of a hybrid model (Qwen3.5): KVCache's keys and values for its full-attention layers, and for
its linear-attention layers the state a sequence has after each of its last few lengths.

    conv: (linear_layers, slots, D + 1, K - 1, conv_dim)   the last K - 1 rows the convolution read
    ssm:  (linear_layers, slots, D + 1, nv, dk, dv)         the delta rule's recurrent state

A slot's state after length L sits at ring place L % D while L is at least oldest[slot]; place D (the anchor)
holds the state at anchor[slot] when a forward of D rows or more went past it. A forward of T rows from
length s reads place s % D and writes each row's state to the next place, so the state before it stays
(T < D) and every length it passes stays: rolling back to any of them (a rejected draft, a draft model's
fork, a failed step) is a pointer move, as for the KV cache. An exact (verify) forward of D rows or more
widens the ring first, once; a prefill that long keeps its starting state in the anchor instead.

Memory per slot: D + 1 states per layer (Qwen3.5-9B: 24 layers x 32 heads x 128 x 128 x 4 bytes = 48 MB a
state). Rows never copy a state: each writes its own place, as an in-place update would.
"""

from __future__ import annotations

import torch

from specdec.cache.kv import KVCache

HISTORY = 8  # ring places at first: an exact forward of up to 7 rows (a 6-token draft) keeps every length


class RecurrentRollbackError(ValueError):
    """A rollback to a length whose recurrent state the cache no longer holds."""


class HybridCache(KVCache):
    holds_prefixes = False  # a slot keeps the state of its last few lengths only: no prefix cache (KVCache)

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, max_len: int, num_slots: int = 1,
                 dtype: torch.dtype = torch.float32, *, linear_layers: int, conv_shape: tuple[int, int],
                 state_shape: tuple[int, int, int], history: int = HISTORY):
        """num_layers: the full-attention layers (KVCache's); linear_layers: the Gated DeltaNet layers;
        conv_shape (K - 1, conv_dim); state_shape (nv, dk, dv); history: ring places D (at least 2)."""
        super().__init__(num_layers, num_kv_heads, head_dim, max_len, num_slots, dtype)
        self.linear_layers, self.conv_shape, self.state_shape = linear_layers, conv_shape, state_shape
        self.history = max(2, history)
        # empty: a slot's place 0 is zeroed when the slot is allocated; the others are written before read
        self.conv = torch.empty(linear_layers, num_slots, self.history + 1, *conv_shape)
        self.ssm = torch.empty(linear_layers, num_slots, self.history + 1, *state_shape)
        self.oldest = [0] * num_slots
        self.anchor = [-1] * num_slots

    def nbytes(self) -> int:
        return super().nbytes() + (self.conv.numel() + self.ssm.numel()) * 4

    def state_bytes(self) -> int:
        """Bytes of one state of every linear layer (conv and ssm): what one ring place holds per slot."""
        return self.linear_layers * 4 * (self.conv[0, 0, 0].numel() + self.ssm[0, 0, 0].numel())

    def place(self, length: int) -> int:
        return length % self.history

    def _zero(self, slot: int) -> None:
        """The state of length 0 (all zeros) at place 0."""
        self.conv[:, slot, 0] = 0
        self.ssm[:, slot, 0] = 0
        self.oldest[slot], self.anchor[slot] = 0, -1

    def allocate(self, *args, **kwargs) -> int:
        slot = super().allocate(*args, **kwargs)
        self._zero(slot)
        return slot

    def restorable(self, slot: int, length: int) -> bool:
        """Whether truncate(slot, length) can give the state after `length` tokens."""
        return 0 <= length <= self.lengths[slot] and (length == 0 or length >= self.oldest[slot]
                                                      or length == self.anchor[slot])

    def truncate(self, slot: int, length: int) -> None:
        """Roll back `slot` to its first `length` positions, keys, values and recurrent state."""
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"cannot truncate slot {slot} of length {self.lengths[slot]} to {length}")
        if length == 0:
            self._zero(slot)
        elif length < self.oldest[slot]:
            if length != self.anchor[slot]:
                raise RecurrentRollbackError(
                    f"slot {slot} holds the recurrent state of lengths {self.oldest[slot]}..{self.lengths[slot]} "
                    f"only, not of {length}: a hybrid model rolls back as far as its ring of {self.history} states")
            self.conv[:, slot, self.place(length)] = self.conv[:, slot, self.history]
            self.ssm[:, slot, self.place(length)] = self.ssm[:, slot, self.history]
            self.oldest[slot] = length
        self.lengths[slot] = length

    def keep(self, slot: int, start: int, offsets: list[int]) -> None:
        """After a chain's verify: keep the first len(offsets) rows (offsets must be 0, 1, ...)."""
        if offsets != list(range(len(offsets))):
            raise ValueError("a hybrid model's recurrent state follows one path: it verifies chains, not trees")
        self.truncate(slot, start + len(offsets))

    def rows(self, slot: int, start: int, count: int, exact: bool) -> list[tuple[int, int, int]]:
        """Make room for `count` rows of `slot` from length `start`; (slot, read place, write place) per row.

        An exact forward wider than the ring widens it (every slot's states kept); a longer prefill first
        copies the state at `start` to the anchor place. Updates oldest[slot] as the rows will leave it."""
        if start != self.lengths[slot]:
            raise ValueError(f"slot {slot} is {self.lengths[slot]} long; rows cannot start at {start}")
        if count >= self.history:
            if exact:
                self._widen(count + 1)
            elif self.anchor[slot] != start:
                self.conv[:, slot, self.history] = self.conv[:, slot, self.place(start)]
                self.ssm[:, slot, self.history] = self.ssm[:, slot, self.place(start)]
                self.anchor[slot] = start
        self.oldest[slot] = max(self.oldest[slot], start + count - self.history + 1)
        return [(slot, self.place(start + t), self.place(start + t + 1)) for t in range(count)]

    def _widen(self, history: int) -> None:
        """history ring places (more than now), every slot's held lengths moved to their new places."""
        with torch.inference_mode(False):  # called from a forward: plain tensors, which truncate() may write later
            conv = torch.empty(self.linear_layers, self.num_slots, history + 1, *self.conv_shape)
            ssm = torch.empty(self.linear_layers, self.num_slots, history + 1, *self.state_shape)
        for slot in range(self.num_slots):
            if slot in self.free_slots:
                continue
            for length in range(max(self.oldest[slot], self.lengths[slot] - self.history + 1),
                                self.lengths[slot] + 1):
                conv[:, slot, length % history] = self.conv[:, slot, self.place(length)]
                ssm[:, slot, length % history] = self.ssm[:, slot, self.place(length)]
            self.oldest[slot] = max(self.oldest[slot], self.lengths[slot] - self.history + 1)
            conv[:, slot, history] = self.conv[:, slot, self.history]
            ssm[:, slot, history] = self.ssm[:, slot, self.history]
        self.conv, self.ssm, self.history = conv, ssm, history
