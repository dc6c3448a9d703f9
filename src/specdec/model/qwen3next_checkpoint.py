"""Qwen3-Next checkpoints (config.json model_type qwen3_next, GGUF architecture qwen3next): Qwen3.5-MoE's hybrid
(model/qwen35_checkpoint.py reads both) with the Gated DeltaNet's input projections fused per key head.

What differs from Qwen3.5-MoE, read from transformers 5.24's qwen3_next and qwen3_5_moe modeling files:
  - linear_attn.in_proj_qkvz: per key head g, rows [q_g (dk), k_g (dk), v_g (r * dv), z_g (r * dv)], r = nv / nk;
    linear_attn.in_proj_ba: per key head g, rows [b_g (r), a_g (r)] (Qwen3.5: in_proj_qkv, in_proj_z, in_proj_b,
    in_proj_a). Taken apart (fix_query_key_value_ordering) they are Qwen3.5's rows, value heads in the same
    "grouped" order: here they are read as Qwen3.5's names, each a row selection of the fused tensor.
    llama.cpp's converter splits in_proj_qkvz itself (attn_qkv, attn_gate) and keeps in_proj_ba fused (ssm_ba);
    it does not reorder the value heads of a qwen3next file (it does for qwen35 / qwen35moe)
  - the MLP: a mixture except in mlp_only_layers and where (i + 1) % decoder_sparse_step != 0 (there the dense
    MLP of intermediate_size); norm_topk_prob as the config says; the same gated shared expert
  - the RoPE is the plain one of partial_rotary_factor (Qwen3.5's text positions give the same); config.json
    has no mtp_num_hidden_layers (llama.cpp's converter counts the mtp.layers tensors instead)
The norms (1 + w; the gated norm a plain multiplier), the gated attention and the MTP layer (mtp.*, its MLP a
mixture) are Qwen3.5-MoE's.
"""

from __future__ import annotations

import torch

from specdec.model.hybrid_config import LinearAttention

MODEL_TYPE = "qwen3_next"
ARCH = "qwen3next"
GGUF_NAMES = {"ssm_ba.weight": "linear_attn.in_proj_ba.weight"}  # llama.cpp's fused beta|alpha (after blk.N.)


def fused_rows(names, la: LinearAttention) -> dict[str, tuple[str, torch.Tensor]]:
    """Qwen3.5's names of the Gated DeltaNet input projections -> (the fused tensor holding them, its rows (int64))
    for every linear layer whose checkpoint holds in_proj_qkvz / in_proj_ba."""
    names = set(names)
    nk, dk, dv, r = la.key_heads, la.key_dim, la.value_dim, la.value_heads // la.key_heads
    width = 2 * dk + 2 * r * dv  # one key head's rows of in_proj_qkvz

    def rows(offset: int, size: int, group: int) -> torch.Tensor:  # those rows of every key head's group, in order
        return torch.cat([torch.arange(g * group + offset, g * group + offset + size) for g in range(nk)])

    out = {}
    for i in la.layers:
        a = f"model.layers.{i}.linear_attn."
        if a + "in_proj_qkvz.weight" in names:
            out[a + "in_proj_qkv.weight"] = (a + "in_proj_qkvz.weight", torch.cat(
                [rows(0, dk, width), rows(dk, dk, width), rows(2 * dk, r * dv, width)]))
            out[a + "in_proj_z.weight"] = (a + "in_proj_qkvz.weight", rows(2 * dk + r * dv, r * dv, width))
        if a + "in_proj_ba.weight" in names:
            out[a + "in_proj_b.weight"] = (a + "in_proj_ba.weight", rows(0, r, 2 * r))
            out[a + "in_proj_a.weight"] = (a + "in_proj_ba.weight", rows(r, r, 2 * r))
    return out
