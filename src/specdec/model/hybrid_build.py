"""A Qwen3.5 / Qwen3.6 layer's weights from a checkpoint (GGUF file or HF folder, tensors by their Hugging Face
names), for model/build.py: a Gated DeltaNet layer or a gated full-attention one, each with its MLP (dense, or
Qwen3.5-MoE's mixture)."""

from __future__ import annotations

from specdec.model.config import ModelConfig
from specdec.model.deltanet import DeltaNetWeights
from specdec.model.errors import ModelFileError
from specdec.model.hybrid import HybridLayer
from specdec.model.moe_config import moe_shapes


def hybrid_layer(c: ModelConfig, i: int, get, linear, names, where, moe=None) -> HybridLayer:
    """Layer i. get(name, shape) -> float32 tensor checked against shape; linear(names, (out, in)) -> QLinear of
    those matrices stacked; names: the checkpoint's tensor names; where: the file, for errors; moe(prefix, norm)
    -> the MoE of a mixture layer (model/moe.build_moe), for a config with one."""
    la, H, hd = c.linear_attention, c.hidden_size, c.head_dim
    p = f"model.layers.{i}."
    mlp = dict(attn_norm=get(p + "input_layernorm.weight", (H,)),
               mlp_norm=get(p + "post_attention_layernorm.weight", (H,)))
    if c.moe is not None and c.moe.is_moe(i):
        mlp.update(gate_up=None, down=None, moe=moe(p, mlp["mlp_norm"]))
    else:
        mlp.update(gate_up=linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], (2 * c.intermediate_size, H)),
                   down=linear([p + "mlp.down_proj.weight"], (H, c.intermediate_size)))
    if i not in la.layers:
        a = p + "self_attn."
        return HybridLayer(**mlp, qkv=linear([a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"],
                                             (2 * c.q_size + 2 * c.kv_size, H)),
                           o=linear([a + "o_proj.weight"], (H, c.q_size)),
                           q_norm=get(a + "q_norm.weight", (hd,)), k_norm=get(a + "k_norm.weight", (hd,)))
    a = p + "linear_attn."
    nv, vd, K = la.value_heads, la.value_heads * la.value_dim, la.conv_kernel
    conv = get(a + "conv1d.weight")  # (conv_dim, 1, K) in a folder, (conv_dim, K) in a GGUF file
    if tuple(conv.shape) not in ((la.conv_dim, 1, K), (la.conv_dim, K)):
        raise ModelFileError(where, f"tensor {a}conv1d.weight has shape {tuple(conv.shape)}; the config implies "
                             f"{la.conv_dim} channels of {K} taps")
    if a + "A" in names:  # llama.cpp's ssm_a: -exp(A_log) already
        A = get(a + "A", (nv,))
    else:
        A = -get(a + "A_log", (nv,)).float().exp()  # as transformers computes it
    return HybridLayer(**mlp, deltanet=DeltaNetWeights(
        in_proj=linear([a + "in_proj_qkv.weight", a + "in_proj_z.weight", a + "in_proj_b.weight",
                        a + "in_proj_a.weight"], (la.conv_dim + vd + 2 * nv, H)),
        out_proj=linear([a + "out_proj.weight"], (H, vd)),
        conv=conv.reshape(la.conv_dim, K).float().contiguous(),
        dt_bias=get(a + "dt_bias", (nv,)).float().contiguous(),
        A=A.contiguous(),
        norm=get(a + "norm.weight", (la.value_dim,)).float().contiguous()))


def hybrid_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every layer tensor's shape as config.json / the metadata imply it (HF names; matrices (out, in))."""
    la, H, hd, I = c.linear_attention, c.hidden_size, c.head_dim, c.intermediate_size
    nv, vd = la.value_heads, la.value_heads * la.value_dim
    out = {}
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)})
        if c.moe is not None and c.moe.is_moe(i):
            out.update(moe_shapes(c.moe, H, p))
        else:
            out.update({p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                        p + "mlp.down_proj.weight": (H, I)})
        if i in la.layers:
            a = p + "linear_attn."
            out.update({a + "in_proj_qkv.weight": (la.conv_dim, H), a + "in_proj_z.weight": (vd, H),
                        a + "in_proj_b.weight": (nv, H), a + "in_proj_a.weight": (nv, H),
                        a + "out_proj.weight": (H, vd), a + "dt_bias": (nv,), a + "norm.weight": (la.value_dim,)})
        else:
            a = p + "self_attn."
            out.update({a + "q_proj.weight": (2 * c.q_size, H), a + "k_proj.weight": (c.kv_size, H),
                        a + "v_proj.weight": (c.kv_size, H), a + "o_proj.weight": (H, c.q_size),
                        a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)})
    return out
