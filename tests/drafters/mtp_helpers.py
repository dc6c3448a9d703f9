"""Synthetic MTP weights in the layouts real checkpoints use, for the loader tests."""

from __future__ import annotations

import torch


def mtp_block(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """One dense decoder block's tensors (HF names, relative) plus the MTP stem, DeepSeek names."""
    g = torch.Generator().manual_seed(seed)
    h, i, hd = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def w(*shape, scale=0.1):
        return torch.randn(*shape, generator=g) * scale

    out = {
        "self_attn.q_proj.weight": w(q, h), "self_attn.k_proj.weight": w(kv, h), "self_attn.v_proj.weight": w(kv, h),
        "self_attn.o_proj.weight": w(h, q), "mlp.gate_proj.weight": w(i, h), "mlp.up_proj.weight": w(i, h),
        "mlp.down_proj.weight": w(h, i), "input_layernorm.weight": 1 + w(h), "post_attention_layernorm.weight": 1 + w(h),
        "enorm.weight": 1 + w(h), "hnorm.weight": 1 + w(h), "eh_proj.weight": w(h, 2 * h, scale=0.15),
        "shared_head.norm.weight": 1 + w(h),
    }
    if cfg["model_type"] == "qwen2":
        out.update({"self_attn.q_proj.bias": w(q), "self_attn.k_proj.bias": w(kv), "self_attn.v_proj.bias": w(kv)})
    if cfg["model_type"] == "qwen3":
        out.update({"self_attn.q_norm.weight": 1 + w(hd), "self_attn.k_norm.weight": 1 + w(hd)})
    return out


STEM = ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")


def deepseek_layout(blocks: list[dict], num_layers: int) -> dict:
    return {f"model.layers.{num_layers + k}.{n}": t for k, b in enumerate(blocks) for n, t in b.items()}


def mimo_layout(blocks: list[dict]) -> dict:
    out = {}
    rename = {"enorm.weight": "token_layernorm.weight", "hnorm.weight": "hidden_layernorm.weight",
              "shared_head.norm.weight": "final_layernorm.weight"}
    for k, b in enumerate(blocks):
        p = f"model.mtp_layers.{k}."
        for n, t in b.items():
            if n == "eh_proj.weight":  # MiMo concatenates [hidden; embedding]: swap the column halves
                h = t.shape[0]
                out[p + "input_proj.weight"] = torch.cat([t[:, h:], t[:, :h]], dim=1)
            else:
                out[p + rename.get(n, n)] = t
    return out


def qwen3next_layout(blocks: list[dict]) -> dict:
    b = blocks[0]  # norms and fc are shared by the layers
    out = {"mtp.pre_fc_norm_embedding.weight": b["enorm.weight"], "mtp.pre_fc_norm_hidden.weight": b["hnorm.weight"],
           "mtp.fc.weight": b["eh_proj.weight"], "mtp.norm.weight": b["shared_head.norm.weight"]}
    for k, blk in enumerate(blocks):
        out.update({f"mtp.layers.{k}.{n}": t for n, t in blk.items() if n not in STEM})
    return out
