"""Tiny Qwen3.5-MoE checkpoints written by the reference's own code, and its MTP block as transformers computes it.

    transformers_folder  transformers' Qwen3_5Moe classes (text: Qwen3_5MoeForCausalLM, model_type
                         qwen3_5_moe_text, which saves its experts one by one, mlp.experts.{e}.gate_proj.weight;
                         published: Qwen3_5MoeForConditionalGeneration, model_type qwen3_5_moe, a tiny vision tower
                         beside it, experts saved fused, mlp.experts.gate_up_proj), random weights rounded to
                         float16 values (llama.cpp's f16 conversion holds them exactly), save_pretrained; then an
                         MTP layer, which transformers drops, under Qwen's names (mtp.*): a full-attention layer
                         whose MLP is a mixture too, its experts one by one as Qwen publishes them
    convert_to_gguf      llama.cpp's own convert_hf_to_gguf.py (architecture qwen35moe: its ffn_*_exps stacking,
                         ffn_gate_inp_shexp, reordered value heads, ssm_a, nextn layer)
    mtp_reference        the MTP block over (h_j, x_{j+1}) pairs with transformers' own Qwen3_5MoeDecoderLayer as
                         its block (vLLM's qwen3_5_mtp.py wraps the model's decoder layer the same way)

FIXTURE (tests/model/data/qwen35moe-tiny) holds f16.gguf, llama.cpp's conversion of the text folder written with
seed 0 (fixture_folder writes that folder again: same seed, same weights), made by its make_fixture.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from helpers import llama_converter
from helpers.llama_converter import NO_TREE, llama_cpp_tree  # noqa: F401 (the tests import them from here)
from helpers.qwen35 import TEXT, VISION, mtp_tensors
from helpers.tiny import write_tokenizer_json

FIXTURE = Path(__file__).resolve().parent.parent / "model" / "data" / "qwen35moe-tiny"
NEXT_FIXTURE = Path(__file__).resolve().parent.parent / "model" / "data" / "qwen3next-tiny"

# Qwen3.5's tiny sizes (4 layers: 3 Gated DeltaNet, 1 full attention), every MLP a mixture of 4 experts of width
# 32, 2 per token, beside a shared expert of width 32 behind its sigmoid gate
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
SIZES = {**{k: v for k, v in TEXT.items() if k != "intermediate_size"}, **MOE}
# Qwen3-Next: the same sizes, plain RoPE parameters (no mrope keys), a dense MLP where mlp_only_layers says
NEXT = {**SIZES, "intermediate_size": 64, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.25}}


def _randomize(model, seed: int) -> None:
    """As helpers/qwen35's (norm weights w near 0 for 1 + w, the gated norm's near 1, A_log and dt_bias around 0,
    the router larger so that choices differ from row to row), every value a float16 one."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("linear_attn.norm.weight"):
                value = 1 + 0.1 * noise
            elif name.endswith("norm.weight"):
                value = 0.1 * noise
            elif name.endswith(("A_log", "dt_bias")):
                value = 0.5 * noise
            else:
                value = noise * (0.5 if "embed" in name or name.endswith("mlp.gate.weight") else 0.15)
            p.copy_(value.half().float())


def mtp_moe_tensors(seed: int) -> dict[str, torch.Tensor]:
    """One MTP layer under Qwen3.5-MoE's names: helpers/qwen35's dense MTP layer with its MLP a mixture (router,
    4 experts one by one, shared expert and its gate), float16 values."""
    H, E, I, S = SIZES["hidden_size"], MOE["num_experts"], MOE["moe_intermediate_size"], \
        MOE["shared_expert_intermediate_size"]
    out = {k: v for k, v in mtp_tensors(H, SIZES["num_attention_heads"], SIZES["num_key_value_heads"],
                                        SIZES["head_dim"], 32, seed).items() if ".mlp." not in k}
    g = torch.Generator().manual_seed(seed + 100)
    p = "mtp.layers.0.mlp."

    def w(*shape, scale=0.15):
        return torch.randn(*shape, generator=g) * scale

    out[p + "gate.weight"] = w(E, H, scale=0.5)
    for e in range(E):
        out.update({f"{p}experts.{e}.gate_proj.weight": w(I, H), f"{p}experts.{e}.up_proj.weight": w(I, H),
                    f"{p}experts.{e}.down_proj.weight": w(H, I)})
    out.update({p + "shared_expert.gate_proj.weight": w(S, H), p + "shared_expert.up_proj.weight": w(S, H),
                p + "shared_expert.down_proj.weight": w(H, S), p + "shared_expert_gate.weight": w(1, H)})
    return {k: v.half().float() for k, v in out.items()}


def transformers_folder(folder, layout: str = "text", seed: int = 0, tie: bool = False, mtp: bool = True,
                        fused: bool = False, **text) -> Path:
    """A tiny Qwen3.5-MoE folder written by transformers (layout "text" or "published"), MTP layer added. Its
    experts one by one (mlp.experts.{e}.gate_proj.weight ...: save_pretrained's default, the published format),
    or fused: transformers 5's own layout, mlp.experts.gate_up_proj (E, 2I, H) and down_proj (E, H, I)
    (save_pretrained(save_original_format=False)). Layout "next": Qwen3-Next (Qwen3NextForCausalLM, model_type
    qwen3_next: in_proj_qkvz and in_proj_ba fused per key head), its MTP layer undeclared as in Qwen's config."""
    from transformers import (Qwen3_5MoeConfig, Qwen3_5MoeForCausalLM, Qwen3_5MoeForConditionalGeneration,
                              Qwen3_5MoeTextConfig, Qwen3NextConfig, Qwen3NextForCausalLM)

    folder = Path(folder)
    sizes = {**(NEXT if layout == "next" else SIZES), **text, "tie_word_embeddings": tie}
    if layout == "next":
        model = Qwen3NextForCausalLM(Qwen3NextConfig(**sizes))
    elif layout == "text":
        model = Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**sizes))
    else:
        model = Qwen3_5MoeForConditionalGeneration(Qwen3_5MoeConfig(text_config=sizes, vision_config=VISION,
                                                                    tie_word_embeddings=tie))
    _randomize(model, seed)
    model.save_pretrained(folder, save_original_format=not fused)
    write_tokenizer_json(folder, sizes["vocab_size"])
    if mtp:
        weights = load_file(str(folder / "model.safetensors"))
        weights.update(mtp_moe_tensors(seed + 1))
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        if layout != "next":
            cfg = json.loads((folder / "config.json").read_text())
            (cfg.get("text_config") or cfg)["mtp_num_hidden_layers"] = 1
            (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def fixture_folder(folder, layout: str = "text") -> Path:
    """The folder FIXTURE/f16.gguf (layout "text") or NEXT_FIXTURE/f16.gguf ("next") was converted from, written
    again (seed 0)."""
    return transformers_folder(folder, layout, seed=0)


def convert_to_gguf(folder, out, outtype: str = "f16", tree: Path | None = None) -> Path:
    return llama_converter.convert_to_gguf(folder, out, outtype, tree)


def _norm(x, w, eps):  # Qwen3_5MoeRMSNorm: x / rms(x) * (1 + w)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def mtp_reference(folder, hidden: torch.Tensor, tokens: list[int], positions: list[int]):
    """(logits (T, V), out (T, H)) of the MTP layer over pairs (hidden[j], tokens[j]) at positions[j], float32:

        x = fc([pre_fc_norm_embedding(embed[x_{j+1}]); pre_fc_norm_hidden(h_j)]);  out = block(x);
        logits = lm_head(norm(out))

    block: transformers' Qwen3_5MoeDecoderLayer / Qwen3NextDecoderLayer (a full-attention layer, its MoE MLP, causal)
    holding the checkpoint's mtp.layers.0.* tensors (its experts fused as transformers keeps them)."""
    from transformers import Qwen3_5MoeTextConfig, Qwen3NextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import (Qwen3_5MoeDecoderLayer,
                                                                      Qwen3_5MoeTextRotaryEmbedding)
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextDecoderLayer, Qwen3NextRotaryEmbedding

    raw = json.loads((Path(folder) / "config.json").read_text())
    raw = {**raw, **raw.get("text_config", {})}
    nxt = raw["model_type"] == "qwen3_next"
    config_class, layer_class, rotary_class = (Qwen3NextConfig, Qwen3NextDecoderLayer, Qwen3NextRotaryEmbedding) \
        if nxt else (Qwen3_5MoeTextConfig, Qwen3_5MoeDecoderLayer, Qwen3_5MoeTextRotaryEmbedding)
    cfg = config_class(**{k: raw[k] for k in (*(NEXT if nxt else SIZES), "tie_word_embeddings") if k in raw})
    cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    cfg._attn_implementation = "eager"
    t = load_file(str(Path(folder) / "model.safetensors"))
    embed = t.get("model.embed_tokens.weight", t.get("model.language_model.embed_tokens.weight"))
    head = t.get("lm_head.weight", embed)
    E, I = cfg.num_experts, cfg.moe_intermediate_size
    p = "mtp.layers.0."
    state = {k[len(p):]: v for k, v in t.items() if k.startswith(p) and ".experts." not in k}
    state["mlp.experts.gate_up_proj"] = torch.stack([torch.cat([t[f"{p}mlp.experts.{e}.gate_proj.weight"],
                                                                t[f"{p}mlp.experts.{e}.up_proj.weight"]])
                                                     for e in range(E)])
    state["mlp.experts.down_proj"] = torch.stack([t[f"{p}mlp.experts.{e}.down_proj.weight"] for e in range(E)])
    assert state["mlp.experts.gate_up_proj"].shape == (E, 2 * I, cfg.hidden_size)
    block = layer_class(cfg, 0).eval()
    block.load_state_dict(state, strict=True)
    eps = cfg.rms_norm_eps
    with torch.no_grad():
        e = _norm(embed[tokens], t["mtp.pre_fc_norm_embedding.weight"], eps)
        x = torch.cat([e, _norm(hidden, t["mtp.pre_fc_norm_hidden.weight"], eps)], -1) @ t["mtp.fc.weight"].T
        pos = torch.tensor([positions])
        rope = rotary_class(cfg)(x[None], pos)
        T = x.shape[0]
        mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
        out = block(x[None], position_embeddings=rope, attention_mask=mask, position_ids=pos)
        out = (out[0] if isinstance(out, tuple) else out)[0]
        normed = _norm(out, t["mtp.norm.weight"], eps)
        return normed @ head.T, normed
