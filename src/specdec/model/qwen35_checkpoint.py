"""Qwen3.5 / Qwen3.6 checkpoints, dense and MoE: their config (config.json or GGUF metadata) as a ModelConfig,
and their tensor names, for the HF and GGUF loaders.

Folders come in two layouts, both read as the text model:
  model_type qwen3_5_text   Qwen3_5ForCausalLM: model.layers.*, model.embed_tokens, model.norm, lm_head
  model_type qwen3_5        Qwen3_5ForConditionalGeneration (what Qwen publishes): sizes in text_config,
                            model.language_model.* for the text model, model.visual.* (the vision tower,
                            not run: images are refused), lm_head
and the same two for Qwen3.5-MoE (qwen3_5_moe_text, qwen3_5_moe; GGUF architecture qwen35moe): every layer's
MLP a mixture with a shared expert behind a sigmoid gate (model/moe_config.py), the MTP layer's too. Qwen3-Next
(qwen3_next, GGUF qwen3next) is read here too; what differs is in model/qwen3next_checkpoint.py.
MTP layers sit under mtp.* in both (mtp_num_hidden_layers; drafters/mtp.py runs them). Every RMS norm weight
w stands for the multiplier 1 + w, except linear_attn.norm's (a plain multiplier), as transformers computes
them and llama.cpp's converter stores them. GGUF files (llama.cpp's qwen35) name the linear layers' tensors
attn_qkv, attn_gate, ssm_*, hold ssm_a = -exp(A_log) and order the value heads "tiled" (hybrid_config.py).
"""

from __future__ import annotations

from dataclasses import replace

from specdec.model.config import ModelConfig
from specdec.model.errors import ModelFileError
from specdec.model.hybrid_config import LinearAttention
from specdec.model import qwen3next_checkpoint as qwen3next
from specdec.model.moe_config import moe_from_gguf, moe_from_hf

MODEL_TYPES = ("qwen3_5_text", "qwen3_5")  # config.json model_type of the text model and of the published one
MOE_MODEL_TYPES = ("qwen3_5_moe_text", "qwen3_5_moe")  # the same for Qwen3.5-MoE
PUBLISHED = ("qwen3_5", "qwen3_5_moe")  # the layouts with a text_config and a vision tower
HYBRID_ARCHS = ("qwen35", "qwen35moe", qwen3next.ARCH)  # ModelConfig.arch, as the GGUF architectures name them
_LANGUAGE_MODEL = "model.language_model."
_VISION = ("model.visual.", "visual.")

# What `specdec inspect` says of each family read here (ModelConfig.arch): what runs, what lights up, what checked it
_CHECKED = ("checked against transformers and llama.cpp's converter on tiny reference checkpoints only; no real "
            "file tested")
FAMILY_NOTES = {
    "qwen35": "Qwen3.5 / Qwen3.6 dense hybrid (Gated DeltaNet + gated attention; CPU, chains only); its MTP layers "
              f"light up draft-mtp; {_CHECKED}",
    "qwen35moe": "Qwen3.5-MoE hybrid (Gated DeltaNet + gated attention, every MLP a mixture with a gated shared "
                 "expert, k of E experts read per token; CPU, chains only); its MTP layer (a mixture too) lights up "
                 f"draft-mtp; a published folder runs its text model (images are refused); {_CHECKED}",
    qwen3next.ARCH: "Qwen3-Next hybrid (Qwen3.5-MoE's layers, DeltaNet projections fused per key head, dense MLPs "
                    "where mlp_only_layers says; CPU, chains only); its MTP layer (a mixture too) lights up "
                    f"draft-mtp, declared or not; {_CHECKED}",
}

# llama.cpp's qwen35 layer tensors -> HF names (after blk.N.); the others are gguf_names' common ones
GGUF_NAMES = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_qkv.weight": "linear_attn.in_proj_qkv.weight",
    "attn_gate.weight": "linear_attn.in_proj_z.weight",
    "ssm_beta.weight": "linear_attn.in_proj_b.weight",
    "ssm_alpha.weight": "linear_attn.in_proj_a.weight",
    "ssm_conv1d.weight": "linear_attn.conv1d.weight",
    "ssm_dt.bias": "linear_attn.dt_bias",
    "ssm_a": "linear_attn.A",  # -exp(A_log)
    "ssm_norm.weight": "linear_attn.norm.weight",
    "ssm_out.weight": "linear_attn.out_proj.weight",
}


def text_config(raw: dict) -> dict:
    """The text model's config.json keys: a published (qwen3_5, qwen3_5_moe) config's text_config over its top
    level, model_type kept."""
    kind = raw.get("model_type")
    if kind not in PUBLISHED:
        return raw
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"config.json model_type {kind} has no text_config object")
    return {**raw, **text, "model_type": kind}


def text_tensor_name(name: str) -> str | None:
    """A folder tensor's name in the text model (model.language_model.X -> model.X); None for the vision tower's."""
    if name.startswith(_LANGUAGE_MODEL):
        return "model." + name[len(_LANGUAGE_MODEL):]
    return None if name.startswith(_VISION) else name


def adds_one(name: str) -> bool:
    """Whether a folder tensor is an RMS norm weight w standing for 1 + w: all of Qwen3.5's but the gated norm's,
    the MTP layer's pre_fc_norm_embedding / pre_fc_norm_hidden included (llama.cpp's converter adds the 1 to
    them too, once it has named them enorm / hnorm)."""
    if name.endswith(("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight")):
        return True
    return name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight")


def qwen35_config(path, raw: dict, tied: bool) -> ModelConfig:
    """config.json's text keys (text_config() already applied) -> ModelConfig; tied: whether the output head is
    the embedding. ModelFileError for what specdec does not compute (another RoPE, another activation, value
    heads no multiple of the key heads)."""
    layers = int(raw["num_hidden_layers"])
    layer_types = raw.get("layer_types")
    if layer_types is None:
        interval = int(raw.get("full_attention_interval") or 4)
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers)]
    if len(layer_types) != layers or set(layer_types) - {"linear_attention", "full_attention"}:
        raise ModelFileError(path, f"layer_types must name linear_attention or full_attention for each of the "
                             f"{layers} layers, got {layer_types}")
    rope = dict(raw.get("rope_parameters") or raw.get("rope_scaling") or {})
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind not in ("default", "mrope"):  # mrope: text positions are one position for all three sections
        raise ModelFileError(path, f"rope type {kind!r} is not supported (Qwen3.5's text RoPE is the default one)")
    if raw.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ModelFileError(path, f"hidden_act {raw['hidden_act']!r} is not supported (Qwen3.5's MLP is SwiGLU)")
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or 256)
    factor = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25))
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ModelFileError(path, f"partial_rotary_factor is {factor!r}; a number in (0, 1] is expected")
    rope_dims = int(head_dim * factor)
    try:
        linear = LinearAttention(
            layers=tuple(i for i, t in enumerate(layer_types) if t == "linear_attention"),
            key_heads=int(raw.get("linear_num_key_heads", 16)), value_heads=int(raw.get("linear_num_value_heads", 32)),
            key_dim=int(raw.get("linear_key_head_dim", 128)), value_dim=int(raw.get("linear_value_head_dim", 128)),
            conv_kernel=int(raw.get("linear_conv_kernel_dim", 4)))
    except ValueError as exc:
        raise ModelFileError(path, f"config.json: {exc}") from None
    moe, arch = None, "qwen35"
    if raw.get("model_type") in MOE_MODEL_TYPES:  # every layer a mixture (transformers' Qwen3_5MoeDecoderLayer)
        moe, arch = replace(moe_from_hf(raw, "qwen3_5_moe", layers), layers=tuple(range(layers))), "qwen35moe"
    elif raw.get("model_type") == qwen3next.MODEL_TYPE:  # mixtures as mlp_only_layers / decoder_sparse_step say
        moe, arch = moe_from_hf(raw, qwen3next.MODEL_TYPE, layers), qwen3next.ARCH
    return ModelConfig(
        arch=arch, vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
        num_layers=layers, num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=head_dim, intermediate_size=int(raw.get("intermediate_size") or moe.expert_intermediate if moe
                                                 and moe.layers == tuple(range(layers)) else raw["intermediate_size"]),
        rope_theta=float(rope.get("rope_theta") or raw.get("rope_theta") or 10000.0),
        rope_dims=0 if rope_dims == head_dim else rope_dims,
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        context_length=int(raw.get("max_position_embeddings", 32768)),
        qk_norm=True, tie_embeddings=tied, mtp_layers_declared=int(raw.get("mtp_num_hidden_layers") or 0),
        linear_attention=linear, attn_output_gate=True, moe=moe)


def qwen35_gguf_config(path, meta: dict, tensors: dict) -> ModelConfig:
    """A qwen35 / qwen35moe GGUF file's metadata (llama.cpp's names) -> ModelConfig."""
    arch = meta.get("general.architecture", "qwen35")

    def need(key):
        value = meta.get(f"{arch}.{key}")
        if value is None:
            raise ModelFileError(path, f"metadata key {arch}.{key} is missing")
        return value

    nextn = int(meta.get(f"{arch}.nextn_predict_layers") or 0)
    layers = int(need("block_count")) - nextn
    recurrent = meta.get(f"{arch}.attention.recurrent_layers")
    if recurrent is None:
        interval = int(meta.get(f"{arch}.full_attention_interval") or 4)
        recurrent = [(i + 1) % interval != 0 for i in range(layers)]
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    rotated = int(meta.get(f"{arch}.rope.dimension_count") or head_dim)
    value_heads = int(need("ssm.time_step_rank"))
    embed = tensors.get("model.embed_tokens.weight")
    if embed is None:
        raise ModelFileError(path, "tensor token_embd.weight is missing")
    try:
        linear = LinearAttention(layers=tuple(i for i in range(layers) if recurrent[i]),
                                 key_heads=int(need("ssm.group_count")), value_heads=value_heads,
                                 key_dim=int(need("ssm.state_size")),
                                 value_dim=int(need("ssm.inner_size")) // value_heads,
                                 conv_kernel=int(need("ssm.conv_kernel")), tiled=arch != qwen3next.ARCH)
        moe = moe_from_gguf(meta, arch, layers, False) if arch != "qwen35" else None
        if moe is not None and arch == qwen3next.ARCH:  # the layers with a router (dense ones: mlp_only_layers)
            moe = replace(moe, layers=tuple(i for i in range(layers) if f"model.layers.{i}.mlp.gate.weight" in tensors))
        return ModelConfig(
            arch=arch, vocab_size=int(meta.get(f"{arch}.vocab_size") or embed.shape[-1]), hidden_size=hidden,
            num_layers=layers, num_heads=heads, num_kv_heads=int(meta.get(f"{arch}.attention.head_count_kv") or heads),
            head_dim=head_dim, intermediate_size=int(meta.get(f"{arch}.feed_forward_length") or moe.expert_intermediate
                                                     if moe else need("feed_forward_length")),
            rope_theta=float(meta.get(f"{arch}.rope.freq_base") or 10000.0),
            rope_dims=0 if rotated == head_dim else rotated,
            rms_norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon") or 1e-6),
            context_length=int(meta.get(f"{arch}.context_length") or 4096), qk_norm=True,
            tie_embeddings="lm_head.weight" not in tensors, mtp_layers_declared=nextn, linear_attention=linear,
            attn_output_gate=True, moe=moe)
    except KeyError as exc:
        raise ModelFileError(path, f"metadata key {exc.args[0]} is missing") from None
    except (ValueError, TypeError, IndexError) as exc:
        raise ModelFileError(path, f"metadata: {exc}") from None
