"""Qwen3.5 / Qwen3.6's full-attention decoder layer (gated attention), the one its hybrid stack and its MTP
block both run:

    h        = rms_norm(x, input_layernorm)                       or an input the caller built (MTP)
    q|gate   = q_proj(h)                                          per head: hd query values, then hd gate values
    q, k     = rms_norm(q, q_norm), rms_norm(k_proj(h), k_norm)   per head; v = v_proj(h)
    q, k     = RoPE on the first rope dims of each head (partial rotary; Qwen3.5: a quarter), the rest as is
    x        = x + o_proj(attend(q, k, v) * sigmoid(gate))
    x        = x + down(silu(gate_proj) * up_proj)(rms_norm(x, post_attention_layernorm))

Norm weights are multipliers (Qwen3.5's checkpoints store w for 1 + w; the loaders add the 1, as llama.cpp's
converter does). The MLP and the norms are model/layers.py's, in decoder_layer's order; the op order here is
what the exactness argument rests on (a k-token forward is bitwise k one-token forwards).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from specdec.model.kernels.deltanet import deltanet, sigmoid_mul
from specdec.model.layers import Attend, Projections, RMSNorm, apply_rope, mlp_act, rms_norm


def gate_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate), elementwise: deltanet.c for the runtime's tensors (float32, CPU, no grad), else torch."""
    if deltanet() is not None and all(t.dtype == torch.float32 and t.device.type == "cpu" and not t.requires_grad
                                      for t in (x, gate)):
        return sigmoid_mul(x, gate)
    return x * torch.sigmoid(gate)


def partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, heads, hd) with its first cos.shape[-1] dims of each head rotated (cos, sin: (N, 1, rot))."""
    rot = cos.shape[-1]
    if rot == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return torch.cat([apply_rope(x[..., :rot].contiguous(), cos, sin), x[..., rot:]], dim=-1)


class GatedWeights(Protocol):
    """A gated-attention layer's weights as gated_decoder_layer uses them (cf. layers.LayerWeights)."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    act: str
    attn_norm: torch.Tensor | None  # (H,); None: the caller passes the normed attention input
    mlp_norm: torch.Tensor  # (H,)
    q_norm: torch.Tensor  # (hd,)
    k_norm: torch.Tensor  # (hd,)

    def qkv(self, h: torch.Tensor) -> torch.Tensor:
        """(N, H) -> (N, (2 * heads + 2 * kv_heads) * hd): q and gate interleaved per head, then k, then v."""

    def o(self, attn: torch.Tensor) -> torch.Tensor:
        """(N, heads * hd) -> (N, H)."""

    def gate_up(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, H) -> gate, up: (N, I) each."""

    def down(self, a: torch.Tensor) -> torch.Tensor:
        """(N, I) -> (N, H)."""


def gated_attention(h: torch.Tensor, w: GatedWeights, attend: Attend, cos: torch.Tensor,
                    sin: torch.Tensor) -> torch.Tensor:
    """The gated attention's output rows (N, H) for normed input rows h (N, H)."""
    N = h.shape[0]
    nh, nkv, hd = w.heads, w.kv_heads, w.head_dim
    qkv = w.qkv(h)
    qg = qkv[:, : 2 * nh * hd].reshape(N, nh, 2 * hd)
    k = qkv[:, 2 * nh * hd : (2 * nh + nkv) * hd].reshape(N, nkv, hd)
    v = qkv[:, (2 * nh + nkv) * hd :].reshape(N, nkv, hd)
    qk = torch.cat([rms_norm(qg[..., :hd], w.q_norm, w.eps), rms_norm(k, w.k_norm, w.eps)], dim=1)  # (N, nh+nkv, hd)
    qk = partial_rope(qk, cos, sin)
    attn = attend(qk[:, :nh], qk[:, nh:], v).reshape(N, nh * hd)
    return w.o(gate_mul(attn, qg[..., hd:].reshape(N, nh * hd)))


def mlp_block(x: torch.Tensor, w) -> torch.Tensor:
    """x + down(silu(gate) * up)(rms_norm(x, mlp_norm)): the second half of every Qwen3.5 layer; Qwen3.5-MoE's
    x + moe(rms_norm(x, mlp_norm)) where w has a moe ((N, H) normed rows -> (N, H), model/moe.py)."""
    h = rms_norm(x, w.mlp_norm, w.eps)
    moe = getattr(w, "moe", None)
    if moe is not None:
        return x + moe(h)
    gate, up = w.gate_up(h)
    return x + w.down(mlp_act(gate, up, w.act, w.mlp_norm))


def gated_decoder_layer(x: torch.Tensor, w: GatedWeights, attend: Attend, cos: torch.Tensor, sin: torch.Tensor,
                        attn_in: torch.Tensor | None = None) -> torch.Tensor:
    """One gated-attention layer: x (N, H) residual rows -> (N, H); attn_in as in layers.decoder_layer."""
    h = rms_norm(x, w.attn_norm, w.eps) if attn_in is None else attn_in
    return mlp_block(x + gated_attention(h, w, attend, cos, sin), w)


class GatedDecoderLayer(Projections, nn.Module):
    """gated_decoder_layer's weights as nn modules named as transformers names them (self_attn.q_proj of
    2 * heads * hd rows, self_attn.q_norm, mlp.gate_proj, post_attention_layernorm, ...): Qwen3.5's MTP block.
    input_norm=False: the owner keeps input_layernorm and passes the normed input (as layers.DecoderLayer)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float,
                 input_norm: bool = True):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.eps, self.act = heads, kv_heads, head_dim, eps, "silu"
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(hidden, 2 * heads * head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.self_attn.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.self_attn.q_norm = RMSNorm(head_dim, eps)
        self.self_attn.k_norm = RMSNorm(head_dim, eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.mlp.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.mlp.down_proj = nn.Linear(intermediate, hidden, bias=False)
        if input_norm:
            self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    @property
    def attn_norm(self) -> torch.Tensor | None:
        return self.input_layernorm.weight if hasattr(self, "input_layernorm") else None

    @property
    def mlp_norm(self) -> torch.Tensor:
        return self.post_attention_layernorm.weight

    @property
    def q_norm(self) -> torch.Tensor:
        return self.self_attn.q_norm.weight

    @property
    def k_norm(self) -> torch.Tensor:
        return self.self_attn.k_norm.weight

    def forward(self, x: torch.Tensor, attend: Attend, cos: torch.Tensor, sin: torch.Tensor,
                attn_in: torch.Tensor | None = None) -> torch.Tensor:
        """x: (N, H) -> (N, H); see gated_decoder_layer."""
        return gated_decoder_layer(x, self, attend, cos, sin, attn_in)
