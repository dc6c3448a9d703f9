"""KVCache: slots handed out and taken back, rollback by moving a length pointer, the tree path kept."""

from __future__ import annotations

import pytest
import torch

from specdec.cache.kv import KVCache

LAYERS, HEADS, MAX_LEN, HEAD_DIM = 2, 3, 10, 4


def numbered(num_slots: int = 2) -> KVCache:
    """A cache whose every entry holds a distinct number, so moves and overwrites show."""
    cache = KVCache(LAYERS, HEADS, HEAD_DIM, MAX_LEN, num_slots)
    cache.k.copy_(torch.arange(cache.k.numel(), dtype=torch.float32).reshape(cache.k.shape))
    cache.v.copy_(-cache.k)
    return cache


def test_layout_and_size():
    cache = KVCache(LAYERS, HEADS, HEAD_DIM, MAX_LEN, num_slots=2, dtype=torch.bfloat16)
    assert cache.k.shape == cache.v.shape == (LAYERS, 2, HEADS, MAX_LEN, HEAD_DIM)
    assert cache.k.dtype == torch.bfloat16 and cache.num_slots == 2 and cache.max_len == MAX_LEN
    assert cache.nbytes() == 2 * LAYERS * 2 * HEADS * MAX_LEN * HEAD_DIM * 2
    assert cache.lengths == [0, 0]


def test_allocate_hands_out_each_slot_once_then_refuses():
    cache = KVCache(LAYERS, HEADS, HEAD_DIM, MAX_LEN, num_slots=2)
    assert [cache.allocate(), cache.allocate()] == [0, 1]
    with pytest.raises(RuntimeError, match="all 2 KV cache slots are in use"):
        cache.allocate()


def test_release_returns_the_slot_empty():
    cache = KVCache(LAYERS, HEADS, HEAD_DIM, MAX_LEN, num_slots=2)
    a, b = cache.allocate(), cache.allocate()
    cache.lengths[a] = 7
    cache.release(a)
    cache.release(a)  # twice is harmless: the slot is listed once
    assert cache.free_slots == [a] and cache.lengths[a] == 0
    assert cache.allocate() == a and cache.lengths[a] == 0
    cache.lengths[a] = 5
    cache.release(b)
    assert cache.allocate() == b and cache.lengths[a] == 5  # the other slot is untouched
    with pytest.raises(RuntimeError, match="in use"):
        cache.allocate()


def test_truncate_moves_the_pointer_back_only():
    cache = numbered()
    slot = cache.allocate()
    cache.lengths[slot] = 6
    before = cache.k.clone(), cache.v.clone()
    pointer = cache.k.data_ptr()
    cache.truncate(slot, 6)  # to its own length: nothing changes
    cache.truncate(slot, 2)
    assert cache.lengths[slot] == 2
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])  # no entry written
    assert cache.k.data_ptr() == pointer  # never reallocated
    for bad in (3, -1):
        with pytest.raises(ValueError, match=f"cannot truncate slot {slot} of length 2 to {bad}"):
            cache.truncate(slot, bad)
    cache.truncate(slot, 0)
    assert cache.lengths[slot] == 0


def test_keep_moves_the_accepted_path_down():
    """Tree nodes at start+1.. were written in tree order; offsets [0, 2, 5] keep the root and
    nodes 2 and 5 as positions start, start+1, start+2, in every layer and head."""
    cache = numbered()
    slot, other = cache.allocate(), cache.allocate()
    start = 3
    cache.lengths[slot] = start + 6
    cache.lengths[other] = 4
    before = cache.k.clone(), cache.v.clone()
    cache.keep(slot, start, [0, 2, 5])
    assert cache.lengths[slot] == start + 3 and cache.lengths[other] == 4
    for new, old in zip((cache.k, cache.v), before):
        assert torch.equal(new[:, slot, :, :start], old[:, slot, :, :start])  # the committed prefix
        for i, offset in enumerate([0, 2, 5]):
            assert torch.equal(new[:, slot, :, start + i], old[:, slot, :, start + offset])
        assert torch.equal(new[:, other], old[:, other])  # another sequence's entries


def test_keep_of_a_chain_prefix_only_moves_the_pointer():
    cache = numbered()
    slot = cache.allocate()
    cache.lengths[slot] = 8
    before = cache.k.clone()
    cache.keep(slot, 4, [0, 1])
    assert cache.lengths[slot] == 6 and torch.equal(cache.k, before)
    cache.keep(slot, 4, [])  # nothing kept, not even the root
    assert cache.lengths[slot] == 4
