"""A Gemma 4 text model (dense) from llama.cpp's GGUF conversion (architecture gemma4): its tensor names -> the
Hugging Face names model/gemma4_checkpoint.py builds from, and its metadata -> the config.json fields
gemma4_config reads, so the one builder serves both.

What the converter writes, as llama.cpp's gemma4 model reads it back:
    gemma4.attention.sliding_window_pattern   per layer: sliding (true) or global
    gemma4.attention.head_count_kv            per layer (sliding layers' kv heads, global layers' kv heads)
    gemma4.feed_forward_length                per layer, or one number (double-wide MLP: the KV-sharing layers' 2x)
    gemma4.attention.key_length[_swa]         the global / sliding layers' head widths
    gemma4.rope.freq_base[_swa]               the global / sliding layers' RoPE bases
    gemma4.attention.shared_kv_layers         the last layers that read an earlier layer's keys and values
    gemma4.embedding_length_per_layer_input   per-layer input width (0: none)
    rope_freqs.weight                         the global layers' frequency divisors per pair: the proportional
                                              RoPE's rotated pairs at its factor, the others at 1e30 (not turned)
    values = keys                             not a key: a global layer that owns its keys has no attn_v tensor
Norm weights are stored as they are (Gemma 4's norms compute x * w; the converter adds no 1).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from gguf.quants import dequantize

from specdec.model.config import ModelConfig
from specdec.model.errors import ModelFileError
from specdec.model.gemma4_checkpoint import gemma4_config

ARCH = "gemma4"
# blk.N.<these> -> model.layers.N.<HF name>
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "layer_output_scale.weight": "layer_scalar",
    "inp_gate.weight": "per_layer_input_gate.weight",
    "proj.weight": "per_layer_projection.weight",
    "post_norm.weight": "post_per_layer_input_norm.weight",
}
GLOBAL_NAMES = {
    "per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
    "per_layer_model_proj.weight": "model.per_layer_model_projection.weight",
    "per_layer_proj_norm.weight": "model.per_layer_projection_norm.weight",
}
_UNTURNED = 1e29  # a divisor at least this large leaves its pair unturned (the converter writes 1e30)


def gemma4_gguf_config(path, meta: dict, tensors: dict, rope_freqs=None) -> ModelConfig:
    """ModelConfig of a gemma4 GGUF file: its metadata as the config.json fields gemma4_config reads, then the
    global layers' RoPE from rope_freqs.weight. tensors: HF name -> the file's tensor."""
    def key(name, default=None):
        value = meta.get(f"{ARCH}.{name}", default)
        if value is None:
            raise ModelFileError(path, f"metadata key {ARCH}.{name} is missing")
        return value

    if meta.get(f"{ARCH}.expert_count"):
        raise ModelFileError(path, "Gemma 4 with mixture-of-experts blocks (26B-A4B) is not run by specdec yet; the "
                             "dense Gemma 4 models are")
    layers = _whole(path, "block_count", key("block_count"))
    swa = key("attention.sliding_window_pattern")
    if not isinstance(swa, list) or len(swa) != layers:
        raise ModelFileError(path, f"{ARCH}.attention.sliding_window_pattern must say for each of the {layers} "
                             f"layers whether it is sliding, got {swa!r}")
    kinds = ["sliding_attention" if s else "full_attention" for s in swa]
    first_global = kinds.index("full_attention") if "full_attention" in kinds else layers - 1
    kv = _per_layer(path, "attention.head_count_kv", key("attention.head_count_kv"), layers)
    ff = _per_layer(path, "feed_forward_length", key("feed_forward_length"), layers)
    shared = int(meta.get(f"{ARCH}.attention.shared_kv_layers") or 0)
    first_shared = layers - shared
    double = any(ff[i] != ff[0] for i in range(layers))
    if any(f != ff[0] * (2 if double and i >= first_shared else 1) for i, f in enumerate(ff)):
        raise ModelFileError(path, f"{ARCH}.feed_forward_length {ff}: specdec runs one MLP width, or twice it on the "
                             "KV-sharing layers (use_double_wide_mlp)")
    global_dim = _whole(path, "attention.key_length", key("attention.key_length"))
    swa_dim = _whole(path, "attention.key_length_swa", key("attention.key_length_swa"))
    if int(meta.get(f"{ARCH}.rope.dimension_count_swa") or swa_dim) != swa_dim:
        raise ModelFileError(path, f"{ARCH}.rope.dimension_count_swa is not the sliding head width {swa_dim}: "
                             "specdec turns the sliding layers' whole heads")
    embed_ple = tensors.get(GLOBAL_NAMES["per_layer_token_embd.weight"])
    g_owner = next((i for i in range(first_shared) if kinds[i] == "full_attention"), None)
    raw = {
        "num_hidden_layers": layers, "layer_types": kinds, "hidden_size": key("embedding_length"),
        "num_attention_heads": key("attention.head_count"), "head_dim": swa_dim,
        "num_key_value_heads": kv[kinds.index("sliding_attention")] if "sliding_attention" in kinds else kv[0],
        "per_layer_config": {str(first_global): {"head_dim": global_dim, "num_key_value_heads": kv[first_global]}},
        "attention_k_eq_v": g_owner is not None and f"model.layers.{g_owner}.self_attn.v_proj.weight" not in tensors,
        "intermediate_size": ff[0], "use_double_wide_mlp": double, "num_kv_shared_layers": shared,
        "hidden_size_per_layer_input": int(meta.get(f"{ARCH}.embedding_length_per_layer_input") or 0),
        "vocab_size_per_layer_input": int(embed_ple.shape[-1]) if embed_ple is not None else 0,
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": float(key("rope.freq_base"))},
                            "sliding_attention": {"rope_type": "default",
                                                  "rope_theta": float(meta.get(f"{ARCH}.rope.freq_base_swa") or 1e4)}},
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "max_position_embeddings": int(meta.get(f"{ARCH}.context_length") or 131_072),
        "sliding_window": meta.get(f"{ARCH}.attention.sliding_window"),
        "final_logit_softcapping": meta.get(f"{ARCH}.final_logit_softcapping"),
    }
    embed = tensors.get("model.embed_tokens.weight")
    if embed is None:
        raise ModelFileError(path, "tensor token_embd.weight is missing")
    raw["vocab_size"] = int(embed.shape[-1])
    for i, kind in enumerate(kinds):  # each kind's kv heads are one number
        if kv[i] != kv[kinds.index(kind)]:
            raise ModelFileError(path, f"{ARCH}.attention.head_count_kv {kv}: the {kind} layers' kv heads differ")
    c = gemma4_config(path, raw, tied="lm_head.weight" not in tensors)
    pairs = global_dim // 2
    if rope_freqs is None:
        if int(meta.get(f"{ARCH}.rope.dimension_count") or global_dim) != global_dim:
            raise ModelFileError(path, f"{ARCH}.rope.dimension_count is not the global head width {global_dim} and "
                                 "the file has no rope_freqs.weight")
        return dataclasses.replace(c, gemma4=dataclasses.replace(c.gemma4, rotated_pairs=pairs, rope_factor=1.0))
    divisors = np.asarray(dequantize(rope_freqs.data, rope_freqs.tensor_type), dtype=np.float64).reshape(-1)
    turned = int((divisors < _UNTURNED).sum())
    if len(divisors) != pairs or not (divisors[turned:] >= _UNTURNED).all() or \
            (turned and not (divisors[:turned] == divisors[0]).all()) or (turned and not divisors[0] > 0):
        raise ModelFileError(path, f"rope_freqs.weight {divisors.tolist()}: specdec reads Gemma 4's proportional "
                             f"RoPE, {pairs} divisors: one factor for the first pairs, then 1e30 for the unturned")
    factor = float(divisors[0]) if turned else 1.0
    return dataclasses.replace(c, gemma4=dataclasses.replace(c.gemma4, rotated_pairs=turned, rope_factor=factor))


def _whole(path, name: str, value) -> int:
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        raise ModelFileError(path, f"{ARCH}.{name} is {value!r}; a whole number of at least 1 is expected")
    return value


def _per_layer(path, name: str, value, layers: int) -> list[int]:
    """A per-layer metadata array (or one number for every layer) as `layers` whole numbers."""
    values = value if isinstance(value, list) else [value] * layers
    if len(values) != layers:
        raise ModelFileError(path, f"{ARCH}.{name} has {len(values)} values for {layers} layers")
    return [_whole(path, name, v) for v in values]
