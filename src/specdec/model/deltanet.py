"""Gated DeltaNet, Qwen3.5 / Qwen3.6's linear attention (model/hybrid_config.py has the math), as the runtime
computes it: one row at a time, always in the recurrent form.

A row reads the state its sequence had after the row before it and writes the state after itself, each at a
place the cache chose (cache/recurrent.py: a ring of states by sequence length, so that a rejected draft is
rolled back by moving a length pointer). Each row is computed alone, in one fixed order (deltanet.c, else the
torch loop below), so a verify of k rows gives bitwise the outputs and states of k one-row decode steps, in a
batch as alone. A prefill runs the same recurrent rows: transformers' chunked form is faster on a GPU but its
rows are not the recurrent ones, and on a CPU the projections dominate a prefill anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specdec.model.hybrid_config import LinearAttention
from specdec.model.kernels.deltanet import deltanet, deltanet_rows
from specdec.model.linear import QLinear


@dataclass
class DeltaNetWeights:
    """One Gated DeltaNet layer as the runtime holds it (la = the model's LinearAttention)."""

    in_proj: QLinear  # in_proj_qkv, in_proj_z, in_proj_b, in_proj_a stacked: (conv_dim + nv*dv + 2*nv, H)
    out_proj: QLinear  # (H, nv * dv)
    conv: torch.Tensor  # (conv_dim, K) float32, the depthwise convolution's taps, oldest row first
    dt_bias: torch.Tensor  # (nv,)
    A: torch.Tensor  # (nv,) = -exp(A_log)
    norm: torch.Tensor  # (dv,) the gated RMS norm's weight (a multiplier as stored: not 1 + w)


def deltanet_mix(la: LinearAttention, w: DeltaNetWeights, proj: torch.Tensor, eps: float, conv: torch.Tensor,
                 ssm: torch.Tensor, rows: list[tuple[int, int, int]]) -> torch.Tensor:
    """The token mixer's output rows before out_proj: (N, nv * dv).

    proj: (N, conv_dim + nv*dv + 2*nv) = in_proj(rms_norm(x)); conv: (slots, D, K-1, conv_dim) and ssm:
    (slots, D, nv, dk, dv), this layer's states in the cache; rows: per row (slot, read, write), the ring
    places of the state before it and after it (row r+1 of a sequence reads what row r wrote).
    """
    cd, vd = la.conv_dim, la.value_heads * la.value_dim
    mixed, z, ba = proj[:, :cd], proj[:, cd : cd + vd], proj[:, cd + vd :]
    sizes = (la.key_heads, la.value_heads, la.key_dim, la.value_dim, la.conv_kernel)
    if deltanet() is not None and conv.dtype == ssm.dtype == torch.float32 and conv.is_contiguous() \
            and ssm.is_contiguous():
        slots = torch.tensor([r[0] for r in rows], dtype=torch.int64)
        read = torch.tensor([r[1] for r in rows], dtype=torch.int64)
        write = torch.tensor([r[2] for r in rows], dtype=torch.int64)
        addresses = []
        for t in (conv, ssm):
            step = t.stride(0) * t.element_size(), t.stride(1) * t.element_size()
            for where in (read, write):
                addresses.append(t.data_ptr() + slots * step[0] + where * step[1])
        conv_in, conv_out, state_in, state_out = addresses
        return deltanet_rows(sizes, la.tiled, eps, mixed, z, ba, w.conv, w.dt_bias, w.A, w.norm, conv_in, conv_out,
                             state_in, state_out)
    return torch.cat([_row_torch(la, w, mixed[i], z[i], ba[i], eps, conv, ssm, *row)
                      for i, row in enumerate(rows)]) if rows else torch.empty(0, vd)


def _row_torch(la: LinearAttention, w: DeltaNetWeights, mixed, z, ba, eps: float, conv, ssm, slot: int, read: int,
               write: int) -> torch.Tensor:
    """deltanet.c's arithmetic for one row in torch (where the library did not build): (1, nv * dv)."""
    nk, nv, dk, dv, K = la.key_heads, la.value_heads, la.key_dim, la.value_dim, la.conv_kernel
    window = conv[slot, read]  # (K - 1, conv_dim)
    acc = torch.zeros_like(mixed)
    for t in range(K - 1):
        acc = acc + w.conv[:, t] * window[t]
    acc = acc + w.conv[:, K - 1] * mixed
    y = acc / (1 + torch.exp(-acc))
    conv[slot, write] = torch.cat([window[1:], mixed[None]])
    q, k = y[: nk * dk].reshape(nk, dk), y[nk * dk : 2 * nk * dk].reshape(nk, dk)
    v = y[2 * nk * dk :].reshape(nv, dv)
    q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * (1.0 / math.sqrt(dk))
    k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    heads = torch.tensor([la.key_head(h) for h in range(nv)])
    q, k = q[heads], k[heads]  # (nv, dk)
    b, a = ba[:nv], ba[nv:]
    decay = torch.exp(w.A * F.softplus(a + w.dt_bias))  # (nv,)
    beta = 1 / (1 + torch.exp(-b))
    S = ssm[slot, read] * decay[:, None, None]  # (nv, dk, dv)
    delta = (v - (S * k[:, :, None]).sum(1)) * beta[:, None]
    S = S + k[:, :, None] * delta[:, None, :]
    ssm[slot, write] = S
    o = (S * q[:, :, None]).sum(1)  # (nv, dv)
    o = o * torch.rsqrt((o * o).mean(-1, keepdim=True) + eps) * w.norm
    zs = z.reshape(nv, dv)
    return (o * (zs / (1 + torch.exp(-zs)))).reshape(1, nv * dv)
