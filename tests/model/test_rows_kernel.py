"""rows.c (model/kernels): RMS norm, the rotary embedding and the MLP's activation of a forward's rows, and when
layers.py uses them."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from specdec.model import kernels, layers
from specdec.model.layers import apply_rope, mlp_act, rms_norm

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


def exact_act(gate, act):
    """act(gate) in float64 (torch's float64 sigmoid: well under float32's ulp). GELU's tanh form as
    g * sigmoid(2y), the same number as 0.5 g (1 + tanh(y)) without 1 + tanh's cancellation for g < 0."""
    g = gate.double()
    if act == "silu":
        return g * torch.sigmoid(g)
    return g * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (g + 0.044715 * g**3))


def ulps(y, ref):
    """|y - ref| per value in units of float32's spacing at ref (at least the smallest normal's)."""
    spacing = torch.maximum(ref.float().abs(), torch.tensor(2.0**-126)).double() * 2.0**-23
    return (y.double() - ref).abs() / spacing


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_the_activation_is_within_a_few_ulps_of_the_exact_value(act):
    g = torch.Generator().manual_seed(3)
    gate = torch.cat([torch.randn(4000, generator=g) * s for s in (0.01, 1, 8, 40)]).reshape(4, 4000)
    up = torch.ones_like(gate)  # act(gate) alone, then a product with u: one rounding more
    a, ref = kernels.act_mul(gate, up, act), exact_act(gate, act)
    tiny = ref.abs() < 3e-37  # from g ~ -88.7 down exp(-z) overflows, and act(g) = g / inf is -0, as torch's
    # GELU's z = 2y is computed in float32 before exp(-z), which scales its error by |z| (torch's tanh form
    # loses all of a negative g's bits to 1 + tanh's cancellation instead); SiLU's z is g itself
    z = gate.double() if act == "silu" else 2 * math.sqrt(2 / math.pi) * (gate.double() + 0.044715 * gate.double()**3)
    bound = 3 + (0 if act == "silu" else 2 * z.abs())  # z takes 5 roundings: ~1.3 |z| ulps measured
    assert (ulps(a, ref) <= bound)[~tiny].all() and tiny.any()
    assert (a[tiny].abs() < 3e-37).all() and a[tiny].signbit().all()
    u = torch.randn(gate.shape, generator=g)
    assert torch.equal(kernels.act_mul(gate, u, act), a * u)  # act(gate) rounded, then times up
    theirs = F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")  # torch's: |g| 6e-8 off at worst
    assert ((a - theirs).abs() <= 1e-6 * a.abs() + 1e-7 * gate.abs()).all()


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_the_activation_takes_the_ends_of_the_float_range(act):
    inf, nan = float("inf"), float("nan")
    gate = torch.tensor([[1e-30, -1e-30, 88.0, -88.0, 89.5, 100.0, 104.5, 3e38, 0.0, -0.0, -89.5, -104.5, -3e38, inf,
                          -inf, nan]])
    a = kernels.act_mul(gate, torch.ones_like(gate), act)
    assert (ulps(a[0, :8], exact_act(gate[0, :8], act)) <= 3).all()  # large g: g itself (exp(-z) underflows)
    assert torch.equal(a[0, 8:13], torch.tensor([0.0, -0.0, -0.0, -0.0, -0.0]))  # exp(-z) overflows: -0, as torch's
    assert torch.equal(a[0, 8:13].signbit(), gate[0, 8:13].signbit())
    assert a[0, 13] == inf and a[0, 14:].isnan().all()  # -inf / inf: NaN, as torch's
    theirs = F.silu(gate) if act == "silu" else F.gelu(gate, approximate="tanh")
    assert torch.equal(theirs[0, 8:].isnan(), a[0, 8:].isnan())


@pytest.mark.parametrize("I", [1536, 13, 8, 3])  # whole lanes of 8, and tails
def test_an_activation_value_does_not_depend_on_where_it_sits(I):
    g = torch.Generator().manual_seed(I)
    gate_up = torch.randn(5, 2 * I, generator=g) * 6
    gate, up = gate_up.chunk(2, dim=-1)  # two halves of one row, as the runtime passes them
    a = kernels.act_mul(gate, up, "silu")
    assert torch.equal(a, kernels.act_mul(gate.contiguous(), up.contiguous(), "silu"))
    assert torch.equal(a, torch.cat([kernels.act_mul(gate[i : i + 1], up[i : i + 1], "silu") for i in range(5)]))
    one = torch.stack([kernels.act_mul(gate[:, j : j + 1], up[:, j : j + 1], "silu")[:, 0] for j in range(I)], 1)
    assert torch.equal(a, one)  # each value alone, in a padded tail
    with pytest.raises(ValueError, match="unknown MLP activation 'relu'"):
        kernels.act_mul(gate, up, "relu")


def test_layers_use_the_kernel_for_runtime_tensors_and_torch_for_trainable_ones(monkeypatch):
    used = []
    real_norm, real_rope = kernels.rms_norm_rows, kernels.rope
    monkeypatch.setattr(kernels, "rms_norm_rows", lambda *a: used.append("norm") or real_norm(*a))
    monkeypatch.setattr(kernels, "rope", lambda *a: used.append("rope") or real_rope(*a))
    real_act = kernels.act_mul
    monkeypatch.setattr(kernels, "act_mul", lambda *a: used.append("act") or real_act(*a))
    x, w = torch.randn(3, 64), torch.randn(64)
    rms_norm(x, w, 1e-5)
    apply_rope(torch.randn(3, 4, 16), torch.randn(3, 1, 16), torch.randn(3, 1, 16))
    mlp_act(x, x, "silu", w)
    assert used == ["norm", "rope", "act"]
    used.clear()
    weight = torch.nn.Parameter(torch.randn(64))
    with torch.no_grad():  # a trainable module computes one way, under no_grad too
        rms_norm(x, weight, 1e-5)
        assert torch.equal(mlp_act(x, x, "gelu_tanh", weight), F.gelu(x, approximate="tanh") * x)
    y = rms_norm(x, weight, 1e-5)
    y.sum().backward()
    assert used == [] and weight.grad is not None
    assert torch.equal(rms_norm(x.double(), w.double(), 1e-5), F.rms_norm(x.double(), (64,), w.double(), 1e-5))
    assert used == []  # float64: torch


def test_without_the_kernel_the_layers_compute_with_torch(monkeypatch):
    x, w = torch.randn(3, 64), torch.randn(64)
    cos, sin, q = torch.randn(3, 1, 16), torch.randn(3, 1, 16), torch.randn(3, 4, 16)
    with_kernel = rms_norm(x, w, 1e-5), apply_rope(q, cos, sin), mlp_act(x, x, "silu", w)
    monkeypatch.setattr(kernels, "rows", lambda: None)
    assert not layers._row_kernel(x, w)
    assert torch.allclose(rms_norm(x, w, 1e-5), with_kernel[0], rtol=1e-6, atol=1e-7)
    assert torch.equal(mlp_act(x, x, "silu", w), F.silu(x) * x)
    assert torch.allclose(with_kernel[2], F.silu(x) * x, rtol=1e-6, atol=1e-30)
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
