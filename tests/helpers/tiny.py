"""Tiny random models that tests build themselves: an HF folder and a GGUF file.

The tokenizer is byte-level BPE over the 256 byte symbols plus a few merges and
ChatML specials, so text round-trips and chat templates render.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _byte_vocab():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "s")]
    tokens = SPECIALS + symbols + ["".join(m) for m in merges]
    return tokens, merges


def tiny_config(arch: str = "llama", vocab: int = 512, hidden: int = 64, layers: int = 2, heads: int = 4,
                kv_heads: int = 2, intermediate: int = 128) -> dict:
    return {
        "model_type": arch, "vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "intermediate_size": intermediate,
        "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
        "tie_word_embeddings": False, "attention_bias": arch == "qwen2", "bos_token_id": None, "eos_token_id": 2,
        "head_dim": hidden // heads,
    }


def random_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h, v, i = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def w(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    out = {"model.embed_tokens.weight": w(v, h, scale=1.0), "model.norm.weight": 1 + w(h, scale=0.1),
           "lm_head.weight": w(v, h)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out.update({
            p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
            p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h), p + "mlp.down_proj.weight": w(h, i),
            p + "input_layernorm.weight": 1 + w(h, scale=0.1), p + "post_attention_layernorm.weight": 1 + w(h, scale=0.1),
        })
        if cfg["model_type"] == "qwen2":
            out.update({p + "self_attn.q_proj.bias": w(q), p + "self_attn.k_proj.bias": w(kv),
                        p + "self_attn.v_proj.bias": w(kv)})
        if cfg["model_type"] == "qwen3":
            out.update({p + "self_attn.q_norm.weight": 1 + w(hd, scale=0.1),
                        p + "self_attn.k_norm.weight": 1 + w(hd, scale=0.1)})
    return out


def write_tokenizer_json(folder: Path, vocab_size: int, ids: list[int] | None = None) -> None:
    """The tiny byte-level BPE tokenizer; ids: the id each token gets (default: its place in the list)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens, merges = _byte_vocab()
    tokens = tokens + [f"<unused{i}>" for i in range(vocab_size - len(tokens))]
    ids = ids or list(range(vocab_size))
    tok = Tokenizer(models.BPE(vocab={t: ids[i] for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "bos_token": None, "add_bos_token": False, "chat_template": CHATML}))


def make_hf_model(folder: Path, arch: str = "llama", seed: int = 0, extra_config: dict | None = None,
                  extra_tensors: dict | None = None, **sizes) -> Path:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config(arch, **sizes)
    cfg.update(extra_config or {})
    weights = random_weights(cfg, seed)
    if cfg.get("tie_word_embeddings"):  # the head is the embedding: no head of its own (one that differs is refused)
        del weights["lm_head.weight"]
    weights.update(extra_tensors or {})
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    write_tokenizer_json(folder, cfg["vocab_size"])
    return folder


K_QUANT_BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def random_kquant_blocks(rows: int, cols: int, kind: str, seed: int = 0) -> np.ndarray:
    """(rows, cols / 256 * bytes) uint8: random Q4_K / Q5_K / Q6_K super-blocks (the gguf package cannot
    quantize to these) whose fp16 scales give weights of roughly +-0.1; a valid tensor of that type."""
    rng = np.random.default_rng(seed)
    nbytes = K_QUANT_BYTES[kind]
    blocks = rng.integers(0, 256, size=(rows, cols // 256, nbytes), dtype=np.uint8)
    fields = [(208, 3e-3)] if kind == "Q6_K" else [(0, 2e-4), (2, 2e-3)]  # (offset of d / dmin, scale)
    for offset, scale in fields:
        d = rng.uniform(0.5, 1.0, size=(rows, cols // 256)).astype(np.float16) * np.float16(scale)
        blocks[:, :, offset : offset + 2] = d.view(np.uint8).reshape(rows, cols // 256, 2)
    return blocks.reshape(rows, -1)


def _add_tensor(w, name: str, t: torch.Tensor, kind: str, seed: int) -> None:
    """t written to the GGUFWriter w in type `kind` (F32; Q4_0 ... Q8_0 quantized by the gguf package;
    Q4_K / Q5_K / Q6_K as random super-blocks, Q8_0 where the width is not a multiple of 256)."""
    import gguf

    array = t.numpy().astype(np.float32)
    if kind in K_QUANT_BYTES and array.shape[1] % 256 != 0:
        kind = "Q8_0"
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    if kind in K_QUANT_BYTES:
        w.add_tensor(name, random_kquant_blocks(*array.shape, kind, seed), raw_dtype=qtype)
    elif kind != "F32":
        w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    else:
        w.add_tensor(name, array)


def make_gguf_model(path: Path, seed: int = 0, tensor_type: str | list[str] = "F32",
                    extra_weights: dict | None = None, nextn_layers: int = 0, **sizes) -> Path:
    """A tiny llama GGUF, with the llama.cpp q/k row permutation applied.

    tensor_type: the type of every matrix (F32, or one the gguf package quantizes to: Q4_0, Q4_1, Q5_0,
    Q5_1, Q8_0), or a list of types the matrices take in turn (Q4_K, Q5_K and Q6_K allowed there: random
    super-blocks, for matrices whose width is a multiple of 256; others get Q8_0).
    extra_weights: more HF-named tensors, e.g. MTP blocks as model.layers.{N+k}.* (DeepSeek layout),
    written under llama.cpp's names (blk.{N+k}.nextn.* for the MTP parts); nextn_layers says how many.
    """
    import gguf

    cfg = tiny_config("llama", **sizes)
    weights = random_weights(cfg, seed)
    weights.update(extra_weights or {})
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg["num_hidden_layers"] + nextn_layers)
    if nextn_layers:
        w.add_uint32("llama.nextn_predict_layers", nextn_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    tokens, merges = _byte_vocab()
    tokens = tokens + [f"<unused{i}>" for i in range(cfg["vocab_size"] - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges([" ".join(m) for m in merges])
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    def permute(t, heads):
        return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight", "rope_freqs.weight": "rope_freqs.weight"}
    layer_names = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
                   "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
                   "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
                   "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
                   "post_attention_layernorm.weight": "ffn_norm.weight", "enorm.weight": "nextn.enorm.weight",
                   "hnorm.weight": "nextn.hnorm.weight", "eh_proj.weight": "nextn.eh_proj.weight",
                   "shared_head.norm.weight": "nextn.shared_head_norm.weight", "self_attn.q_proj.bias": "attn_q.bias",
                   "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
                   "self_attn.o_proj.bias": "attn_output.bias"}
    types = [tensor_type] if isinstance(tensor_type, str) else list(tensor_type)
    matrices = 0
    for name, t in weights.items():
        if name.startswith("model.layers."):
            _, _, idx, rest = name.split(".", 3)
            gname = f"blk.{idx}.{layer_names[rest]}"
            if rest.startswith("self_attn.q_proj"):
                t = permute(t, cfg["num_attention_heads"])
            elif rest.startswith("self_attn.k_proj"):
                t = permute(t, cfg["num_key_value_heads"])
        else:
            gname = names[name]
        kind = types[matrices % len(types)] if t.dim() == 2 else "F32"
        matrices += t.dim() == 2
        _add_tensor(w, gname, t, kind, seed + matrices)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


# -- Gemma 3 ------------------------------------------------------------------------------------
def gemma3_config(vocab: int = 512, hidden: int = 64, layers: int = 6, heads: int = 4, kv_heads: int = 2,
                  head_dim: int = 16, intermediate: int = 128, window: int = 5, **extra) -> dict:
    """A tiny gemma3_text config.json as transformers 5 writes it. Default layer_types: every 6th layer
    global (Gemma 3's pattern, the one llama.cpp assumes for gemma3 GGUF files)."""
    cfg = {
        "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "vocab_size": vocab,
        "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim, "intermediate_size": intermediate,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
        "sliding_window": window, "query_pre_attn_scalar": head_dim, "tie_word_embeddings": True,
        "layer_types": ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(layers)],
        "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "attention_bias": False,
        "bos_token_id": None, "eos_token_id": 2, "pad_token_id": 0,
    }
    cfg.update(extra)
    return cfg


def gemma3_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random Gemma 3 weights under transformers' names; norm weights are Gemma's w (multiplier 1 + w)."""
    g = torch.Generator().manual_seed(seed)
    h, v, i, hd = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd

    def w(*shape, scale=0.08):
        return torch.randn(*shape, generator=g) * scale

    out = {"model.embed_tokens.weight": w(v, h, scale=0.2), "model.norm.weight": w(h, scale=0.1)}
    if not cfg.get("tie_word_embeddings", True):
        out["lm_head.weight"] = w(v, h)
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out.update({
            p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
            p + "self_attn.q_norm.weight": w(hd, scale=0.1), p + "self_attn.k_norm.weight": w(hd, scale=0.1),
            p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h), p + "mlp.down_proj.weight": w(h, i),
        })
        for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            out[p + norm + ".weight"] = w(h, scale=0.1)
    return out


def make_gemma3_hf_model(folder: Path, seed: int = 0, **config) -> Path:
    """A tiny random gemma3_text folder (config.json, model.safetensors, a byte-level tokenizer)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = gemma3_config(**config)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: t.contiguous() for k, t in gemma3_weights(cfg, seed).items()}, str(folder / "model.safetensors"))
    write_tokenizer_json(folder, cfg["vocab_size"])
    return folder


# llama.cpp's gemma3 tensor names (convert_hf_to_gguf.py, gguf constants MODEL_ARCH.GEMMA3)
GEMMA3_GGUF_NAMES = {
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def make_gemma3_gguf_model(path: Path, seed: int = 0, tensor_type: str | list[str] = "F32", **config) -> Path:
    """The tiny Gemma 3 of make_gemma3_hf_model (same config and seed, same weights) as llama.cpp's converter
    writes it: gemma3 names, no q/k permutation, 1 added to every norm weight, no output.weight (tied).
    llama.cpp knows no layer_types: every 6th layer is global, so keep the default pattern."""
    import gguf

    cfg = gemma3_config(**config)
    weights = gemma3_weights(cfg, seed)
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_parameters"]["full_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_sliding_window(cfg["sliding_window"])
    scaling = cfg["rope_parameters"]["full_attention"]
    if scaling["rope_type"] == "linear":  # Gemma 3 4B and up: the global layers' scaling
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(scaling["factor"])
    tokens, merges = _byte_vocab()
    tokens = tokens + [f"<unused{i}>" for i in range(cfg["vocab_size"] - len(tokens))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges([" ".join(m) for m in merges])
    w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)
    types = [tensor_type] if isinstance(tensor_type, str) else list(tensor_type)
    matrices = 0
    for name, t in weights.items():
        if name.startswith("model.layers."):
            _, _, idx, rest = name.split(".", 3)
            gname = f"blk.{idx}.{GEMMA3_GGUF_NAMES[rest]}"
        else:
            gname = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[name]
        if name.endswith("norm.weight"):
            t = t + 1  # the converter's norm_shift: Gemma3RMSNorm multiplies by 1 + w
        kind = types[matrices % len(types)] if t.dim() == 2 else "F32"
        matrices += t.dim() == 2
        _add_tensor(w, gname, t, kind, seed + matrices)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


EAGLE3_DRAFT_IDS = torch.arange(3, 512, 3)  # a reduced draft vocabulary: every third target id from 3


def random_eagle3_head(model, draft_ids: torch.Tensor = EAGLE3_DRAFT_IDS, seed: int = 0):
    """An EAGLE-3 head for the loaded `model` with random weights, tapping its layers 0, 1 and 2."""
    from specdec.drafters.eagle3 import Eagle3Config, Eagle3Head

    c = model.config
    cfg = Eagle3Config(hidden_size=c.hidden_size, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
                       head_dim=c.head_dim, intermediate_size=c.intermediate_size, vocab_size=c.vocab_size,
                       draft_vocab_size=len(draft_ids), rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                       max_positions=c.context_length, taps=(0, 1, 2))
    torch.manual_seed(seed)
    head = Eagle3Head(cfg, model.transformer.embed)
    head.set_vocab_map(draft_ids)
    return head.eval()
