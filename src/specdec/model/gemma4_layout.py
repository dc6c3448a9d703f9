"""What a Gemma 4 text model (dense) adds to ModelConfig (its `gemma4` field), read from config.json by
model/gemma4_checkpoint.py and run by model/gemma4.py.

    global layers    (the non-sliding ones) heads of global_head_dim with global_kv_heads key/value heads, their
                     own RoPE: "proportional", the first rotated_pairs of the head's head_dim / 2 pairs rotating at
                     theta ** (-2i / global_head_dim), the others not at all (ModelConfig: rope_theta)
    sliding layers   ModelConfig's head_dim and num_kv_heads, plain RoPE at rope_local_theta, the window
    values           v_norm(v) per head, an RMS norm without weight; k_eq_v: a global layer has no v_proj and its
                     values are its keys before k_norm and RoPE
    KV sharing       layer i attends over the keys and values of layer kv_source[i] (itself, or the last layer of
                     its kind before the shared ones) and has no k/v projections; double_wide: those layers' MLP is
                     twice intermediate_size wide
    per-layer input  (ple_size > 0) each layer adds gelu(gate(x)) * ple_i projected back, where the ple rows are
                     (rms_norm(proj(embedding) / sqrt(H)) + ple_embed[token] * sqrt(ple_size)) / sqrt(2)
    layer scalar     every layer's output times its own stored scalar
    norms            multipliers w as stored (Gemma 4's RMSNorm computes x * w, not x * (1 + w)); attention scale 1
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gemma4Layout:
    global_head_dim: int
    global_kv_heads: int
    rotated_pairs: int  # pairs of a global head's dimensions that RoPE turns (the rest keep their values)
    kv_source: tuple[int, ...]  # per layer: the layer whose keys and values it attends over (itself: its own)
    k_eq_v: bool = False  # the global layers' values are their keys (no v_proj)
    double_wide: bool = False  # the KV-sharing layers' MLP is 2 * intermediate_size wide
    ple_size: int = 0  # per-layer input width (hidden_size_per_layer_input); 0 = none
    ple_vocab: int = 0  # rows of the per-layer embedding (vocab_size_per_layer_input)
    rope_factor: float = 1.0  # the global layers' frequencies divided by this ("factor" of proportional RoPE)

    def owns_kv(self, layer: int) -> bool:
        return self.kv_source[layer] == layer

    def intermediate(self, layer: int, size: int) -> int:
        """Layer `layer`'s MLP width, for intermediate_size `size`."""
        return 2 * size if self.double_wide and not self.owns_kv(layer) else size

    def global_rope_factors(self) -> tuple[float, ...]:
        """The frequency divisors of a global head's global_head_dim / 2 pairs: rope_factor for the rotated ones,
        infinity (frequency 0: cos 1, sin 0, the values unchanged) for the rest."""
        pairs = self.global_head_dim // 2
        return (self.rope_factor,) * self.rotated_pairs + (float("inf"),) * (pairs - self.rotated_pairs)


def kv_sources(layer_types: list[str], shared: int) -> tuple[int, ...]:
    """Each layer's KV source under num_kv_shared_layers `shared`, as transformers' Gemma4TextConfig computes it:
    the last `shared` layers read the last layer of their own kind before them; the others their own.
    A ValueError where a shared layer's kind has no such layer."""
    first = len(layer_types) - shared
    out = []
    for i, kind in enumerate(layer_types):
        if i < first:
            out.append(i)
            continue
        source = next((j for j in range(first - 1, -1, -1) if layer_types[j] == kind), None)
        if source is None:
            raise ValueError(f"layer {i} ({kind}) shares the keys and values of an earlier {kind} layer, and the "
                             f"first {first} layers have none")
        out.append(source)
    return tuple(out)
