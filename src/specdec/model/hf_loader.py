"""Read a Hugging Face folder: config.json + safetensors (one file or sharded). Never unpickles."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from specdec.model.config import (ModelConfig, linear_rope_factors, llama3_rope_factors, rope_theta_of,
                                  unsupported_reason)
from specdec.model.errors import ModelFileError
from specdec.model.files import read_json_object, safetensors_header
from specdec.model.gemma4_checkpoint import PUBLISHED as GEMMA4_PUBLISHED
from specdec.model.gemma4_checkpoint import gemma4_config, published_text, text_names
from specdec.model.moe_config import moe_from_hf
from specdec.model import qwen3next_checkpoint as qwen3next
from specdec.model.qwen3next_checkpoint import fused_rows
from specdec.model.qwen35_checkpoint import (HYBRID_ARCHS, PUBLISHED, adds_one, qwen35_config, text_config,
                                             text_tensor_name)

# model_type -> the family specdec runs it as. MiMo (Xiaomi) is a Qwen2 body whose MTP layers sit
# under model.mtp_layers.* (drafters/mtp.py reads them; auto turns draft-mtp on).
_ARCH_BY_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "mimo": "qwen2", "gemma3_text": "gemma3",
                       "qwen3_moe": "qwen3moe", "glm4_moe": "glm4moe",
                       "qwen3_5_text": "qwen35", "qwen3_5": "qwen35",  # Qwen3.5: model/qwen35_checkpoint.py
                       "qwen3_5_moe_text": "qwen35moe", "qwen3_5_moe": "qwen35moe", "qwen3_next": "qwen3next",
                       "gemma4_text": "gemma4", "gemma4": "gemma4"}  # Gemma 4: model/gemma4_checkpoint.py
# config.json activation names -> ModelConfig.mlp_act
_ACTIVATIONS = {None: "silu", "silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


@dataclass
class HFModel:
    path: Path
    config: ModelConfig
    raw_config: dict
    quant: str
    _files: dict = field(repr=False, default_factory=dict)  # tensor name -> safetensors file
    _stored: dict = field(repr=False, default_factory=dict)  # tensor name -> its name in the file, where they differ
    _rows: dict = field(repr=False, default_factory=dict)  # name -> (tensor, row indices): rows of a fused tensor

    def names(self) -> list[str]:
        return list(self._files) + list(self._rows)

    def get(self, name: str) -> torch.Tensor:
        """The tensor in float32; a Gemma norm weight w as the multiplier 1 + w it stands for (Gemma3RMSNorm
        computes 1.0 + w.float(); llama.cpp's converter stores the same sum)."""
        if name in self._rows:  # Qwen3-Next's fused projections, read under Qwen3.5's names
            fused, rows = self._rows[name]
            return self.get(fused)[rows]
        if name not in self._files:
            raise ModelFileError(self.path, f"tensor {name} is missing (config.json implies it)")
        with safe_open(self._files[name], framework="pt") as f:
            t = f.get_tensor(self._stored.get(name, name)).float()
        arch = self.config.arch
        if arch == "gemma3" and name.endswith("norm.weight") or arch in HYBRID_ARCHS and adds_one(name):
            t = 1.0 + t
        return t


def read_hf_folder(path: str | os.PathLike) -> HFModel:
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelFileError(path, "no config.json in this folder")
    raw = read_json_object(cfg_file)
    try:
        raw = text_config(raw)  # a published Qwen3.5 folder: its text model
        raw = published_text(raw) if raw.get("model_type") == GEMMA4_PUBLISHED else raw  # Gemma 4's, likewise
    except ValueError as exc:
        raise ModelFileError(path, str(exc)) from None
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        bins = sorted(path.glob("*.bin")) + sorted(path.glob("*.pt"))
        hint = " (pickled .bin weights are never loaded; convert them to safetensors)" if bins else ""
        raise ModelFileError(path, f"no .safetensors weights in this folder{hint}")
    index_file = path / "model.safetensors.index.json"
    if index_file.is_file():  # the shards it names must all be there (an interrupted download lacks the last)
        weight_map = read_json_object(index_file).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelFileError(index_file, "has no weight_map object")
        named = sorted({str(v) for v in weight_map.values()})
        absent = [n for n in named if not (path / n).is_file()]
        if absent:
            raise ModelFileError(path, f"{absent[0]}, named by model.safetensors.index.json, is missing "
                                 f"({len(absent)} of {len(named)} shards missing)")
        shards = [path / n for n in named]
    files, dtypes = {}, set()
    weight_dtypes = set()
    for shard in shards:
        for name, (dtype, _) in safetensors_header(shard).items():
            if name.endswith("weight"):
                weight_dtypes.add(dtype)
            if name in files:  # a stale file beside the shards: which copy is meant is unknown
                raise ModelFileError(path, f"tensor {name} is in both {files[name].name} and {shard.name}")
            files[name] = shard
            dtypes.add(dtype)
    _refuse_quantized(path, raw, weight_dtypes, files)
    stored = {}
    if raw.get("model_type") in PUBLISHED:  # the text model's tensors by its own names; the vision tower left out
        stored = {text_tensor_name(name): name for name in files if text_tensor_name(name) is not None}
        files = {name: files[original] for name, original in stored.items()}
    if raw.get("model_type") == GEMMA4_PUBLISHED:
        stored = text_names(files)
        files = {name: files[original] for name, original in stored.items()}
    config = config_from_hf(path, raw, files)
    quant = "BF16" if "BF16" in dtypes else "F16" if "F16" in dtypes else "F32"
    rows = fused_rows(files, config.linear_attention) if config.arch == qwen3next.ARCH else {}
    model = HFModel(path, config, raw, quant, files, stored, rows)
    for name in ("model.embed_tokens.weight", "model.norm.weight"):
        if name not in files:
            raise ModelFileError(path, f"tensor {name} is missing")
    return model


_QUANT_PARTS = ("qweight", "qzeros", "scales", "weight_scale", "weight_scale_inv", "SCB", "absmax")


def _refuse_quantized(path, raw: dict, weight_dtypes: set[str], names) -> None:
    """Quantized weights (FP8, int8, GPTQ/AWQ codes) hold codes whose scales live elsewhere: read as plain values
    they compute another model. A float re-save that kept its quantization_config loads."""
    odd = sorted(weight_dtypes - {"F32", "F16", "BF16", "F64"})
    parts = next((n for n in names if n.rsplit(".", 1)[-1] in _QUANT_PARTS), None)
    if not odd and parts is None:
        return
    quantized = raw.get("quantization_config")
    method = quantized.get("quant_method", "?") if isinstance(quantized, dict) else quantized
    what = f"weights of type {odd[0]}" if odd else f"a quantization tensor ({parts})"
    raise ModelFileError(path, f"a quantized checkpoint ({what}; quantization_config: {method}): specdec reads "
                         "float weights (F32, F16, BF16) from a folder; use the unquantized folder, or a GGUF file")


def _tied(path, raw: dict, tensor_names, default: bool = False) -> bool:
    """Whether the output head is the embedding: config.json says so, or (no word from it) there is no lm_head."""
    if "lm_head.weight" in tensor_names:
        return bool(raw.get("tie_word_embeddings", default))
    if raw.get("tie_word_embeddings") is False:  # the head's own weights are missing, not shared
        raise ModelFileError(path, "tensor lm_head.weight is missing, and config.json says tie_word_embeddings: "
                             "false (the embedding is not the head)")
    return True


def config_from_hf(path, raw: dict, tensor_names) -> ModelConfig:
    _check_types(path, raw)
    raw = {key: value for key, value in raw.items() if value is not None}  # null: the default, as if absent
    model_type = raw.get("model_type")
    arch = _ARCH_BY_MODEL_TYPE.get(model_type)
    if arch is None:
        raise ModelFileError(path, "model_type " + unsupported_reason(str(model_type), ", ".join(_ARCH_BY_MODEL_TYPE)))
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        head_dim = int(raw.get("head_dim") or hidden // heads)
        if arch == "gemma3":
            return _gemma3_config(path, raw, tensor_names)
        if arch == "gemma4":
            return gemma4_config(path, raw, _tied(path, raw, tensor_names, default=True))
        if arch in HYBRID_ARCHS:
            return qwen35_config(path, raw, _tied(path, raw, tensor_names))
        theta = rope_theta_of(raw, 10000.0)
        rope_dims = _rotary_dims(path, raw, model_type, head_dim)
        return ModelConfig(
            arch=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            intermediate_size=int(raw["intermediate_size"]),
            rope_theta=theta,
            rope_freq_factors=_rope_factors(path, raw, rope_dims or head_dim, theta),
            rope_dims=rope_dims,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            context_length=int(raw.get("max_position_embeddings", 4096)),
            # Qwen2 (and MiMo) always have q/k/v biases: transformers' Qwen2 ignores attention_bias
            qkv_bias=arch == "qwen2" or bool(raw.get("attention_bias", False)),
            qk_norm=arch in ("qwen3", "qwen3moe") or bool(raw.get("use_qk_norm", False)),
            tie_embeddings=_tied(path, raw, tensor_names),
            mtp_layers_declared=int(raw.get("num_nextn_predict_layers") or raw.get("mtp_num_hidden_layers") or 0),
            mlp_act=_ACTIVATIONS[_activation(raw, arch)],
            moe=moe_from_hf(raw, model_type, int(raw["num_hidden_layers"])) if arch in ("qwen3moe", "glm4moe") else None,
        )
    except KeyError as exc:
        raise ModelFileError(path, f"config.json lacks {exc.args[0]!r}") from None
    except ValueError as exc:  # ModelConfig's own checks (sizes that do not fit together)
        raise ModelFileError(path, f"config.json: {exc}") from None


# config.json keys specdec reads, by the JSON type each must have; null counts as absent (its default).
_SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
          "num_key_value_heads", "head_dim", "max_position_embeddings", "sliding_window_pattern",
          "num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
          "n_group", "topk_group", "decoder_sparse_step")
_COUNTS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "sliding_window", "n_shared_experts",
           "first_k_dense_replace", "shared_expert_intermediate_size")
_NUMBERS = ("rope_theta", "rms_norm_eps", "partial_rotary_factor", "query_pre_attn_scalar",
            "final_logit_softcapping", "attn_logit_softcapping", "rope_local_base_freq", "routed_scaling_factor")
_FLAGS = ("attention_bias", "tie_word_embeddings", "mlp_bias", "use_sliding_window", "use_bidirectional_attention",
          "norm_topk_prob", "use_qk_norm")
_OBJECTS = ("rope_scaling", "rope_parameters")
_TEXTS = ("model_type", "hidden_act", "hidden_activation")


def _check_types(path, raw: dict) -> None:
    """A clear error for a config.json value of the wrong JSON type or out of range (a size of 0, a layer
    count of 2.5, rope_scaling as a string), which would otherwise be a traceback or, worse, read as
    something else (num_key_value_heads 0 as 'all heads')."""
    def bad(key, want):
        return ModelFileError(path, f"config.json {key} is {raw[key]!r}; expected {want}")

    def whole(value):
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()

    for key in (k for k in raw if raw[k] is not None):
        value = raw[key]
        if key in _SIZES and not (whole(value) and value >= 1):
            raise bad(key, "a whole number of at least 1")
        if key in _COUNTS and not (whole(value) and value >= 0):
            raise bad(key, "a whole number of at least 0")
        if key in _NUMBERS and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                    and math.isfinite(value)):
            raise bad(key, "a finite number")
        if key in _FLAGS and not isinstance(value, bool) and not (  # Gemma 4 names which tokens attend both ways
                key == "use_bidirectional_attention" and value in ("vision", "all")):
            raise bad(key, "true or false")
        if key in _OBJECTS and not isinstance(value, dict):
            raise bad(key, "an object of settings")
        if key in _TEXTS and not isinstance(value, str):
            raise bad(key, "a string")
    if raw.get("rms_norm_eps") is not None and raw["rms_norm_eps"] < 0:
        raise bad("rms_norm_eps", "a number of at least 0")
    for key in ("rope_theta", "query_pre_attn_scalar", "final_logit_softcapping", "rope_local_base_freq"):
        if raw.get(key) is not None and raw[key] <= 0:  # a negative scalar made the attention scale complex
            raise bad(key, "a positive number")
    for key, value in (raw.get("rope_parameters") or {}).items():
        if key in ("full_attention", "sliding_attention") and value is not None and not isinstance(value, dict):
            raise ModelFileError(path, f"config.json rope_parameters.{key} is {value!r}; expected an object of "
                                 "settings")
    layer_types = raw.get("layer_types")
    if layer_types is not None and not (isinstance(layer_types, list) and all(isinstance(t, str) for t in layer_types)):
        raise bad("layer_types", "a list of layer type names")


def _gemma3_config(path, raw: dict, tensor_names) -> ModelConfig:
    """Gemma 3 text (Gemma3TextConfig, transformers 4.5x and 5.x layouts): local layers by layer_types
    (or every sliding_window_pattern-th layer global), their own RoPE base, query_pre_attn_scalar."""
    _refuse_unknown_math(path, raw)
    if raw.get("attn_logit_softcapping") is not None:
        raise ModelFileError(path, f"attn_logit_softcapping {raw['attn_logit_softcapping']} is set: specdec does not "
                             "cap attention scores (Gemma 2 does; Gemma 3 does not)")
    if raw.get("use_bidirectional_attention"):
        raise ModelFileError(path, "use_bidirectional_attention is true (an embedding model): specdec generates "
                             "with causal attention only")
    layers = int(raw["num_hidden_layers"])
    layer_types = raw.get("layer_types")
    if layer_types is None:
        pattern = int(raw.get("sliding_window_pattern") or 6)
        layer_types = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    if len(layer_types) != layers or set(layer_types) - {"sliding_attention", "full_attention"}:
        raise ModelFileError(path, f"layer_types must name sliding_attention or full_attention for each of the "
                             f"{layers} layers, got {layer_types}")
    sliding = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention")
    window = int(raw.get("sliding_window") or 0)
    if sliding and window < 1:
        raise ModelFileError(path, "sliding_attention layers without a sliding_window")
    # transformers 5: rope_parameters per layer type; 4.5x: rope_theta, rope_local_base_freq, rope_scaling
    params = raw.get("rope_parameters") or {}
    full = dict(params.get("full_attention") or {})
    local = dict(params.get("sliding_attention") or {})
    if raw.get("rope_scaling"):
        full.update(raw["rope_scaling"])
    theta = float(full.get("rope_theta") or raw.get("rope_theta") or 1_000_000.0)
    local_theta = float(local.get("rope_theta") or raw.get("rope_local_base_freq") or 10_000.0)
    if (local.get("rope_type") or local.get("type") or "default") != "default":
        raise ModelFileError(path, f"rope scaling {local.get('rope_type') or local.get('type')!r} on the sliding "
                             "layers is not supported (specdec computes plain RoPE there, as Gemma 3 does)")
    head_dim = int(raw.get("head_dim") or 256)
    hidden = int(raw["hidden_size"])
    softcap = raw.get("final_logit_softcapping")
    return ModelConfig(
        arch="gemma3",
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        num_layers=layers,
        num_heads=int(raw["num_attention_heads"]),
        num_kv_heads=int(raw.get("num_key_value_heads") or raw["num_attention_heads"]),
        head_dim=head_dim,
        intermediate_size=int(raw["intermediate_size"]),
        rope_theta=theta,
        rope_freq_factors=rope_scaling_factors(path, full, head_dim, theta),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        context_length=int(raw.get("max_position_embeddings", 131_072)),
        qkv_bias=bool(raw.get("attention_bias", False)),
        qk_norm=True,
        tie_embeddings=_tied(path, raw, tensor_names, default=True),
        mlp_act=_ACTIVATIONS[raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"],
        sandwich_norms=True,
        embed_scale=hidden ** 0.5,
        attn_scale=float(256 if raw.get("query_pre_attn_scalar") is None else raw["query_pre_attn_scalar"]) ** -0.5,
        sliding_window=window if sliding else 0,
        sliding_layers=sliding,
        rope_local_theta=local_theta,
        final_logit_softcap=None if softcap is None else float(softcap),
    )


def _rope_factors(path, raw: dict, head_dim: int, theta: float) -> tuple[float, ...] | None:
    """RoPE frequency divisors from rope_scaling (or transformers 5's rope_parameters); a clear error
    for anything else in config.json that changes the math and that specdec does not compute."""
    _refuse_unknown_math(path, raw)
    return rope_scaling_factors(path, raw.get("rope_scaling") or raw.get("rope_parameters") or {}, head_dim, theta)


def rope_scaling_factors(path, scaling: dict, head_dim: int, theta: float) -> tuple[float, ...] | None:
    """RoPE frequency divisors of config.json's rope_scaling ({} or "default": None); a ModelFileError naming
    `path` for a type specdec does not compute or values it cannot read (drafter heads use it too)."""
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return None
    try:
        if kind == "llama3":
            return llama3_rope_factors(head_dim, theta, scaling)
        if kind == "linear":
            return linear_rope_factors(head_dim, scaling.get("factor"))
    except (ValueError, TypeError, ZeroDivisionError) as exc:  # factor null, a list, 0
        raise ModelFileError(path, f"rope_scaling {scaling}: {exc}") from None
    raise ModelFileError(path, f"rope scaling {kind!r} is not supported (specdec computes plain RoPE, 'linear' and "
                         "Llama 3.x 'llama3' scaling); running without it would change the model's output")


def _rotary_dims(path, raw: dict, model_type: str, head_dim: int) -> int:
    """The head dimensions RoPE rotates (ModelConfig.rope_dims; 0: all): GLM-4.5's partial_rotary_factor (top level
    or in rope_parameters; 0.5 when absent, as transformers' Glm4MoeConfig defaults), int(head_dim * factor)."""
    if model_type != "glm4_moe":
        return 0
    factor = raw.get("partial_rotary_factor", (raw.get("rope_parameters") or {}).get("partial_rotary_factor", 0.5))
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ModelFileError(path, f"partial_rotary_factor is {factor!r}; a number in (0, 1] is expected")
    dims = int(head_dim * factor)
    return 0 if dims == head_dim else dims


def _activation(raw: dict, arch: str) -> str | None:
    """The MLP's activation as transformers reads it: Gemma 3 hidden_activation first; Llama / Qwen
    hidden_act only (silu when absent; a hidden_activation there is not read)."""
    if arch == "gemma3":
        return raw.get("hidden_activation") or raw.get("hidden_act")
    return raw.get("hidden_act", "silu")


def _refuse_unknown_math(path, raw: dict) -> None:
    """config.json fields that change what the model computes and that specdec does not implement."""
    act = _activation(raw, _ARCH_BY_MODEL_TYPE.get(raw.get("model_type")))
    if act not in _ACTIVATIONS:
        raise ModelFileError(path, f"hidden_act {act!r} is not supported (specdec's MLP is act(gate) * up with "
                             f"act one of {', '.join(a for a in _ACTIVATIONS if a)})")
    if raw.get("mlp_bias"):
        raise ModelFileError(path, "mlp_bias is true: specdec's MLP has no biases")
    if float(raw.get("partial_rotary_factor", 1.0)) != 1.0 and raw.get("model_type") != "glm4_moe":
        raise ModelFileError(path, f"partial_rotary_factor {raw['partial_rotary_factor']} is not supported "
                             "(specdec rotates the whole head)")
    window = raw.get("sliding_window")
    if raw.get("use_sliding_window") and window and window < int(raw.get("max_position_embeddings", 4096)):
        raise ModelFileError(path, f"sliding-window attention (window {window}) is not supported yet; specdec "
                             "attends to the whole context")
