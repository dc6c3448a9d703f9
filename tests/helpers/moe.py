"""Tiny mixture-of-experts checkpoints written by the reference's own code, and llama.cpp's conversion of them.

    transformers_folder  transformers' Qwen3MoeForCausalLM or Glm4MoeForCausalLM (config and model classes),
                         every parameter and GLM's selection bias random, saved with save_pretrained
    convert_to_gguf      llama.cpp's own convert_hf_to_gguf.py on such a folder (its ffn_*_exps stacking, its
                         expert_* metadata), from $LLAMA_CPP_DIR or the source tree above $LLAMA_CPP_BIN. The tiny
                         tokenizer's pre-tokenizer is named "default" and GLM's vocabulary is read as a plain BPE
                         one (the converter wants GLM's own special tokens): the text is not what is tested.

FIXTURE (tests/model/data/moe-tiny) holds each family's f16 conversion (<family>.gguf; glm4_moe_mtp.gguf: the
GLM-4.5 with its nextn layer, mtp_folder), made by
tests/model/data/moe-tiny/make_fixture.py, so the fast suite reads llama.cpp's files on any machine; the folder
it was converted from is written again by transformers_folder (same seed, same weights: fixture_folder).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from helpers import llama_converter
from helpers.llama_converter import NO_TREE, llama_cpp_tree  # noqa: F401 (the tests import them from here)
from helpers.tiny import write_tokenizer_json

FIXTURE = Path(__file__).resolve().parent.parent / "model" / "data" / "moe-tiny"
FAMILIES = ("qwen3_moe", "glm4_moe")

# 2 layers, 8 experts of width 32, 2 per token. Every weight a float16 value, so that llama.cpp's f16 conversion
# (half the bytes of f32: the fixture files stay under 200 KB) holds exactly the weights transformers computes with
COMMON = dict(vocab_size=272, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6,
              num_experts_per_tok=2, moe_intermediate_size=32, bos_token_id=None, eos_token_id=2,
              pad_token_id=None, tie_word_embeddings=False)
SIZES = {
    # every layer a mixture (llama.cpp's qwen3moe has no dense layers: mlp_only_layers stays empty)
    "qwen3_moe": dict(num_experts=8, norm_topk_prob=True, mlp_only_layers=[], decoder_sparse_step=1,
                      rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
    # the first layer dense, a shared expert, half of each head rotated, routed weights scaled;
    # n_group 1: llama.cpp's glm4moe has no group-limited choice (GLM-4.5's n_group is 1)
    "glm4_moe": dict(n_routed_experts=8, n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1,
                     routed_scaling_factor=2.5, norm_topk_prob=True, use_qk_norm=False, attention_bias=True,
                     num_nextn_predict_layers=0,
                     rope_parameters={"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.5}),
}


def reference_classes(family: str):
    import transformers

    return {"qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
            "glm4_moe": (transformers.Glm4MoeConfig, transformers.Glm4MoeForCausalLM)}[family]


def _randomize(model, seed: int) -> None:
    """Every parameter random (norm weights near 1, matrices small, the embedding larger) and rounded to float16,
    and GLM's selection bias (a buffer) large enough to change some choices."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            value = 1 + 0.1 * noise if name.endswith("norm.weight") else \
                noise * (0.5 if "embed" in name else 0.2 if "gate.weight" in name else 0.15)
            p.copy_(value.half().float())
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_((0.1 * torch.randn(b.shape, generator=g)).half().float())


def transformers_folder(folder, family: str, seed: int = 0, **sizes) -> Path:
    """A tiny checkpoint transformers writes for `family` (qwen3_moe or glm4_moe)."""
    config_class, model_class = reference_classes(family)
    folder = Path(folder)
    model = model_class(config_class(**{**COMMON, **SIZES[family], **sizes}))
    _randomize(model, seed)
    model.save_pretrained(folder)
    write_tokenizer_json(folder, COMMON["vocab_size"])
    return folder


def fixture_folder(folder, family: str) -> Path:
    """The folder FIXTURE/<family>.gguf was converted from (transformers' classes, seed 0), written again."""
    return mtp_folder(folder, seed=0) if family == "glm4_moe_mtp" else transformers_folder(folder, family, seed=0)


def reference(folder):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


_GLM_PRELUDE = """sys.path.insert(0, sys.argv[1] + "/gguf-py")
import conversion.glm as glm
glm.Glm4MoeModel.set_vocab = lambda self: self._set_vocab_gpt2()"""


def convert_to_gguf(folder, out, outtype: str = "f16", tree: Path | None = None) -> Path:
    """llama.cpp's converter on `folder` (GLM's vocabulary read as GPT-2's BPE) -> the GGUF file `out`."""
    return llama_converter.convert_to_gguf(folder, out, outtype, tree, _GLM_PRELUDE)


def mtp_folder(folder, seed: int = 0, n_routed_experts: int = 4, **sizes) -> Path:
    """A tiny GLM-4.5 with one nextn (MTP) layer under GLM's names, model.layers.2.*: its block is the third
    decoder layer transformers' own Glm4MoeForCausalLM builds (attention, the mixture, its shared expert and
    selection bias), beside it enorm, hnorm, eh_proj, shared_head.norm and GLM's copies of the embedding and
    head (shared_head.head, embed_tokens). config.json says 2 layers and num_nextn_predict_layers 1, as GLM's
    files do; transformers 5.24 drops the nextn layer on load (from_pretrained(..., num_hidden_layers=3) keeps
    its block as layer 2: the reference block). 4 experts: its f16 conversion stays under 200 KB."""
    from safetensors.torch import load_file, save_file

    folder = transformers_folder(folder, "glm4_moe", seed, num_hidden_layers=3, n_routed_experts=n_routed_experts,
                                 **sizes)
    weights = load_file(str(folder / "model.safetensors"))
    g = torch.Generator().manual_seed(seed + 1)
    H = COMMON["hidden_size"]

    def f16(t):
        return t.half().float()

    p = "model.layers.2."
    weights.update({p + "enorm.weight": f16(1 + 0.1 * torch.randn(H, generator=g)),
                    p + "hnorm.weight": f16(1 + 0.1 * torch.randn(H, generator=g)),
                    p + "eh_proj.weight": f16(0.15 * torch.randn(H, 2 * H, generator=g)),
                    p + "shared_head.norm.weight": f16(1 + 0.1 * torch.randn(H, generator=g)),
                    p + "shared_head.head.weight": weights["lm_head.weight"].clone(),
                    p + "embed_tokens.weight": weights["model.embed_tokens.weight"].clone()})
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(num_hidden_layers=2, num_nextn_predict_layers=1)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder
