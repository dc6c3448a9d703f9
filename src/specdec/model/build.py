"""Turn a checkpoint (GGUF file or HF folder) into a Transformer in a chosen weight format."""

from __future__ import annotations

import torch

from specdec.model.config import ModelConfig
from specdec.model.linear import WEIGHT_FORMATS, QLinear
from specdec.model.transformer import Layer, Transformer


def build_transformer(source, weights_format: str, progress=None) -> Transformer:
    """source: anything with .config (ModelConfig), .names() and .get(name) -> float32 tensor."""
    if weights_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {weights_format!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
    c: ModelConfig = source.config
    names = set(source.names())
    get = source.get

    def opt(name):
        return get(name) if name in names else None

    layers = []
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        qkv_w = torch.cat([get(p + f"self_attn.{n}_proj.weight") for n in "qkv"])
        qkv_b = None
        if c.qkv_bias:
            qkv_b = torch.cat([get(p + f"self_attn.{n}_proj.bias") for n in "qkv"])
        layers.append(Layer(
            qkv=QLinear(qkv_w, qkv_b, weights_format),
            o=QLinear(get(p + "self_attn.o_proj.weight"), None, weights_format),
            gate_up=QLinear(torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]), None,
                            weights_format),
            down=QLinear(get(p + "mlp.down_proj.weight"), None, weights_format),
            attn_norm=get(p + "input_layernorm.weight"),
            mlp_norm=get(p + "post_attention_layernorm.weight"),
            q_norm=opt(p + "self_attn.q_norm.weight") if c.qk_norm else None,
            k_norm=opt(p + "self_attn.k_norm.weight") if c.qk_norm else None,
        ))
        if progress is not None:
            progress(1)
    embed = get("model.embed_tokens.weight")
    head = embed if c.tie_embeddings else get("lm_head.weight")
    lm_head = QLinear(head, None, weights_format)
    if weights_format != "fp32":
        embed = embed.to(torch.bfloat16)  # rows are looked up one at a time; half the memory
    return Transformer(c, embed.contiguous(), layers, get("model.norm.weight"), lm_head, weights_format)
