"""A Gemma 4 text model (dense) from a Hugging Face folder: config.json (Gemma4TextConfig, model_type
gemma4_text) to ModelConfig, and the tensors (transformers' names) to model/gemma4.py's runtime."""

from __future__ import annotations

import torch

from specdec.model.config import ModelConfig
from specdec.model.errors import ModelFileError
from specdec.model.gemma4 import Gemma4Layer, Gemma4Transformer, PerLayerInputs
from specdec.model.gemma4_layout import Gemma4Layout, kv_sources
from specdec.model.linear import BlockRows, QLinear

_KINDS = ("sliding_attention", "full_attention")
# what `specdec inspect` says of the family: what runs, what lights up, what checked it
FAMILY_NOTE = ("Gemma 4 dense text (CPU; chains and trees); its gemma4_assistant checkpoint lights up draft-mtp (-md, "
               "or beside the model as MODEL-assistant); checked against transformers on tiny reference checkpoints "
               "only, no real file tested; read from folders and llama.cpp's gemma4 GGUF files; Gemma 4 MoE blocks and "
               "the assistant's GGUF file (gemma4-assistant) are not read")
PUBLISHED = "gemma4"  # the model_type of Google's folders: the text model beside vision and audio towers
_LANGUAGE_MODEL = "model.language_model."


def published_text(raw: dict) -> dict:
    """A multimodal gemma4 config.json's text model: its text_config over the top level (model_type kept)."""
    text = raw.get("text_config")
    if not isinstance(text, dict):
        raise ValueError("config.json model_type gemma4 has no text_config object")
    return {**raw, **text, "model_type": PUBLISHED}


def text_names(names) -> dict[str, str]:
    """The text model's tensors of a multimodal gemma4 folder by their text-model names (model.language_model.X
    -> model.X) -> their names in the file; the towers' tensors (vision, audio) left out."""
    return {"model." + n[len(_LANGUAGE_MODEL):]: n for n in names if n.startswith(_LANGUAGE_MODEL)}


def layer_types_of(path, raw: dict) -> list[str]:
    """config.json's layer_types, or transformers' default (every 6th layer global), the last layer global."""
    layers = int(raw["num_hidden_layers"])
    kinds = raw.get("layer_types") or ["sliding_attention" if (i + 1) % 6 else "full_attention"
                                       for i in range(layers)]
    if len(kinds) != layers or set(kinds) - set(_KINDS):
        raise ModelFileError(path, f"layer_types must name sliding_attention or full_attention for each of the "
                             f"{layers} layers, got {kinds}")
    return [*kinds[:-1], "full_attention"]  # as transformers forces it


def gemma4_config(path, raw: dict, tied: bool) -> ModelConfig:
    """ModelConfig of a Gemma 4 text config.json (transformers 5.x: per_layer_config holds the global layers'
    head_dim and kv heads; older files say global_head_dim / num_global_key_value_heads)."""
    for key, why in (("enable_moe_block", "Gemma 4 with mixture-of-experts blocks (26B-A4B) is not run by specdec "
                      "yet; the dense Gemma 4 models are"),
                     ("use_bidirectional_attention", "use_bidirectional_attention is 'all' (an embedding model): "
                      "specdec generates with causal attention"),
                     ("attention_bias", "attention_bias is true: specdec's Gemma 4 attention has no biases")):
        if raw.get(key) and (key != "use_bidirectional_attention" or raw[key] == "all"):  # "vision": images only
            raise ModelFileError(path, why)
    kinds = layer_types_of(path, raw)
    layers = len(kinds)
    heads = int(raw["num_attention_heads"])
    head_dim = int(raw.get("head_dim") or 256)
    kv_heads = int(raw.get("num_key_value_heads") or heads)
    k_eq_v = bool(raw.get("attention_k_eq_v", False))
    per_layer = raw.get("per_layer_config") or {}
    first_global = next(str(i) for i, k in enumerate(kinds) if k == "full_attention")
    overrides = per_layer.get(first_global) or per_layer.get(int(first_global)) or {}
    global_head_dim = int(overrides.get("head_dim") or raw.get("global_head_dim") or 512)
    global_kv = overrides.get("num_key_value_heads") or (raw.get("num_global_key_value_heads") if k_eq_v else None)
    params = raw.get("rope_parameters") or {}
    full = params.get("full_attention") or {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                             "rope_theta": 1_000_000.0}
    local = params.get("sliding_attention") or {"rope_type": "default", "rope_theta": 10_000.0}
    if (local.get("rope_type") or "default") != "default":
        raise ModelFileError(path, f"rope type {local.get('rope_type')!r} on the sliding layers is not supported "
                             "(Gemma 4 uses plain RoPE there)")
    full_type = full.get("rope_type") or "default"
    if full_type not in ("default", "proportional"):
        raise ModelFileError(path, f"rope type {full_type!r} on the global layers is not supported (specdec "
                             "computes Gemma 4's 'proportional' RoPE and plain RoPE)")
    proportion = float(full.get("partial_rotary_factor", 1.0)) if full_type == "proportional" else 1.0
    try:
        layout = Gemma4Layout(
            global_head_dim=global_head_dim, global_kv_heads=int(global_kv or kv_heads),
            rotated_pairs=int(proportion * global_head_dim // 2), kv_source=kv_sources(
                kinds, int(raw.get("num_kv_shared_layers") or 0)), k_eq_v=k_eq_v,
            double_wide=bool(raw.get("use_double_wide_mlp", False)),
            ple_size=int(raw.get("hidden_size_per_layer_input") or 0),
            ple_vocab=int(raw.get("vocab_size_per_layer_input") or 0),
            rope_factor=float(full.get("factor", 1.0)) if full_type == "proportional" else 1.0)
        sliding = tuple(i for i, k in enumerate(kinds) if k == "sliding_attention")
        hidden = int(raw["hidden_size"])
        softcap = raw.get("final_logit_softcapping")
        return ModelConfig(
            arch="gemma4", vocab_size=int(raw["vocab_size"]), hidden_size=hidden, num_layers=layers,
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
            intermediate_size=int(raw["intermediate_size"]),
            rope_theta=float(full.get("rope_theta") or 1_000_000.0),
            rope_local_theta=float(local.get("rope_theta") or 10_000.0),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            context_length=int(raw.get("max_position_embeddings", 131_072)),
            qk_norm=True, tie_embeddings=tied, mlp_act="gelu_tanh", sandwich_norms=True, embed_scale=hidden ** 0.5,
            attn_scale=1.0, sliding_window=int(raw.get("sliding_window") or 512) if sliding else 0,
            sliding_layers=sliding, final_logit_softcap=None if softcap is None else float(softcap), gemma4=layout)
    except ValueError as exc:
        raise ModelFileError(path, f"config.json: {exc}") from None


def gemma4_shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every layer tensor's shape as config.json implies it (transformers' names; matrices (out, in))."""
    g, H, nh = c.gemma4, c.hidden_size, c.num_heads
    out = {}
    for i in range(c.num_layers):
        p, is_global = f"model.layers.{i}.", i not in c.sliding_layers
        nkv, hd = (g.global_kv_heads, g.global_head_dim) if is_global else (c.num_kv_heads, c.head_dim)
        inter = g.intermediate(i, c.intermediate_size)
        out.update({p + n: (H,) for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                                          "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight")})
        out.update({p + "layer_scalar": (1,), p + "self_attn.q_proj.weight": (nh * hd, H),
                    p + "self_attn.o_proj.weight": (H, nh * hd), p + "self_attn.q_norm.weight": (hd,),
                    p + "mlp.gate_proj.weight": (inter, H), p + "mlp.up_proj.weight": (inter, H),
                    p + "mlp.down_proj.weight": (H, inter)})
        if g.owns_kv(i):
            out.update({p + "self_attn.k_proj.weight": (nkv * hd, H), p + "self_attn.k_norm.weight": (hd,)})
            if not (g.k_eq_v and is_global):
                out[p + "self_attn.v_proj.weight"] = (nkv * hd, H)
        if g.ple_size:
            out.update({p + "per_layer_input_gate.weight": (g.ple_size, H),
                        p + "per_layer_projection.weight": (H, g.ple_size),
                        p + "post_per_layer_input_norm.weight": (H,)})
    if g.ple_size:
        out.update({"model.embed_tokens_per_layer.weight": (g.ple_vocab, c.num_layers * g.ple_size),
                    "model.per_layer_model_projection.weight": (c.num_layers * g.ple_size, H),
                    "model.per_layer_projection_norm.weight": (g.ple_size,)})
    return out


def build_gemma4(source, c: ModelConfig, get, linear, weights_format: str, progress=None) -> Gemma4Transformer:
    """The runtime of a Gemma 4 checkpoint. get(name, shape) -> float32 tensor checked against shape;
    linear(names, (out, in)) -> QLinear of those matrices stacked (model/build.py's)."""
    shapes = gemma4_shapes(c)

    def mat(names):
        return linear(names, (sum(shapes[n][0] for n in names), shapes[names[0]][1]))

    layers = []
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        qkv = [a + n + "_proj.weight" for n in "qkv" if a + n + "_proj.weight" in shapes]
        ple = {}
        if c.gemma4.ple_size:
            ple = dict(ple_gate=mat([p + "per_layer_input_gate.weight"]), ple_proj=mat([p + "per_layer_projection.weight"]),
                       ple_norm=get(p + "post_per_layer_input_norm.weight", shapes[p + "post_per_layer_input_norm.weight"]))
        layers.append(Gemma4Layer(
            qkv=mat(qkv), o=mat([a + "o_proj.weight"]), gate_up=mat([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"]),
            down=mat([p + "mlp.down_proj.weight"]),
            **{field: get(p + name + ".weight", (c.hidden_size,)) for field, name in (
                ("attn_norm", "input_layernorm"), ("attn_out_norm", "post_attention_layernorm"),
                ("mlp_norm", "pre_feedforward_layernorm"), ("mlp_out_norm", "post_feedforward_layernorm"))},
            q_norm=get(a + "q_norm.weight", shapes[a + "q_norm.weight"]),
            k_norm=get(a + "k_norm.weight", shapes[a + "k_norm.weight"]) if a + "k_norm.weight" in shapes else None,
            scalar=get(p + "layer_scalar", (1,)), **ple))
        if progress is not None:
            progress(1)
    ple = None
    if c.gemma4.ple_size:
        name = "model.embed_tokens_per_layer.weight"
        if weights_format == "gguf":  # a GGUF file's: rows dequantized as they are looked up (float32 if not blocks)
            table = _table_rows(source, name, shapes[name])
        else:
            table = get(name, shapes[name])
            table = table if weights_format == "fp32" else table.to(torch.bfloat16)
        ple = PerLayerInputs(embed=table, proj=mat(["model.per_layer_model_projection.weight"]),
                             norm=get("model.per_layer_projection_norm.weight", (c.gemma4.ple_size,)))
    if weights_format == "gguf":  # model/build.py's reading of a GGUF file's embedding and head
        name = "model.embed_tokens.weight" if c.tie_embeddings else "lm_head.weight"
        lm_head = QLinear.from_gguf([source.blocks(name)], None)
        embed = _table_rows(source, "model.embed_tokens.weight", (c.vocab_size, c.hidden_size))
        return Gemma4Transformer(c, embed, layers, get("model.norm.weight", (c.hidden_size,)), lm_head,
                                 weights_format, ple)
    embed = get("model.embed_tokens.weight", (c.vocab_size, c.hidden_size))
    head = embed if c.tie_embeddings else get("lm_head.weight", (c.vocab_size, c.hidden_size))
    lm_head = QLinear(head, None, weights_format)
    embed = lm_head.weight if weights_format == "fp32" and c.tie_embeddings else (
        embed if weights_format == "fp32" else embed.to(torch.bfloat16))
    return Gemma4Transformer(c, embed.contiguous(), layers, get("model.norm.weight", (c.hidden_size,)), lm_head,
                             weights_format, ple)


def _table_rows(source, name: str, shape: tuple[int, int]):
    """A GGUF file's table (an embedding) as BlockRows of its blocks, or float32 where not blocks; shape checked."""
    kind, blocks = source.blocks(name)
    table = blocks if kind == "F32" else BlockRows(kind, blocks)
    if tuple(table.shape) != shape:
        raise ModelFileError(source.path, f"tensor {name} has shape {tuple(table.shape)}, expected {shape}")
    return table


def layout_summary(c: ModelConfig) -> str:
    """One line on a Gemma 4 model's layers for people (specdec inspect)."""
    g = c.gemma4
    glob = [i for i in range(c.num_layers) if i not in c.sliding_layers]
    shared = [i for i in range(c.num_layers) if not g.owns_kv(i)]
    parts = [f"{len(c.sliding_layers)} sliding layers (window {c.sliding_window}, kv {c.num_kv_heads}, dim "
             f"{c.head_dim})", f"{len(glob)} global (kv {g.global_kv_heads}, dim {g.global_head_dim}, RoPE on "
             f"{2 * g.rotated_pairs} of {g.global_head_dim} dims{', values = keys' if g.k_eq_v else ''})"]
    if shared:
        parts.append(f"{len(shared)} reuse earlier layers' keys" + (" (double-wide MLP)" if g.double_wide else ""))
    if g.ple_size:
        parts.append(f"per-layer inputs {g.ple_size} wide")
    return ", ".join(parts)
