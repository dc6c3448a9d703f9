"""GGUF tensor names -> the Hugging Face names (model.layers.0.self_attn.q_proj.weight, ...), so that one
model builder serves GGUF files and HF folders alike."""

from __future__ import annotations

import re

from specdec.model.gemma4_gguf import GLOBAL_NAMES as GEMMA4_GLOBAL_NAMES
from specdec.model.gemma4_gguf import LAYER_NAMES as GEMMA4_LAYER_NAMES
from specdec.model.qwen3next_checkpoint import GGUF_NAMES as QWEN3NEXT_GGUF_NAMES
from specdec.model.qwen35_checkpoint import GGUF_NAMES as QWEN35_GGUF_NAMES

_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    # mixture-of-experts layers (llama.cpp's qwen3moe, glm4moe): the router, its selection bias, the routed
    # experts stacked into one (E, rows, cols) tensor each, the shared expert and its gate
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "exp_probs_b.bias": "mlp.gate.e_score_correction_bias",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj.weight",
    "ffn_gate_shexp.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn_up_shexp.weight": "mlp.shared_experts.up_proj.weight",
    "ffn_down_shexp.weight": "mlp.shared_experts.down_proj.weight",
    "ffn_gate_inp_shexp.weight": "mlp.shared_expert_gate.weight",
}
# GLM-4.5 (glm4moe): the norm before the MLP is llama.cpp's post_attention_norm
_GLM4MOE_NAMES = {**_LAYER_NAMES, "post_attention_norm.weight": "post_attention_layernorm.weight"}
# Qwen3.5 (qwen35): the norm before the MLP is post_attention_norm; the linear layers' tensors
_QWEN35_NAMES = {**_LAYER_NAMES, **QWEN35_GGUF_NAMES}
_QWEN3NEXT_NAMES = {**_QWEN35_NAMES, **QWEN3NEXT_GGUF_NAMES}  # Qwen3-Next: beta|alpha fused (ssm_ba)
# Gemma 3's four norms per block: llama.cpp's ffn_norm is the one before the MLP (HF pre_feedforward_layernorm);
# HF's post_attention_layernorm norms the attention output. llama.cpp's converter stored 1 + w for every norm.
_GEMMA3_NAMES = {
    **_LAYER_NAMES,
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# MTP ("nextn") tensors of the extra blocks after the main ones, renamed to DeepSeek-V3's HF names
# (model.layers.{N+k}.eh_proj.weight, ...); the extra blocks' attention/MLP use _LAYER_NAMES.
_NEXTN_NAMES = {
    "nextn.eh_proj.weight": "eh_proj.weight",
    "nextn.enorm.weight": "enorm.weight",
    "nextn.hnorm.weight": "hnorm.weight",
    "nextn.shared_head_norm.weight": "shared_head.norm.weight",
    "nextn.shared_head_head.weight": "shared_head.head.weight",
    "nextn.embed_tokens.weight": "embed_tokens.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a GGUF tensor (blk.0.attn_q.weight -> model.layers.0.self_attn.q_proj.weight);
    None for one the model builder does not read (rope_freqs.weight, ...)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    if arch == "gemma4" and gguf_name in GEMMA4_GLOBAL_NAMES:  # Gemma 4's per-layer inputs: model/gemma4_gguf.py
        return GEMMA4_GLOBAL_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    layer_names = {"gemma3": _GEMMA3_NAMES, "gemma4": GEMMA4_LAYER_NAMES, "glm4moe": _GLM4MOE_NAMES,
                   "qwen35": _QWEN35_NAMES, "qwen35moe": _QWEN35_NAMES,
                   "qwen3next": _QWEN3NEXT_NAMES}.get(arch, _LAYER_NAMES)
    if m and m.group(2) in layer_names:
        return f"model.layers.{m.group(1)}.{layer_names[m.group(2)]}"
    if m and m.group(2) in _NEXTN_NAMES:
        return f"model.layers.{m.group(1)}.{_NEXTN_NAMES[m.group(2)]}"
    return None
