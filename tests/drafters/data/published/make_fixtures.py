"""How the fixtures in this folder were made (not run by the tests): tiny drafter heads built by each
publisher's own classes and written by its own save path, of which config.json is kept as written and the
weights as their names, dtypes and shapes (tensors.json); tests build random tensors of those names and
shapes. Sizes fit the tiny test target (hidden 64, 4 heads, 2 kv heads, vocabulary 512, 2 layers).

    python make_fixtures.py OUT SPECULATORS_SITE SPECFORGE_SRC EAGLE_SRC ZLAB_MODEL_PY DEEPSPEC_SRC

    SPECULATORS_SITE  a folder holding the `speculators` package (the 0.9.0 wheel, unpacked)
    SPECFORGE_SRC     a checkout of sgl-project/SpecForge (its specforge/ package)
    EAGLE_SRC         a checkout of SafeAILab/EAGLE (its eagle/model/ package)
    ZLAB_MODEL_PY     z-lab/dflash's dflash/model.py
    DEEPSPEC_SRC      a checkout of deepseek-ai/DeepSpec (its deepspec/ package)

The packages' imports that only their trainers need (datasets, hs_connectors) are stubbed; nothing else is.
"""

import importlib
import importlib.machinery
import json
import sys
import types
from pathlib import Path

import torch
from transformers import LlamaConfig, Qwen3Config

SIZES = dict(vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             rms_norm_eps=1e-6, max_position_embeddings=512)


def package(name: str, path: str) -> None:
    """Import `name`'s submodules from `path` without running its __init__ (which imports its trainer)."""
    pkg = types.ModuleType(name)
    pkg.__path__ = [path]
    sys.modules[name] = pkg


def stub(name: str) -> None:
    class Any(types.ModuleType):
        def __getattr__(self, attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return type(attr, (), {})

    mod = Any(name)
    mod.__spec__, mod.__path__ = importlib.machinery.ModuleSpec(name, None), []
    sys.modules[name] = mod


def keep(folder: Path, state: dict | None = None) -> None:
    """Replace the weights in `folder` by tensors.json: {name: [dtype, shape]}."""
    if state is None:
        from safetensors import safe_open

        file = folder / "model.safetensors"
        with safe_open(str(file), framework="pt") as f:
            state = {n: f.get_slice(n) for n in f.keys()}
        header = {n: [s.get_dtype(), list(s.get_shape())] for n, s in state.items()}
        file.unlink()
    else:
        names = {torch.float32: "F32", torch.int64: "I64", torch.bool: "BOOL", torch.bfloat16: "BF16"}
        header = {n: [names[t.dtype], list(t.shape)] for n, t in state.items()}
    lines = ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(header.items()))
    (folder / "tensors.json").write_text("{\n" + lines + "\n}\n")
    for extra in ("config.py", "generation_config.json"):
        if (folder / extra).exists():
            (folder / extra).unlink()


def speculators(out: Path, site: str) -> None:
    sys.path.insert(0, site)
    stub("datasets")
    stub("hs_connectors")
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    def make(name, layer_cls, norm_before_residual, **extra):
        layer = {"rope_theta": 1e6} if layer_cls is Qwen3Config else {}
        tl = layer_cls(intermediate_size=128, num_hidden_layers=1, hidden_act="silu", **SIZES, **layer)
        cfg = Eagle3SpeculatorConfig(
            transformer_layer_config=tl, draft_vocab_size=170, norm_before_residual=norm_before_residual,
            eagle_aux_hidden_state_layer_ids=[0, 1, 2],
            speculators_config=SpeculatorsConfig(
                algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
                default_proposal_method="greedy",
                verifier=VerifierConfig(name_or_path="tiny-llama", architectures=["LlamaForCausalLM"])),
            **extra)
        torch.manual_seed(0)
        Eagle3DraftModel(cfg).save_pretrained(out / name)
        keep(out / name)

    make("speculators-eagle3", LlamaConfig, False)
    make("speculators-eagle3-qwen3", Qwen3Config, True)
    make("speculators-eagle3-fc-norm", LlamaConfig, False, fc_norm=True, norm_output=True)
    make("speculators-eagle3-norm-before-fc", LlamaConfig, True, norm_before_fc=True)


def specforge(out: Path, src: str) -> None:
    sys.path.insert(0, src)
    package("specforge", f"{src}/specforge")
    mod = importlib.import_module("specforge.modeling.draft.llama3_eagle")
    base = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_act": "silu", "intermediate_size": 128,
            "model_type": "llama", "num_hidden_layers": 1, "rope_theta": 10000.0, "tie_word_embeddings": False,
            "draft_vocab_size": 170, **SIZES}
    for name, extra in (("specforge-eagle3", {}), ("specforge-eagle3.1", {"fc_norm": True, "norm_output": True})):
        torch.manual_seed(0)
        model = mod.LlamaForCausalLMEagle3(LlamaConfig(**base, **extra))
        # as specforge/export/to_sglang.py exports it: the state without the embedding
        state = {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}
        model.save_pretrained(out / name, state_dict=dict(state))
        keep(out / name)


def eagle(out: Path, src: str) -> None:
    """EAGLE-3 (eagle/model/cnets.py) and EAGLE-1/2 (cnets1.py) heads, saved as EAGLE publishes them: the
    drafting layer's state dict in pytorch_model.bin (EAGLE-3's frozen embedding left out, as its trainer's
    save_16bit_model(exclude_frozen_parameters=True) leaves it)."""
    sys.path.insert(0, src)
    package("eagle", f"{src}/eagle")
    package("eagle.model", f"{src}/eagle/model")
    from eagle.model.configs import EConfig

    for name, module, config, exclude in (("eagle-eagle3", "cnets", "eagle/traineagle3/config.json", "embed"),
                                          ("eagle-eagle1", "cnets1", "eagle/train/llama_2_chat_7B_config.json", None)):
        raw = json.loads(Path(src, config).read_text())
        raw.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, bos_token_id=1, eos_token_id=2,
                   num_key_value_heads=2 if module == "cnets" else 4, vocab_size=512)
        if module == "cnets":
            raw["draft_vocab_size"] = 170
        (out / name).mkdir(parents=True, exist_ok=True)
        (out / name / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
        cfg = EConfig.from_pretrained(str(out / name / "config.json"))
        cfg.rope_scaling = None  # transformers 5 fills a default dict; EAGLE (written for 4.x) reads None
        torch.manual_seed(0)
        model = importlib.import_module(f"eagle.model.{module}").Model(cfg, load_emb=False)
        state = {k: v for k, v in model.state_dict().items() if exclude is None or exclude not in k}
        keep(out / name, state)


def zlab(out: Path, model_py: str) -> None:
    sys.path.insert(0, str(Path(model_py).parent))
    zl = importlib.import_module(Path(model_py).stem)
    cfg = Qwen3Config(intermediate_size=96, num_hidden_layers=2, rope_theta=10000.0, tie_word_embeddings=False,
                      **SIZES)
    cfg.architectures, cfg.auto_map = ["DFlashDraftModel"], {"AutoModel": "dflash.DFlashDraftModel"}
    cfg.block_size, cfg.num_target_layers = 4, 2
    cfg.dflash_config = {"mask_token_id": 300, "target_layer_ids": [0, 1]}
    torch.manual_seed(0)
    zl.DFlashDraftModel(cfg).save_pretrained(out / "zlab-dflash")
    keep(out / "zlab-dflash")


def deepspec(out: Path, src: str) -> None:
    sys.path.insert(0, src)
    for name in ("deepspec", "deepspec.modeling", "deepspec.utils"):
        package(name, f"{src}/{name.replace('.', '/')}")
    build = importlib.import_module("deepspec.modeling.dspark.qwen3.config").build_draft_config
    model_cls = importlib.import_module("deepspec.modeling.dspark.qwen3.modeling").Qwen3DSparkModel

    class Args(dict):
        __getattr__ = dict.__getitem__

    target = Qwen3Config(intermediate_size=96, num_hidden_layers=2, rope_theta=10000.0, tie_word_embeddings=False,
                         **SIZES)
    args = Args(num_draft_layers=2, target_layer_ids=[-1, 1], block_size=4, mask_token_id=300, num_anchors=64,
                markov_rank=8, markov_head_type="vanilla", confidence_head_alpha=1.0, confidence_head_with_markov=True)
    torch.manual_seed(0)
    model_cls(build(target, args)).save_pretrained(out / "deepspec-dspark")
    keep(out / "deepspec-dspark")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    speculators(out, sys.argv[2])
    specforge(out, sys.argv[3])
    eagle(out, sys.argv[4])
    zlab(out, sys.argv[5])
    deepspec(out, sys.argv[6])
