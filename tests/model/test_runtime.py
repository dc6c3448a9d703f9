"""The model runtime on tiny random models the tests build: loading, exact forward, cache."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import make_gguf_model, make_hf_model
from specdec.drafters.base import TokenTree
from specdec.model import kernels
from specdec.model.errors import CacheOverflowError
from specdec.model.linear import CONVERTED_FORMATS
from specdec.model.load import load_model
from specdec.model.segments import Segment
from specdec.model.transformer import CACHE_TYPES

PROMPT = [5, 17, 33, 101, 7, 250, 64, 9, 3, 12]
NEW = [40, 41, 300, 301, 7, 8]
LONG = [(7 * i + 3) % 500 for i in range(45)]  # 40 rows after the first 5: more than DENSE_MIN_ROWS


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def arch_dir(request, tmp_path_factory):
    return make_hf_model(tmp_path_factory.mktemp(request.param) / request.param, arch=request.param)


def _prefill(tr, cache, slot, ids):
    return tr.forward(torch.tensor([ids]), cache, [slot], exact=False, last_only=True)


def test_gguf_and_hf_folder_give_the_same_logits(tmp_path):
    """The GGUF path (with llama.cpp's q/k permutation undone) equals the HF path."""
    hf = load_model(str(make_hf_model(tmp_path / "hf")), "fp32", progress=False)
    gg = load_model(str(make_gguf_model(tmp_path / "m.gguf")), "fp32", progress=False)
    ids = torch.tensor([PROMPT])
    a = hf.transformer.forward(ids, hf.transformer.new_cache(64), [0], exact=False).logits
    b = gg.transformer.forward(ids, gg.transformer.new_cache(64), [0], exact=False).logits
    assert torch.allclose(a, b, atol=1e-5)
    assert gg.info.quant == "F32" and gg.info.arch == "llama"


def test_q8_0_gguf_loads_close_to_fp32(tmp_path):
    f32 = load_model(str(make_gguf_model(tmp_path / "a.gguf")), "fp32", progress=False)
    q8 = load_model(str(make_gguf_model(tmp_path / "b.gguf", tensor_type="Q8_0")), "fp32", progress=False)
    ids = torch.tensor([PROMPT])
    a = f32.transformer.forward(ids, f32.transformer.new_cache(64), [0], exact=False).logits
    b = q8.transformer.forward(ids, q8.transformer.new_cache(64), [0], exact=False).logits
    assert q8.info.quant == "Q8_0"
    assert not torch.equal(a, b) and torch.allclose(a, b, atol=0.05 * a.abs().max().item())


@pytest.mark.parametrize("fmt", [pytest.param(f, marks=pytest.mark.skipif(
    f == "w8a8" and kernels.w8a8() is None, reason="no W8A8 kernel here (no cc or no AVX2)")) for f in CONVERTED_FORMATS])
def test_multi_token_forward_equals_single_steps_bitwise(arch_dir, fmt):
    """k tokens in one exact forward give bitwise the logits of k single decode steps."""
    model = load_model(str(arch_dir), fmt, progress=False)
    tr = model.transformer
    cache = tr.new_cache(128)
    slot = cache.allocate()
    _prefill(tr, cache, slot, PROMPT)
    start = cache.lengths[slot]
    singles = [tr.forward(torch.tensor([[t]]), cache, [slot]).logits[0, 0] for t in NEW]
    cache.truncate(slot, start)  # rollback, then redo all at once
    multi = tr.forward(torch.tensor([NEW]), cache, [slot]).logits[0]
    for i in range(len(NEW)):
        assert torch.equal(multi[i], singles[i]), f"row {i} differs in {fmt}"
    assert cache.lengths[slot] == start + len(NEW)


def test_tree_forward_equals_the_path_decoded_alone(tiny_model):
    tr = tiny_model.transformer
    cache = tr.new_cache(128)
    slot = cache.allocate()
    _prefill(tr, cache, slot, PROMPT)
    start = cache.lengths[slot]
    path = [40, 300, 7]
    singles = [tr.forward(torch.tensor([[t]]), cache, [slot]).logits[0, 0] for t in path]
    cache.truncate(slot, start)
    # root children 40, 99; 40 -> 300, 12; 300 -> 7
    tree = TokenTree((40, 99, 300, 12, 7), (-1, -1, 0, 0, 2))
    positions = torch.tensor([[start + d - 1 for d in tree.depths()]])
    logits = tr.forward(torch.tensor([list(tree.tokens)]), cache, [slot], positions=positions,
                        tree_mask=tree.attention_mask()[None]).logits[0]
    for node, single in zip([0, 2, 4], singles):
        assert torch.equal(logits[node], single)
    # keep the accepted path, then one more step must match decoding the path alone
    cache.keep(slot, start, [0, 2, 4])
    after_tree = tr.forward(torch.tensor([[8]]), cache, [slot]).logits[0, 0]
    cache.truncate(slot, start)
    for t in path:
        tr.forward(torch.tensor([[t]]), cache, [slot])
    plain = tr.forward(torch.tensor([[8]]), cache, [slot]).logits[0, 0]
    assert torch.equal(after_tree, plain)


def test_batch_of_sequences_with_different_lengths(tiny_model):
    """Two sequences in one forward give the rows each would give alone."""
    tr = tiny_model.transformer
    cache = tr.new_cache(128, num_slots=2)
    a, b = cache.allocate(), cache.allocate()
    _prefill(tr, cache, a, PROMPT)
    _prefill(tr, cache, b, PROMPT[:4])
    la, lb = cache.lengths[a], cache.lengths[b]
    both = tr.forward(torch.tensor([NEW[:3], NEW[3:]]), cache, [a, b]).logits
    cache.truncate(a, la)
    cache.truncate(b, lb)
    alone_a = tr.forward(torch.tensor([NEW[:3]]), cache, [a]).logits[0]
    alone_b = tr.forward(torch.tensor([NEW[3:]]), cache, [b]).logits[0]
    assert torch.equal(both[0], alone_a) and torch.equal(both[1], alone_b)


@pytest.mark.parametrize("fmt", [pytest.param(f, marks=pytest.mark.skipif(
    f == "w8a8" and kernels.w8a8() is None, reason="no W8A8 kernel here (no cc or no AVX2)")) for f in CONVERTED_FORMATS])
def test_ragged_batch_gives_each_sequence_its_solo_outputs_bitwise(tiny_hf_dir, fmt):
    """forward_batch over a prefill chunk (long enough for int8's dense prefill path), a chain verify
    and a tree verify of different lengths gives each sequence bitwise the logits, hidden rows and
    cache entries of a forward of it alone."""
    tr = load_model(str(tiny_hf_dir), fmt, progress=False).transformer
    tree = TokenTree((40, 99, 300, 12, 7), (-1, -1, 0, 0, 2))

    def run(cache, slots, which):
        starts = [cache.lengths[s] for s in slots]
        segments = [
            Segment(torch.tensor(LONG[5:]), slots[0], exact=False, last_only=True),  # a second prefill chunk
            Segment(torch.tensor(NEW[:4]), slots[1]),  # [last token] + a 3-token chain draft
            Segment(torch.tensor([8, *tree.tokens]), slots[2],
                    positions=torch.tensor([starts[2]] + [starts[2] + d for d in tree.depths()]),
                    tree_mask=_root_and_tree_mask(tree)),
        ]
        return tr.forward_batch([segments[i] for i in which], cache, hidden_layers=(0, 1, 2))

    def fresh():
        cache = tr.new_cache(64, num_slots=3)
        slots = [cache.allocate() for _ in range(3)]
        _prefill(tr, cache, slots[0], LONG[:5])
        _prefill(tr, cache, slots[1], PROMPT)
        _prefill(tr, cache, slots[2], PROMPT[:7])
        return cache, slots

    cache, slots = fresh()
    together = run(cache, slots, [0, 1, 2])
    for i in range(3):
        solo_cache, solo_slots = fresh()
        (alone,) = run(solo_cache, solo_slots, [i])
        assert torch.equal(together[i].logits, alone.logits), f"sequence {i} logits differ in {fmt}"
        assert all(torch.equal(together[i].hidden[h], alone.hidden[h]) for h in (0, 1, 2))
        s = slots[i]
        n = cache.lengths[s]
        assert n == solo_cache.lengths[s]
        assert torch.equal(cache.k[:, s, :, :n], solo_cache.k[:, s, :, :n])
    assert together[0].logits.shape[1] == 1 and together[1].logits.shape[1] == 4
    assert together[2].logits.shape[1] == len(tree) + 1


def _root_and_tree_mask(tree: TokenTree) -> torch.Tensor:
    n = len(tree) + 1
    mask = torch.zeros(n, n, dtype=torch.bool)
    mask[:, 0] = True
    mask[1:, 1:] = tree.attention_mask()
    return mask


def test_batched_forward_refuses_a_slot_twice(tiny_model):
    tr = tiny_model.transformer
    cache = tr.new_cache(32)
    slot = cache.allocate()
    with pytest.raises(ValueError, match="same cache slot twice"):
        tr.forward_batch([Segment(torch.tensor([1]), slot), Segment(torch.tensor([2]), slot)], cache)


def test_hidden_states_of_chosen_layers(tiny_model):
    tr = tiny_model.transformer
    n = tiny_model.config.num_layers
    out = tr.forward(torch.tensor([PROMPT]), tr.new_cache(64), [0], hidden_layers=(0, 1, n))
    assert set(out.hidden) == {0, 1, n}
    assert out.hidden[0].shape == (1, len(PROMPT), tiny_model.config.hidden_size)
    assert torch.equal(out.hidden[0][0], tr.embed[torch.tensor(PROMPT)].float())
    assert not torch.equal(out.hidden[1], out.hidden[n])


def test_prefill_and_exact_paths_agree_closely(tiny_model):
    tr = tiny_model.transformer
    fused = tr.forward(torch.tensor([PROMPT]), tr.new_cache(64), [0], exact=False).logits
    exact = tr.forward(torch.tensor([PROMPT]), tr.new_cache(64), [0], exact=True).logits
    assert torch.allclose(fused, exact, atol=1e-4)


def test_forward_past_the_cache_end_is_an_error(tiny_model):
    """The cache is bounded (rollback and slots: tests/cache/test_kv.py)."""
    tr = tiny_model.transformer
    cache = tr.new_cache(8)
    slot = cache.allocate()
    with pytest.raises(ValueError, match="exceed the cache length 8"):
        tr.forward(torch.tensor([list(range(9))]), cache, [slot])
    tr.forward(torch.tensor([[1, 2, 3]]), cache, [slot])
    assert cache.lengths[slot] == 3
    with pytest.raises(ValueError, match="exceed the cache length 8"):
        tr.forward(torch.tensor([list(range(6))]), cache, [slot])


def test_int4_and_int8_weights_stay_close_to_fp32(tiny_hf_dir):
    ref = load_model(str(tiny_hf_dir), "fp32", progress=False)
    ids = torch.tensor([PROMPT])
    base = ref.transformer.forward(ids, ref.transformer.new_cache(64), [0], exact=False).logits
    # random Gaussian weights are the worst case for a 16-level grid, hence int4's loose bound
    for fmt, bound in (("bf16", 0.02), ("int8", 0.05), ("int4", 0.25)):
        m = load_model(str(tiny_hf_dir), fmt, progress=False)
        out = m.transformer.forward(ids, m.transformer.new_cache(64), [0], exact=False).logits
        rel = (out - base).abs().max() / base.abs().max()
        assert rel < bound, f"{fmt} drifted {rel:.3f}"
        assert m.info.weights_dtype == fmt


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_exact_rows_with_and_without_the_attention_kernel(tiny_model, monkeypatch, kv):
    """attend.c (all exact rows of a forward in one call) and torch's row-by-row fallback (no C
    compiler, no AVX2) each keep a k-token forward bitwise k one-token steps, over a float32 and a
    float16 cache; they agree closely."""
    tr = tiny_model.transformer
    monkeypatch.setattr(tr, "kv_dtype", CACHE_TYPES[kv])
    outputs = {}
    for use_kernel in (False, True):
        if use_kernel and kernels.attend() is None:
            continue
        monkeypatch.setattr(tr, "_attend_kernel", use_kernel)
        cache = tr.new_cache(128, 2)
        a, b = cache.allocate(), cache.allocate()
        _prefill(tr, cache, a, PROMPT)
        _prefill(tr, cache, b, PROMPT[:4])
        start = cache.lengths[a]
        singles = [tr.forward(torch.tensor([[t]]), cache, [a]).logits[0, 0] for t in NEW]
        cache.truncate(a, start)
        outs = tr.forward_batch([Segment(torch.tensor(NEW), a), Segment(torch.tensor(NEW[:2]), b)], cache)
        for i in range(len(NEW)):
            assert torch.equal(outs[0].logits[0, i], singles[i]), f"row {i} differs (kernel {use_kernel})"
        outputs[use_kernel] = outs[0].logits[0]
    if len(outputs) == 2:
        torch.testing.assert_close(outputs[True], outputs[False], rtol=1e-5, atol=1e-5)


def test_the_kv_cache_holds_float16_but_for_the_fp32_format_and_as_asked(tiny_hf_dir):
    for fmt, cache_type, held in (("fp32", None, torch.float32), ("int8", None, torch.float16),
                                  ("int8", "f32", torch.float32), ("fp32", "f16", torch.float16)):
        m = load_model(str(tiny_hf_dir), fmt, progress=False, cache_type=cache_type)
        assert m.transformer.new_cache(8).k.dtype == held
        assert m.info.kv_cache == str(held).removeprefix("torch.")
    with pytest.raises(ValueError, match="--cache-type q8_0: choose one of f16, f32"):
        load_model(str(tiny_hf_dir), "int8", progress=False, cache_type="q8_0")


def test_a_value_too_large_for_the_float16_cache_is_an_error_not_inf(tmp_path, monkeypatch):
    """A key or value beyond float16's range would be stored as inf and turn attention into NaN: the
    forward refuses it with an error naming --cache-type f32, on step.c's path, the per-op path and torch's
    fallback, and leaves the cache's length as it was. A float32 cache holds the same values."""
    path = make_gguf_model(tmp_path / "m.gguf")
    tr = load_model(str(path), "gguf", progress=False).transformer
    cache = tr.new_cache(64, num_slots=2)
    slot = cache.allocate()
    _prefill(tr, cache, slot, PROMPT)
    for layer in tr.layers:
        layer.attn_norm.mul_(1e5)  # q, k, v far beyond 65504
    with pytest.raises(CacheOverflowError, match="exceed float16's range .* --cache-type f32"):
        tr.forward(torch.tensor([NEW[:2]]), cache, [slot])  # exact rows: step.c where it runs
    assert cache.lengths[slot] == len(PROMPT)
    monkeypatch.setattr(tr, "step_kernel", False)
    with pytest.raises(CacheOverflowError, match="in layer 0"):
        tr.forward(torch.tensor([NEW[:2]]), cache, [slot])  # the per-op path, rows.c's store
    with pytest.raises(CacheOverflowError, match="in layer 0"):
        _prefill(tr, cache, cache.allocate(), PROMPT)  # a prefill
    monkeypatch.setattr(kernels, "rows", lambda: None)
    with pytest.raises(CacheOverflowError, match="in layer 0"):
        tr.forward(torch.tensor([NEW[:2]]), cache, [slot])  # torch's copy into the cache
    monkeypatch.undo()
    tr.kv_dtype = torch.float32
    wide = tr.new_cache(64)
    out = _prefill(tr, wide, wide.allocate(), PROMPT).logits
    assert torch.isfinite(out).all()


def test_store_rows_counts_the_values_a_float16_cache_cannot_hold():
    if kernels.rows() is None:
        pytest.skip(f"rows kernel unavailable: {kernels.why_unavailable('rows')}")
    new = torch.tensor([65504.0, 65519.0, 65520.0, -70000.0, float("inf"), 1.0, -65519.9, 3e38, 0.5])
    new = new.repeat(2).reshape(2, 1, 9)  # 9 values a row: 8 lanes and a tail of 1
    half = torch.zeros(1, 1, 4, 9, dtype=torch.float16)
    assert kernels.store_rows(new, half, 0, 1) == 8
    assert half[0, 0, 1:3].isinf().sum() == 8 and half[0, 0, 1, 0] == 65504
    assert kernels.store_rows(new, torch.zeros(1, 1, 4, 9), 0, 0) == 0
