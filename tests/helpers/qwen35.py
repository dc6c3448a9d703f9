"""Tiny Qwen3.5 checkpoints written by the reference's own code, and a float64 reference of its MTP block.

    transformers_folder  transformers' Qwen3_5 classes (text: Qwen3_5ForCausalLM, model_type qwen3_5_text;
                         published: Qwen3_5ForConditionalGeneration, model_type qwen3_5, a tiny vision tower
                         beside it), random weights, save_pretrained; then mtp.* tensors, which transformers
                         drops, added under the names Qwen's checkpoints use (mtp_num_hidden_layers: 1)
    convert_to_gguf      llama.cpp's own convert_hf_to_gguf.py on such a folder (its tensor names, its V-head
                         reordering, its ssm_a = -exp(A_log), its nextn layers), from $LLAMA_CPP_DIR or the
                         source tree above $LLAMA_CPP_BIN; the tiny tokenizer's pre-tokenizer is named "default"
                         (the converter refuses pre-tokenizers it has no hash for; the text is not what is tested)
    mtp_reference        the MTP block in float64 as vLLM's qwen3_5_mtp.py and llama.cpp's qwen35.cpp compute it

FIXTURE (tests/model/data/qwen35-tiny) holds one such folder and its two GGUF conversions, made by
tests/model/data/qwen35-tiny/make_fixture.py, so the fast suite reads llama.cpp's files on any machine.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from helpers import llama_converter
from helpers.llama_converter import NO_TREE, llama_cpp_tree  # noqa: F401 (the tests import them from here)
from helpers.tiny import write_tokenizer_json

FIXTURE = Path(__file__).resolve().parent.parent / "model" / "data" / "qwen35-tiny"

# 4 layers (3 Gated DeltaNet, then 1 full attention), 2 key heads for 4 value heads (their order matters),
# a quarter of each 16-wide attention head rotated; widths of 32 so that llama.cpp's Q8_0 blocks fit
TEXT = dict(vocab_size=272, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8,
            linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=512,
            rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=2, pad_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.25,
                             "mrope_section": [1, 1, 0], "mrope_interleaved": True})
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
              num_position_embeddings=16, patch_size=4, spatial_merge_size=2, temporal_patch_size=2)


def _randomize(model, seed: int) -> None:
    """Every parameter random: RMS norm weights w near 0 (they stand for 1 + w), the gated norm's near 1,
    A_log and dt_bias around 0, matrices small, the embedding larger."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1 + 0.1 * noise)
            elif name.endswith("norm.weight"):
                p.copy_(0.1 * noise)
            elif name.endswith(("A_log", "dt_bias")):
                p.copy_(0.5 * noise)
            else:
                p.copy_(noise * (0.5 if "embed" in name else 0.15))


def mtp_tensors(H: int, heads: int, kv_heads: int, hd: int, inter: int, seed: int = 1) -> dict[str, torch.Tensor]:
    """One MTP layer under Qwen3.5's names (what Qwen's checkpoints hold and transformers drops)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.15):
        return torch.randn(*shape, generator=g) * scale

    p = "mtp.layers.0."
    return {"mtp.fc.weight": w(H, 2 * H), "mtp.pre_fc_norm_embedding.weight": w(H, scale=0.1),
            "mtp.pre_fc_norm_hidden.weight": w(H, scale=0.1), "mtp.norm.weight": w(H, scale=0.1),
            p + "input_layernorm.weight": w(H, scale=0.1), p + "post_attention_layernorm.weight": w(H, scale=0.1),
            p + "self_attn.q_proj.weight": w(2 * heads * hd, H), p + "self_attn.k_proj.weight": w(kv_heads * hd, H),
            p + "self_attn.v_proj.weight": w(kv_heads * hd, H), p + "self_attn.o_proj.weight": w(H, heads * hd),
            p + "self_attn.q_norm.weight": w(hd, scale=0.1), p + "self_attn.k_norm.weight": w(hd, scale=0.1),
            p + "mlp.gate_proj.weight": w(inter, H), p + "mlp.up_proj.weight": w(inter, H),
            p + "mlp.down_proj.weight": w(H, inter)}


def transformers_folder(folder, layout: str = "text", seed: int = 0, tie: bool = False, mtp: bool = True,
                        **text) -> Path:
    """A tiny Qwen3.5 folder written by transformers (layout "text" or "published"), MTP layer added."""
    from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration, Qwen3_5TextConfig

    folder = Path(folder)
    sizes = {**TEXT, **text, "tie_word_embeddings": tie}
    if layout == "text":
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**sizes))
    else:
        model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=sizes, vision_config=VISION,
                                                              tie_word_embeddings=tie))
    _randomize(model, seed)
    model.save_pretrained(folder)
    write_tokenizer_json(folder, sizes["vocab_size"])
    if mtp:
        weights = load_file(str(folder / "model.safetensors"))
        weights.update(mtp_tensors(sizes["hidden_size"], sizes["num_attention_heads"], sizes["num_key_value_heads"],
                                   sizes["head_dim"], sizes["intermediate_size"], seed + 1))
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        cfg = json.loads((folder / "config.json").read_text())
        (cfg.get("text_config") or cfg)["mtp_num_hidden_layers"] = 1
        (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def convert_to_gguf(folder, out, outtype: str = "f32", tree: Path | None = None) -> Path:
    """llama.cpp's converter on `folder` -> the GGUF file `out` (outtype f32, q8_0, ...)."""
    return llama_converter.convert_to_gguf(folder, out, outtype, tree)


# -- the MTP block, float64 ------------------------------------------------------------------------------------
def _norm(x, w, eps):  # Qwen3_5RMSNorm: x / rms(x) * (1 + w)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def mtp_reference(t: dict, cfg: dict, embed: torch.Tensor, lm_head: torch.Tensor, hidden: torch.Tensor,
                  tokens: list[int], positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3.5's MTP layer over a sequence of pairs, in float64 (tensors `t` as the checkpoint stores them):

        e = pre_fc_norm_embedding(embed[x_{j+1}]); h = pre_fc_norm_hidden(h_j)   (norms 1 + w)
        x = fc([e; h]);  x = x + attn(input_layernorm(x));  x = x + mlp(post_attention_layernorm(x))
        attn: q|gate = q_proj (per head), q_norm/k_norm, RoPE on the first quarter of each head, causal over
              the pairs, times sigmoid(gate), o_proj
        out = norm(x) -> logits = lm_head(out), and `out` is the next step's h

    hidden (T, H): the target's final-normed rows h_j; tokens: x_{j+1}; positions: j. -> (logits (T, V),
    out (T, H)). Read from vLLM's qwen3_5_mtp.py (Qwen3_5MultiTokenPredictor) and llama.cpp's qwen35.cpp
    (graph_mtp), not from specdec."""
    d = torch.float64
    t = {k: v.to(d) for k, v in t.items()}
    eps, H = cfg["rms_norm_eps"], cfg["hidden_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    rope = cfg["rope_parameters"]
    rot = int(hd * rope["partial_rotary_factor"])
    p = "mtp.layers.0."
    e = _norm(embed.to(d)[tokens], t["mtp.pre_fc_norm_embedding.weight"], eps)
    h = _norm(hidden.to(d), t["mtp.pre_fc_norm_hidden.weight"], eps)
    x = torch.cat([e, h], -1) @ t["mtp.fc.weight"].T
    a = _norm(x, t[p + "input_layernorm.weight"], eps)
    T = x.shape[0]
    qg = (a @ t[p + "self_attn.q_proj.weight"].T).view(T, nh, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
    k = (a @ t[p + "self_attn.k_proj.weight"].T).view(T, nkv, hd)
    v = (a @ t[p + "self_attn.v_proj.weight"].T).view(T, nkv, hd)
    q, k = _norm(q, t[p + "self_attn.q_norm.weight"], eps), _norm(k, t[p + "self_attn.k_norm.weight"], eps)
    inv = 1.0 / (rope["rope_theta"] ** (torch.arange(0, rot, 2, dtype=d) / rot))
    ang = torch.tensor(positions, dtype=d)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]

    def rotate(y):
        r, rest = y[..., :rot], y[..., rot:]
        half = torch.cat([-r[..., rot // 2:], r[..., : rot // 2]], -1)
        return torch.cat([r * cos + half * sin, rest], -1)

    q, k = rotate(q), rotate(k)
    k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, nh * hd)
    x = x + (attn * torch.sigmoid(gate)) @ t[p + "self_attn.o_proj.weight"].T
    m = _norm(x, t[p + "post_attention_layernorm.weight"], eps)
    up = torch.nn.functional.silu(m @ t[p + "mlp.gate_proj.weight"].T) * (m @ t[p + "mlp.up_proj.weight"].T)
    x = x + up @ t[p + "mlp.down_proj.weight"].T
    out = _norm(x, t["mtp.norm.weight"], eps)
    return out @ lm_head.to(d).T, out
