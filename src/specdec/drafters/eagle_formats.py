"""EAGLE head folders as they are published, read unchanged: which layout a folder is, its config.json in
the flat terms Eagle3Config reads, its tensors under Eagle3Head's names, and pickled .bin weights read
without unpickling anything but tensors. Also the speculators config.json specdec writes.

    layout       config.json                                              tensors (as the file names them)
    speculators  vLLM's speculators library: speculators_model_type      fc, layers.0.*, norm, lm_head, d2t, t2d;
                 "eagle3", the layer's sizes nested under                 embed_tokens, input_norm (norm_before_fc),
                 transformer_layer_config (llama, or qwen3 with q/k       fc_norm.{i} (fc_norm) where it has them
                 norms), eagle_aux_hidden_state_layer_ids,
                 norm_before_residual, norm_before_fc, fc_norm,
                 norm_output (the normed state is fed back)
    eagle        flat sizes and draft_vocab_size: SpecForge and specdec   fc, midlayer.* (or layers.0.*), norm,
                 (LlamaForCausalLMEagle3), SafeAILab EAGLE                lm_head, d2t, t2d, [embed_tokens,
                 (LlamaForCausalLM); eagle_config's taps; SpecForge's     fc_norm.{i}], in *.safetensors or
                 fc_norm, and norm_output (false: no norm before          EAGLE's pytorch_model.bin
                 lm_head)
    EAGLE-1/2    flat sizes, no draft vocabulary; or speculators "eagle"  fc (H, 2H), layers.0.*: refused, named

Published heads differ from one another only in these names and switches; the head they describe is the
one Eagle3Head computes.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from safetensors import safe_open

from specdec.model.errors import ModelFileError, SpecdecError
from specdec.model.files import safetensors_header

SPECULATORS, EAGLE = "speculators", "eagle"
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose Eagle3DraftModel config.json save_config follows
_HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                     "gemma3": "Gemma3ForCausalLM"}


class Eagle3Error(SpecdecError):
    pass


def eagle12_error(path) -> Eagle3Error:
    return Eagle3Error(f"{path} is an EAGLE-1/2 head (fc over [embedding; last hidden state], one decoder layer): "
                       "specdec runs EAGLE-3 heads, which read three of the target's layers; use an EAGLE-3 head "
                       "for this model (SafeAILab EAGLE, SpecForge and vLLM's speculators publish them), or train "
                       "one with `specdec train eagle3`")


def layout_of(raw: dict) -> str:
    return SPECULATORS if raw.get("speculators_model_type") is not None else EAGLE


def flat_config(raw: dict, where) -> dict:
    """A head's config.json with the keys Eagle3Config.from_json reads at the top level, and `layout`.

    A speculators config's sizes come out of transformer_layer_config and its taps out of
    eagle_aux_hidden_state_layer_ids; its norm_output becomes feed_normed (the state fed back is normed).
    A flat config's norm_output (SpecForge's: whether a norm comes before lm_head) becomes final_norm."""
    if layout_of(raw) == EAGLE:
        out = {k: v for k, v in raw.items() if k not in ("layout", "feed_normed", "final_norm")}
        out.update(layout=EAGLE, final_norm=raw.get("norm_output", True) is not False)
        return out
    kind = raw["speculators_model_type"]
    if kind == "eagle":
        raise eagle12_error(where)
    if kind != "eagle3":
        raise Eagle3Error(f"{where} is a speculators {kind!r} drafter, not an EAGLE-3 head (speculators_model_type)")
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise Eagle3Error(f"{where}/config.json lacks 'transformer_layer_config' (the speculators format nests the "
                          "decoder layer's sizes there)")
    out = {k: v for k, v in layer.items() if k not in ("draft_vocab_size", "eagle_config")}
    for key in ("draft_vocab_size", "target_hidden_size", "norm_before_residual", "norm_before_fc", "fc_norm"):
        if raw.get(key) is not None:
            out[key] = raw[key]
    if raw.get("eagle_aux_hidden_state_layer_ids") is not None:
        out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": raw["eagle_aux_hidden_state_layer_ids"]}
    out.update(layout=SPECULATORS, feed_normed=bool(raw.get("norm_output")), final_norm=True)
    return out


def own_name(name: str) -> str:
    """A file's tensor name as Eagle3Head names it: `layers.0.` is `midlayer.`; no `model.` prefix."""
    name = name.removeprefix("model.")
    return "midlayer." + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name


def is_eagle12(raw: dict, shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether a flat config and its tensors (own names) are an EAGLE-1/2 head: no draft vocabulary and an fc
    over [embedding; hidden] (2H wide, often with a bias), or an EAGLE model_type / architecture without 3."""
    if layout_of(raw) == SPECULATORS:
        return raw.get("speculators_model_type") == "eagle"
    text = " ".join([str(raw.get("model_type", ""))] + [str(a) for a in raw.get("architectures") or []]).lower()
    if "eagle3" in text or raw.get("draft_vocab_size") is not None or raw.get("eagle_config") is not None:
        return False
    fc = shapes.get("fc.weight")
    two_wide = fc is not None and len(fc) == 2 and fc[1] == 2 * fc[0]
    return "eagle" in text or two_wide or "fc.bias" in shapes


def is_eagle_folder(raw: dict, path) -> bool:
    """Whether a folder whose config.json names no EAGLE architecture holds an EAGLE head all the same, as
    SafeAILab's are published (architectures LlamaForCausalLM): one layer, and a draft vocabulary or an `fc`
    beside a first layer among its tensors (a language model's are model.*)."""
    if raw.get("num_hidden_layers") != 1:
        return False
    if raw.get("draft_vocab_size") is not None:
        return True
    try:
        files = weight_files(Path(path))
        names = set(read_shapes(files)) if files else set()
    except Eagle3Error:
        return False
    return "fc.weight" in names and any(n.startswith("midlayer.") for n in names)


def weight_files(path: Path) -> list[Path]:
    """The folder's *.safetensors files, else its pickled *.bin ones (EAGLE's pytorch_model.bin)."""
    return sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))


def read_pickled(file: Path) -> dict[str, torch.Tensor]:
    """A pytorch_model.bin's tensors by name, through torch.load(weights_only=True): a pickle that holds anything
    but tensors and plain containers (code to run, objects to build) is refused, never unpickled."""
    try:
        try:
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # the pre-zip format cannot be memory-mapped
            state = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise Eagle3Error(f"{file}: refused: this pickle holds more than tensors ({first[:160]}), and specdec "
                          "never unpickles objects; convert the head to safetensors where it came from") from None
    except Exception as exc:  # truncated, not a torch file
        raise Eagle3Error(f"{file}: not a readable PyTorch weights file ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise Eagle3Error(f"{file}: holds a {type(state).__name__}, not a mapping of tensor names to tensors")
    return state


def read_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """{own name: shape} of every tensor in the weight files (safetensors: the headers only)."""
    shapes = {}
    for f in files:
        try:
            pairs = ((n, s) for n, (_, s) in safetensors_header(f).items()) if f.suffix == ".safetensors" else \
                ((n, tuple(t.shape)) for n, t in read_pickled(f).items())
            for name, shape in pairs:
                shapes[own_name(name)] = tuple(shape)
        except ModelFileError as exc:
            raise Eagle3Error(str(exc)) from None
    return shapes


def read_tensors(files: list[Path], names=None) -> dict[str, torch.Tensor]:
    """{own name: tensor} of the weight files, or of the own names in `names` only."""
    out = {}
    for f in files:
        if f.suffix != ".safetensors":
            out.update({own_name(n): t for n, t in read_pickled(f).items() if names is None or own_name(n) in names})
            continue
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    if names is None or own_name(name) in names:
                        out[own_name(name)] = fh.get_tensor(name)
        except Exception as exc:  # safetensors' own error type: data cut short after a whole header
            raise Eagle3Error(f"{f}: not a readable safetensors file ({exc})") from None
    return out


def speculators_config(cfg, target_info: dict | None) -> dict:
    """config.json of a one-layer llama EAGLE-3 head in the speculators format (Eagle3DraftModel, as speculators
    0.9 writes it, which vLLM serves; speculators' own Eagle3SpeculatorConfig reads it). cfg: an Eagle3Config."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, **dict(cfg.rope_scaling or ())}
    layer = {
        "model_type": "qwen3" if cfg.qk_norm else "llama", "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size, "num_hidden_layers": 1,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
        "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps, "max_position_embeddings": cfg.max_positions,
        "rope_parameters": rope, "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    }
    target = (target_info or {}).get("names") or [None]
    arch = _HF_ARCHITECTURES.get((target_info or {}).get("arch"))
    return {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION, "dtype": "bfloat16", "tie_word_embeddings": False,
        "draft_vocab_size": cfg.draft_vocab_size, "target_hidden_size": cfg.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(cfg.taps), "norm_before_residual": cfg.norm_before_residual,
        "norm_before_fc": cfg.input_norm, "fc_norm": cfg.fc_norm, "norm_output": cfg.feed_normed,
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3", "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1,
                                  "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": target[0], "architectures": [arch] if arch else []},
        },
        "transformer_layer_config": layer,
    }


def speculators_name(name: str) -> str:
    """Eagle3Head's tensor name as the speculators format stores it (`midlayer.` is `layers.0.`)."""
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name
