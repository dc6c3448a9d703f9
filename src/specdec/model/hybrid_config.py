"""The linear-attention layers of a hybrid model (ModelConfig.linear_attention): Qwen3.5 / Qwen3.6's Gated
DeltaNet, read from config.json (linear_*) or GGUF metadata (<arch>.ssm.*).

    mixed      = in_proj_qkv(h)                                 (conv_dim,) = q (nk*dk), k (nk*dk), v (nv*dv)
    q, k, v    = silu(causal depthwise conv over the last `conv_kernel` rows of mixed)
    q, k       = l2norm per head; q / sqrt(dk)
    decay      = exp(A * softplus(in_proj_a(h) + dt_bias))      A = -exp(A_log), per value head
    beta       = sigmoid(in_proj_b(h))
    S          = decay * S;  S += k^T (beta * (v - k S));  o = q S      S: (dk, dv) per value head
    out        = out_proj(rms_norm(o, norm) * silu(in_proj_z(h)))  per value head

Value head h reads key head h // (nv / nk) in transformers' order ("grouped"); llama.cpp's converter reorders
the value heads so that it reads h % nk ("tiled"), which its GGUF files keep.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearAttention:
    layers: tuple[int, ...]  # the decoder layers that are Gated DeltaNet (the others: full attention)
    key_heads: int  # nk
    value_heads: int  # nv, a multiple of nk
    key_dim: int  # dk
    value_dim: int  # dv
    conv_kernel: int = 4  # rows the causal convolution reads (this one and conv_kernel - 1 before it)
    tiled: bool = False  # value head h reads key head h % nk (llama.cpp's order), else h // (nv / nk)

    def __post_init__(self) -> None:
        for name in ("key_heads", "value_heads", "key_dim", "value_dim", "conv_kernel"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ValueError(f"linear attention {name} is {value!r}; a whole number of at least 1 is expected")
        if self.value_heads % self.key_heads:
            raise ValueError(f"linear attention has {self.value_heads} value heads for {self.key_heads} key heads; "
                             "a multiple is expected")
        if self.conv_kernel < 2:
            raise ValueError(f"linear attention conv_kernel is {self.conv_kernel}; at least 2 is expected")

    @property
    def conv_dim(self) -> int:
        """Channels of the convolution: q, k and v together."""
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    @property
    def state_numel(self) -> int:
        """Values of one layer's recurrent state, (nv, dk, dv)."""
        return self.value_heads * self.key_dim * self.value_dim

    def key_head(self, value_head: int) -> int:
        """The key head value head `value_head` reads."""
        group = self.value_heads // self.key_heads
        return value_head % self.key_heads if self.tiled else value_head // group
