"""attend.c: each query row over exactly its own keys of its own cache slot, for all rows of a
forward in one call. The math (softmax attention, against float64), and the row invariance the
runtime's exactness rests on: a row's bits never depend on the other rows or the thread count."""

from __future__ import annotations

import pytest
import torch

from specdec.model import kernels

pytestmark = pytest.mark.skipif(kernels.attend() is None,
                                reason=f"attend kernel unavailable: {kernels.why_unavailable('attend')}")

SLOTS, NKV, MAX_LEN = 3, 2, 200


def cache(hd: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(SLOTS, NKV, MAX_LEN, hd, generator=g) * 2, torch.randn(SLOTS, NKV, MAX_LEN, hd, generator=g))


def rows(key_lists: list[list[int]], slots: list[int]):
    offsets = torch.zeros(len(key_lists) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor([len(k) for k in key_lists]).cumsum(0)
    keys = torch.tensor([j for k in key_lists for j in k], dtype=torch.int64)
    return torch.tensor(slots, dtype=torch.int64), offsets, keys


def reference(q, k, v, key_lists, slots, scale):
    """Softmax attention in float64, row by row; query head h reads kv head h // group."""
    n, nh, hd = q.shape
    group = nh // k.shape[1]
    out = torch.empty(n, nh, hd, dtype=torch.float64)
    for r, (keys, slot) in enumerate(zip(key_lists, slots)):
        for h in range(nh):
            kk, vv = k[slot, h // group, keys].double(), v[slot, h // group, keys].double()
            p = torch.softmax(kk @ q[r, h].double() * scale, dim=0)
            out[r, h] = p @ vv
    return out


# key lists of the shapes the runtime sends: a prefix (any length, 1 included), a window, a tree path
KEY_LISTS = [list(range(0, 1)), list(range(0, 8)), list(range(0, 37)), list(range(20, 64)),
             list(range(0, 30)) + [31, 33, 34], list(range(5, 13))]
SLOT_OF = [0, 1, 2, 0, 1, 2]


@pytest.mark.parametrize("hd", [8, 64, 80, 256])  # 8 and 80: a last pass over 8 values, not 16
def test_rows_compute_softmax_attention(hd):
    k, v = cache(hd)
    q = torch.randn(len(KEY_LISTS), 4, hd, generator=torch.Generator().manual_seed(1))
    out = kernels.attend_rows(q, k, v, *rows(KEY_LISTS, SLOT_OF), 0.3)
    expected = reference(q, k, v, KEY_LISTS, SLOT_OF, 0.3)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)  # float32 sums of ~256 terms


# longer than the 64 keys p . v takes at a time, with a gap and a tail
LONG_LISTS = [list(range(0, 150)), list(range(3, 70)) + list(range(90, 200)), list(range(0, 64))]


@pytest.mark.parametrize("nh", [2, 12, 14])  # one kv group of 1, 6 and 7 query heads (p . v: 6 at a time)
def test_long_key_lists_and_wide_groups(nh):
    k, v = cache(24, seed=4)
    q = torch.randn(len(LONG_LISTS), nh, 24, generator=torch.Generator().manual_seed(5))
    slots = [0, 2, 1]
    out = kernels.attend_rows(q, k, v, *rows(LONG_LISTS, slots), 0.2)
    torch.testing.assert_close(out.double(), reference(q, k, v, LONG_LISTS, slots, 0.2), rtol=1e-5, atol=1e-5)
    for r in range(len(LONG_LISTS)):
        alone = kernels.attend_rows(q[r : r + 1], k, v, *rows(LONG_LISTS[r : r + 1], slots[r : r + 1]), 0.2)
        assert torch.equal(alone[0], out[r])


# a decode batch: 48 rows of 120-200 keys, enough work (> 2^21 multiply-adds) for the kernel to use threads
BATCH_LISTS = [list(range(0, 120 + (7 * r) % 80)) for r in range(48)]


def rows_as_alone(q, k, v, key_lists, slots, scale):
    """All rows in one call at 2 threads, checked bitwise against the call at 1 thread and against each row
    alone; returns the rows."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = kernels.attend_rows(q, k, v, *rows(key_lists, slots), scale)
        torch.set_num_threads(1)
        one_thread = kernels.attend_rows(q, k, v, *rows(key_lists, slots), scale)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, one_thread)
    for r in range(len(key_lists)):
        alone = kernels.attend_rows(q[r : r + 1], k, v, *rows(key_lists[r : r + 1], slots[r : r + 1]), scale)
        assert torch.equal(alone[0], together[r]), f"row {r} changed with its neighbours"
    return together


@pytest.mark.parametrize("key_lists", [KEY_LISTS, BATCH_LISTS], ids=["few-rows", "threaded-batch"])
def test_a_row_is_the_same_alone_with_any_neighbours_and_thread_count(key_lists):
    k, v = cache(64, seed=2)
    slots = [r % SLOTS for r in range(len(key_lists))]
    q = torch.randn(len(key_lists), 8, 64, generator=torch.Generator().manual_seed(3))
    together = rows_as_alone(q, k, v, key_lists, slots, 0.125)
    reversed_rows = kernels.attend_rows(q.flip(0), k, v, *rows(key_lists[::-1], slots[::-1]), 0.125)
    assert torch.equal(reversed_rows.flip(0), together)
    torch.testing.assert_close(together.double(), reference(q, k, v, key_lists, slots, 0.125), rtol=1e-5, atol=1e-5)


def test_large_scores_neither_overflow_nor_lose_the_maximum():
    """Scores far apart (exp underflows to 0 for all but the largest) and a key list of one."""
    k, v = cache(16, seed=4)
    q = torch.randn(2, 2, 16, generator=torch.Generator().manual_seed(5)) * 50
    lists = [list(range(40)), [7]]
    out = kernels.attend_rows(q, k, v, *rows(lists, [0, 1]), 1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), reference(q, k, v, lists, [0, 1], 1.0), rtol=1e-5, atol=1e-5)
    assert torch.equal(out[1], v[1, :, 7])  # one key: weight exactly 1


# verify forwards: each sequence's rows attend to its context, then one more key a row (a bundle, whose K and V
# are read once for all its rows: attend.c), beside rows that are not (a tree path, a window, a decode row)
VERIFY_LISTS = ([list(range(0, 61 + t)) for t in range(5)]  # 61..65 keys: across blocks of 8 and of 64
                + [list(range(0, 7 + t)) for t in range(3)]  # another slot: 7..9 keys, a block of 8 reached
                + [list(range(0, 30)) + [31, 33], list(range(0, 30)) + [31, 34]]  # tree branches: not nested
                + [list(range(3, 40)), list(range(4, 41))]  # a window: each row drops a key
                + [list(range(0, 150)) for _ in range(2)])  # two rows of one list (a re-run position)
VERIFY_SLOTS = [0] * 5 + [1] * 3 + [2] * 2 + [0] * 2 + [1] * 2


@pytest.mark.parametrize("nh,hd", [(12, 64), (14, 24), (2, 8)])  # kv groups of 6, 7 and 1 heads
def test_rows_of_one_sequence_read_together_give_each_rows_own_bits(nh, hd):
    k, v = cache(hd, seed=6)
    q = torch.randn(len(VERIFY_LISTS), nh, hd, generator=torch.Generator().manual_seed(7))
    together = rows_as_alone(q, k, v, VERIFY_LISTS, VERIFY_SLOTS, 0.25)
    expected = reference(q, k, v, VERIFY_LISTS, VERIFY_SLOTS, 0.25)
    torch.testing.assert_close(together.double(), expected, rtol=1e-5, atol=1e-5)


def test_query_heads_that_do_not_divide_among_the_kv_heads_are_refused():
    k, v = cache(8)
    with pytest.raises(ValueError, match="query heads"):
        kernels.attend_rows(torch.randn(1, 7, 8), k, v, *rows([[0, 1]], [0]), 1.0)


@pytest.mark.parametrize("nkv,nh", [(3, 3), (3, 9), (3, 12), (3, 15), (1, 4)])  # kv groups of 1, 3, 4, 5 and 4
def test_one_verify_split_by_query_heads_gives_the_one_thread_bits(nkv, nh):
    """One sequence's 5-row verify over 3 kv heads (or 1): at 2 threads the tasks would not divide evenly, so
    its groups split into tasks of some of their query heads (2 + 1 of a group of 3; 3 + 2 of 5), which must
    give the bits of one task per kv head."""
    g = torch.Generator().manual_seed(8)
    k, v = torch.randn(2, nkv, 100, 64, generator=g) * 2, torch.randn(2, nkv, 100, 64, generator=g)
    lists = [list(range(0, 90 + t)) for t in range(5)]
    q = torch.randn(5, nh, 64, generator=torch.Generator().manual_seed(9))
    together = rows_as_alone(q, k, v, lists, [1] * 5, 0.125)
    torch.testing.assert_close(together.double(), reference(q, k, v, lists, [1] * 5, 0.125), rtol=1e-5, atol=1e-5)


def test_a_decode_step_over_a_long_list_unsplit_gives_the_bits_of_its_split_verify():
    """A single row over a long list (700 keys of 64, 3 kv heads) at 2 threads runs a task per kv head, its
    groups whole (the cache read once); the same row inside a 5-row verify, whose groups split into tasks of
    2 + 1 query heads: the same bits, and softmax attention."""
    g = torch.Generator().manual_seed(13)
    k, v = (torch.randn(2, 3, 720, 64, generator=g) * 2).half(), torch.randn(2, 3, 720, 64, generator=g).half()
    lists = [list(range(0, 700 + t)) for t in range(5)]
    q = torch.randn(5, 9, 64, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # each row alone at 2 threads, where the unsplit tasks run
        together = rows_as_alone(q, k, v, lists, [1] * 5, 0.125)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(together.double(), reference(q, k.float(), v.float(), lists, [1] * 5, 0.125),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key_lists", [VERIFY_LISTS, BATCH_LISTS[:12]], ids=["verify", "decode-batch"])
def test_a_float16_cache_gives_attention_over_its_values_with_the_same_invariance(key_lists):
    """A float16 cache: each value widened exactly as it is read, so the rows are softmax attention over the
    float16 values (float64 reference), bitwise the same alone, with any neighbours, at any thread count."""
    k, v = (t.half() for t in cache(64, seed=10))
    slots = [r % SLOTS for r in range(len(key_lists))]
    q = torch.randn(len(key_lists), 8, 64, generator=torch.Generator().manual_seed(11))
    together = rows_as_alone(q, k, v, key_lists, slots, 0.125)
    expected = reference(q, k.float(), v.float(), key_lists, slots, 0.125)
    torch.testing.assert_close(together.double(), expected, rtol=1e-5, atol=1e-5)
    # the same values in a float32 cache: the same arithmetic on the same floats (widening is exact)
    as_float = kernels.attend_rows(q, k.float(), v.float(), *rows(key_lists, slots), 0.125)
    assert torch.equal(together, as_float)


@pytest.mark.parametrize("nh", [2, 12, 14])  # groups of 1, 6 and 7 heads: a task of 1 head widens nothing
def test_long_float16_key_lists_widened_a_block_at_a_time_give_the_float32_bits(nh):
    """Key lists of 2^15 values and more (here 700 keys of 64) have their float16 keys widened 8 at a time
    once for all of a task's (row, head) pairs: the bits of the float32 cache of the same values, alone, in a
    5-row verify, at any thread count."""
    g = torch.Generator().manual_seed(12)
    k, v = (torch.randn(2, NKV, 720, 64, generator=g) * 2).half(), torch.randn(2, NKV, 720, 64, generator=g).half()
    lists = [list(range(0, 700 + t)) for t in range(5)] + [list(range(3, 709))]
    slots = [1] * 5 + [0]
    q = torch.randn(len(lists), nh, 64, generator=g)
    together = rows_as_alone(q, k, v, lists, slots, 0.125)
    assert torch.equal(together, kernels.attend_rows(q, k.float(), v.float(), *rows(lists, slots), 0.125))
    expected = reference(q, k.float(), v.float(), lists, slots, 0.125)
    torch.testing.assert_close(together.double(), expected, rtol=1e-5, atol=1e-5)


def test_keys_and_values_of_different_dtypes_are_refused():
    k, v = cache(8)
    with pytest.raises(ValueError, match="share a dtype"):
        kernels.attend_rows(torch.randn(1, 2, 8), k.half(), v, *rows([[0, 1]], [0]), 1.0)


@pytest.mark.skipif(not kernels.has_vnni(), reason="this CPU has no AVX-512 (VNNI): only the AVX2 build runs here")
@pytest.mark.parametrize("half", [False, True], ids=["float32", "float16"])
def test_the_avx512_build_gives_the_avx2_builds_bits(half):
    """attend.c built with AVX-512 (q . k over pairs of keys, p . v 16 values a vector) against the AVX2 build:
    head widths with a last 8 or 16 values (24, 80), kv groups of 1 to 7 heads, single rows, a verify bundle
    and long lists, at 1 and 2 threads: the same bits."""
    avx2, wide = kernels.attend_build(False), kernels.attend_build(True)
    assert avx2 is not None and wide is not None and avx2 is not wide
    g = torch.Generator().manual_seed(14)
    threads = torch.get_num_threads()
    try:
        for hd, nkv, nh in [(64, 3, 9), (24, 2, 14), (80, 1, 4), (128, 2, 12), (8, 1, 1), (256, 1, 2)]:
            k, v = torch.randn(2, nkv, 720, hd, generator=g) * 2, torch.randn(2, nkv, 720, hd, generator=g)
            if half:
                k, v = k.half(), v.half()
            for lists in ([list(range(0, 37))], [list(range(0, 600 + t)) for t in range(4)], [list(range(0, 700))],
                          [list(range(0, 30)) + [31, 33, 34], list(range(5, 13)), list(range(0, 90))]):
                q = torch.randn(len(lists), nh, hd, generator=g)
                for n_threads in (1, 2):
                    torch.set_num_threads(n_threads)
                    args = (q, k, v, *rows(lists, [1] * len(lists)), hd ** -0.5)
                    assert torch.equal(kernels.attend_rows(*args, lib=wide), kernels.attend_rows(*args, lib=avx2))
    finally:
        torch.set_num_threads(threads)
