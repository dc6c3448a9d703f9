"""rows.c (model/kernels): RMS norm and the rotary embedding of a forward's rows, and when layers.py uses them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specdec.model import kernels, layers
from specdec.model.layers import apply_rope, rms_norm

pytestmark = pytest.mark.skipif(kernels.rows() is None, reason=f"rows kernel unavailable: {kernels.why_unavailable('rows')}")


def torch_rope(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@pytest.mark.parametrize("heads, hd", [(14, 64), (3, 80), (2, 256)])
def test_rope_is_bitwise_torchs(heads, hd):
    g = torch.Generator().manual_seed(hd)
    x = torch.randn(5, heads, hd, generator=g) * 4
    cos, sin = torch.randn(5, 1, hd, generator=g), torch.randn(5, 1, hd, generator=g)
    assert torch.equal(kernels.rope(x, cos, sin), torch_rope(x, cos, sin))
    strided = torch.randn(5, heads + 2, hd, generator=g)[:, :heads]  # q heads sliced out of a fused qkv
    assert torch.equal(kernels.rope(strided, cos, sin), torch_rope(strided, cos, sin))


@pytest.mark.parametrize("n", [576, 100, 7])  # whole lanes of 8, and tails
def test_rms_norm_computes_transformers_math_row_by_row(n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(9, n, generator=g) * torch.logspace(-3, 3, 9)[:, None]
    w = torch.randn(n, generator=g)
    y = kernels.rms_norm_rows(x, w, 1e-6)
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    assert ((y.double() - ref).abs() <= 1e-6 * ref.abs() + 1e-30).all()
    alone = torch.cat([kernels.rms_norm_rows(x[i : i + 1], w, 1e-6) for i in range(9)])
    assert torch.equal(y, alone)
    assert torch.allclose(kernels.rms_norm_rows(x, None, 1e-6), F.rms_norm(x, (n,), None, 1e-6), rtol=1e-6, atol=0)


def test_layers_use_the_kernel_for_runtime_tensors_and_torch_for_trainable_ones(monkeypatch):
    used = []
    real_norm, real_rope = kernels.rms_norm_rows, kernels.rope
    monkeypatch.setattr(kernels, "rms_norm_rows", lambda *a: used.append("norm") or real_norm(*a))
    monkeypatch.setattr(kernels, "rope", lambda *a: used.append("rope") or real_rope(*a))
    x, w = torch.randn(3, 64), torch.randn(64)
    rms_norm(x, w, 1e-5)
    apply_rope(torch.randn(3, 4, 16), torch.randn(3, 1, 16), torch.randn(3, 1, 16))
    assert used == ["norm", "rope"]
    used.clear()
    weight = torch.nn.Parameter(torch.randn(64))
    with torch.no_grad():  # a trainable module computes one way, under no_grad too
        rms_norm(x, weight, 1e-5)
    y = rms_norm(x, weight, 1e-5)
    y.sum().backward()
    assert used == [] and weight.grad is not None
    assert torch.equal(rms_norm(x.double(), w.double(), 1e-5), F.rms_norm(x.double(), (64,), w.double(), 1e-5))
    assert used == []  # float64: torch


def test_without_the_kernel_the_layers_compute_with_torch(monkeypatch):
    x, w = torch.randn(3, 64), torch.randn(64)
    cos, sin, q = torch.randn(3, 1, 16), torch.randn(3, 1, 16), torch.randn(3, 4, 16)
    with_kernel = rms_norm(x, w, 1e-5), apply_rope(q, cos, sin)
    monkeypatch.setattr(kernels, "rows", lambda: None)
    assert not layers._row_kernel(x, w)
    assert torch.allclose(rms_norm(x, w, 1e-5), with_kernel[0], rtol=1e-6, atol=1e-7)
    assert torch.equal(apply_rope(q, cos, sin), with_kernel[1])


def test_store_rows_writes_what_the_strided_copy_writes():
    g = torch.Generator().manual_seed(5)
    layer = torch.randn(3, 2, 40, 16, generator=g)
    new = torch.randn(7, 2, 16, generator=g)
    want = layer.clone()
    want[1, :, 30:37] = new.transpose(0, 1)
    kernels.store_rows(new, layer, 1, 30)
    assert torch.equal(layer, want)


@pytest.mark.parametrize("hd", [16, 12])  # 12: a tail past the last 8 values
def test_store_rows_into_a_float16_cache_rounds_as_torch_does(hd):
    g = torch.Generator().manual_seed(6)
    layer = torch.randn(3, 2, 40, hd, generator=g).half()
    new = torch.randn(7, 2, hd, generator=g) * 1000
    new[0, 0, :4] = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 70000.0, 2**-26])  # ties to even, overflow, subnormal
    want = layer.clone()
    want[1, :, 30:37] = new.transpose(0, 1).half()
    kernels.store_rows(new, layer, 1, 30)
    assert torch.equal(layer, want)


def test_store_rows_refuses_a_cache_dtype_the_kernels_do_not_take():
    with pytest.raises(ValueError, match="float32 or float16"):
        kernels.store_rows(torch.zeros(1, 2, 16), torch.zeros(3, 2, 40, 16, dtype=torch.bfloat16), 0, 0)
