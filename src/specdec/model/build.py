"""Turn a checkpoint (GGUF file or HF folder) into a Transformer in a chosen weight format.

`transformer_tensors` / `transformer_from_tensors` take a built Transformer apart into named
tensors and put it back together without converting anything (model/weight_cache.py stores them).
"""

from __future__ import annotations

import torch

from specdec.model.config import ModelConfig
from specdec.model.errors import ModelFileError, unread_bias
from specdec.model.gemma4_checkpoint import build_gemma4
from specdec.model.hybrid import HybridTransformer
from specdec.model.hybrid_build import hybrid_layer
from specdec.model.linear import WEIGHT_FORMATS, BlockRows, QLinear
from specdec.model.moe import build_moe
from specdec.model.transformer import Layer, Transformer


def build_transformer(source, weights_format: str, progress=None) -> Transformer:
    """source: anything with .config (ModelConfig), .names() and .get(name) -> float32 tensor."""
    if weights_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {weights_format!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
    c: ModelConfig = source.config
    names = set(source.names())
    where = getattr(source, "path", "checkpoint")

    def get(name, shape: tuple[int, ...] | None = None):
        """The tensor, checked against the shape the config implies (the C kernels trust it: a short norm
        weight would be read past its end)."""
        t = source.get(name)
        if shape is not None and tuple(t.shape) != shape:
            raise ModelFileError(where, f"tensor {name} has shape {tuple(t.shape)}; config.json / the metadata "
                                 f"imply {shape}")
        return t

    if weights_format == "gguf" and not hasattr(source, "blocks"):
        raise ValueError("--weights gguf keeps a GGUF file's own quantized blocks, and this checkpoint is not a "
                         "GGUF file; use --weights int8, w8a8, bf16 or fp32")

    def opt(name, shape=None):
        return get(name, shape) if name in names else None

    # a bias the layers do not add (o_proj's with attention_bias: true, an MLP's) would change every logit unseen
    layer = tuple(f"model.layers.{i}." for i in range(c.num_layers))
    added = {f"{p}self_attn.{n}_proj.bias" for p in layer for n in "qkv"} if c.qkv_bias else set()
    unread = sorted(n for n in names if n.startswith(layer) and n.endswith(".bias") and n not in added)
    if unread:
        raise unread_bias(where, unread)

    h, shapes = c.hidden_size, _linear_shapes(c)
    runtime = Transformer if c.linear_attention is None else HybridTransformer  # Qwen3.5: model/hybrid.py

    def linear(weights: list[str], shape: tuple[int, int], bias: torch.Tensor | None = None) -> QLinear:
        """One QLinear over these weights stacked row-wise (q/k/v and gate/up are fused)."""
        if weights_format == "gguf":
            q = QLinear.from_gguf([source.blocks(n) for n in weights], bias)
            got = (q.out_features, q.in_features)
        else:
            parts = [get(n) for n in weights]
            flat = all(t.dim() == 2 and t.shape[1] == parts[0].shape[1] for t in parts)
            got = (sum(t.shape[0] for t in parts), parts[0].shape[1]) if flat else tuple(parts[0].shape)
        if got != shape:
            raise ModelFileError(where, f"{' + '.join(weights)}: shape {got}; config.json / the metadata imply {shape}")
        return q if weights_format == "gguf" else QLinear(torch.cat(parts), bias, weights_format)

    if c.gemma4 is not None:  # Gemma 4: model/gemma4_checkpoint.py
        return build_gemma4(source, c, get, linear, weights_format, progress)
    # the norm before the MLP: Llama's post_attention_layernorm; Gemma's post_attention_layernorm norms the
    # attention output instead, and its pre_feedforward_layernorm comes before the MLP
    mlp_norm = "pre_feedforward_layernorm" if c.sandwich_norms else "post_attention_layernorm"
    layers = []
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        if c.linear_attention is not None:  # a Qwen3.5 layer: Gated DeltaNet or gated attention
            layers.append(hybrid_layer(c, i, get, linear, names, where,
                                       lambda prefix, norm: build_moe(source, c, prefix, weights_format, norm, get)))
            if progress is not None:
                progress(1)
            continue
        qkv_b = None
        if c.qkv_bias:
            qkv_b = torch.cat([get(p + f"self_attn.{n}_proj.bias", (size,))  # the kernels add it unchecked
                               for n, size in zip("qkv", (c.q_size, c.kv_size, c.kv_size))])
        norm = get(p + mlp_norm + ".weight", (h,))
        if c.moe is not None and c.moe.is_moe(i):  # a mixture of experts in place of the dense MLP (model/moe.py)
            mlp = dict(gate_up=None, down=None, moe=build_moe(source, c, p, weights_format, norm, get))
        else:
            mlp = dict(gate_up=linear([p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], shapes["gate_up"]),
                       down=linear([p + "mlp.down_proj.weight"], shapes["down"]))
        layers.append(Layer(
            qkv=linear([p + f"self_attn.{n}_proj.weight" for n in "qkv"], shapes["qkv"], qkv_b),
            o=linear([p + "self_attn.o_proj.weight"], shapes["o"]),
            **mlp,
            attn_norm=get(p + "input_layernorm.weight", (h,)),
            mlp_norm=norm,
            q_norm=get(p + "self_attn.q_norm.weight", (c.head_dim,)) if c.qk_norm else None,  # the family has them
            k_norm=get(p + "self_attn.k_norm.weight", (c.head_dim,)) if c.qk_norm else None,
            attn_out_norm=get(p + "post_attention_layernorm.weight", (h,)) if c.sandwich_norms else None,
            mlp_out_norm=get(p + "post_feedforward_layernorm.weight", (h,)) if c.sandwich_norms else None,
        ))
        if progress is not None:
            progress(1)
    if weights_format == "gguf":  # the embedding's rows are dequantized as they are looked up
        kind, blocks = source.blocks("model.embed_tokens.weight")
        lm_head = QLinear.from_gguf([(kind, blocks)] if c.tie_embeddings else [source.blocks("lm_head.weight")], None)
        if kind == "F32":
            embed = lm_head.parts[0][1] if c.tie_embeddings else blocks  # tied: the head's copy, held once
        elif c.tie_embeddings and lm_head.in_features % 32 == 0:  # the head's blocks, held once
            embed = BlockRows(kind, lm_head.parts[0][1], interleaved=True)
        else:
            embed = BlockRows(kind, blocks)
        return runtime(c, embed, layers, get("model.norm.weight", (h,)), lm_head, weights_format)
    embed = get("model.embed_tokens.weight")
    head = embed if c.tie_embeddings else get("lm_head.weight")
    if c.tie_embeddings and "lm_head.weight" in names and not torch.equal(get("lm_head.weight"), embed):
        # transformers 4 ties them (the embedding), 5 keeps the head: which one the model is, is not known
        raise ModelFileError(where, "config.json says tie_word_embeddings: true, but lm_head.weight differs from "
                             "the embedding; set tie_word_embeddings to false if the head is its own")
    for name, t in (("model.embed_tokens.weight", embed), ("lm_head.weight", head)):
        if t.dim() != 2 or t.shape[1] != h:
            raise ModelFileError(where, f"tensor {name} has shape {tuple(t.shape)}; rows of {h} values expected "
                                 "(the hidden size)")
        if name == "lm_head.weight" and t.shape[0] > embed.shape[0]:  # it could emit ids with no embedding row
            raise ModelFileError(where, f"tensor lm_head.weight has {t.shape[0]} rows, more than the "
                                 f"{embed.shape[0]} of model.embed_tokens.weight")
        if t.shape[0] < c.vocab_size:  # token ids past the rows would pass every check and then fail
            raise ModelFileError(where, f"tensor {name} has {t.shape[0]} rows, fewer than the vocab_size "
                                 f"{c.vocab_size} config.json declares")
    lm_head = QLinear(head, None, weights_format)
    if weights_format == "fp32" and c.tie_embeddings:
        embed = lm_head.weight  # the same values (QLinear may have copied them to aligned memory): held once
    elif weights_format != "fp32":
        embed = embed.to(torch.bfloat16)  # rows are looked up one at a time; half the memory
    return runtime(c, embed.contiguous(), layers, get("model.norm.weight", (h,)), lm_head, weights_format)


def _linear_shapes(c: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each QLinear of a layer, by Layer field name."""
    return {"qkv": (c.q_size + 2 * c.kv_size, c.hidden_size), "o": (c.hidden_size, c.q_size),
            "gate_up": (2 * c.intermediate_size, c.hidden_size), "down": (c.hidden_size, c.intermediate_size)}


def transformer_tensors(tr: Transformer) -> dict[str, torch.Tensor]:
    """Every tensor a built Transformer holds, by name: layers.{i}.qkv.weight, layers.{i}.attn_norm, ...,
    embed, norm, lm_head.weight (the RoPE tables are recomputed from the config). A tensor held twice
    (fp32's tied lm_head is the embedding itself) appears under both names."""
    out = {"embed": tr.embed, "norm": tr.norm}
    out.update({f"lm_head.{k}": t for k, t in tr.lm_head.tensors().items()})
    for i, layer in enumerate(tr.layers):
        for part in ("qkv", "o", "gate_up", "down"):
            out.update({f"layers.{i}.{part}.{k}": t for k, t in getattr(layer, part).tensors().items()})
        for norm in ("attn_norm", "mlp_norm", "q_norm", "k_norm", "attn_out_norm", "mlp_out_norm"):
            if getattr(layer, norm) is not None:
                out[f"layers.{i}.{norm}"] = getattr(layer, norm)
    return out


def transformer_from_tensors(c: ModelConfig, weights_format: str, tensors: dict[str, torch.Tensor]) -> Transformer:
    """The Transformer whose `transformer_tensors` these are. Raises ValueError when a tensor is missing or
    extra, or has another dtype or shape than the config and format imply."""
    if weights_format not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weight format {weights_format!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
    left = dict(tensors)

    def take(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        t = left.pop(name, None)
        if t is None:
            raise ValueError(f"tensor {name} is missing")
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise ValueError(f"tensor {name} is {t.dtype} {tuple(t.shape)}; expected {dtype} {shape}")
        return t

    def linear(prefix: str, n: int, k: int) -> QLinear:
        parts = {name[len(prefix):]: left.pop(name) for name in [m for m in left if m.startswith(prefix)]}
        try:
            return QLinear.from_tensors(parts, weights_format, n, k)
        except ValueError as exc:
            raise ValueError(f"{prefix[:-1]}: {exc}") from None

    h, f32 = c.hidden_size, torch.float32
    layers = []
    for i in range(c.num_layers):
        p = f"layers.{i}."
        qlinears = {part: linear(f"{p}{part}.", n, k) for part, (n, k) in _linear_shapes(c).items()}
        qkv_bias = qlinears["qkv"].bias is not None
        if qkv_bias != c.qkv_bias:
            raise ValueError(f"{p}qkv has {'a' if qkv_bias else 'no'} bias; the config says qkv_bias={c.qkv_bias}")
        layers.append(Layer(
            **qlinears,
            attn_norm=take(p + "attn_norm", f32, (h,)),
            mlp_norm=take(p + "mlp_norm", f32, (h,)),
            q_norm=take(p + "q_norm", f32, (c.head_dim,)) if c.qk_norm else None,
            k_norm=take(p + "k_norm", f32, (c.head_dim,)) if c.qk_norm else None,
            attn_out_norm=take(p + "attn_out_norm", f32, (h,)) if c.sandwich_norms else None,
            mlp_out_norm=take(p + "mlp_out_norm", f32, (h,)) if c.sandwich_norms else None,
        ))
    embed = take("embed", f32 if weights_format == "fp32" else torch.bfloat16, (c.vocab_size, h))
    norm = take("norm", f32, (h,))
    lm_head = linear("lm_head.", c.vocab_size, h)
    if lm_head.bias is not None:
        raise ValueError("lm_head has a bias; specdec's lm_head has none")
    if left:
        raise ValueError(f"unexpected tensors {', '.join(sorted(left)[:5])}")
    return Transformer(c, embed, layers, norm, lm_head, weights_format)
