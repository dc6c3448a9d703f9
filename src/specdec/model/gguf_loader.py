"""Read a GGUF file: configuration, tensors (dequantized on demand), tokenizer metadata.

Tensors go by their Hugging Face names (model/gguf_names.py), so that one model builder serves
GGUF files and HF folders alike. The `gguf` package's reader (made fast by model/gguf_reader.py)
and dequantizers do the byte work.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from gguf.quants import dequantize

from specdec.model.config import SUPPORTED_ARCHS, ModelConfig, linear_rope_factors, unsupported_reason
from specdec.model.errors import ModelFileError, unread_bias, unread_tensors
from specdec.model.gemma4_checkpoint import gemma4_shapes
from specdec.model.gemma4_gguf import ARCH as GEMMA4, gemma4_gguf_config
from specdec.model.gguf_names import hf_name
from specdec.model.gguf_reader import reader_class
from specdec.model.linear import GGUF_KERNEL_TYPES
from specdec.model.hybrid_build import hybrid_shapes
from specdec.model.moe_config import moe_from_gguf, moe_shapes
from specdec.model import qwen3next_checkpoint as qwen3next
from specdec.model.qwen3next_checkpoint import fused_rows
from specdec.model.qwen35_checkpoint import HYBRID_ARCHS, qwen35_gguf_config

# the one tensor no HF name maps that is read apart: llama.cpp's RoPE frequency factors (_config takes them)
ROPE_FREQS = "rope_freqs.weight"

# GGML types we dequantize (the gguf package can do more; these are the ones we test).
SUPPORTED_GGML_TYPES = {
    "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",  # not Q8_K: the gguf package cannot decode it (llama.cpp's activations)
}


@dataclass
class GGUFModel:
    path: Path
    config: ModelConfig
    metadata: dict
    quant: str  # dominant tensor type of the 2-D weights, e.g. "Q4_K" ("Q4_K_M" from file_type when known)
    tensor_types: dict[str, str]
    gguf_names: list[str]
    _tensors: dict = field(repr=False, default_factory=dict)  # HF name -> gguf ReaderTensor
    _rows: dict = field(repr=False, default_factory=dict)  # HF name -> (HF name, row indices): rows of a fused one

    def names(self) -> list[str]:
        return list(self._tensors) + list(self._rows)

    def get(self, name: str) -> torch.Tensor:
        """The tensor in float32, in the Hugging Face layout ((out, in) for matrices)."""
        if name in self._rows:  # Qwen3-Next's fused beta|alpha, read under Qwen3.5's names
            fused, rows = self._rows[name]
            return self.get(fused)[rows]
        t = self._tensors[name]
        try:
            array = dequantize(t.data, t.tensor_type)
        except Exception as exc:  # the gguf package raises assorted errors on bad blocks
            raise ModelFileError(self.path, f"tensor {t.name} ({t.tensor_type.name}) cannot be decoded: {exc}") from None
        out = torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
        expected = tuple(int(d) for d in reversed(t.shape.tolist()))
        if len(expected) == 1:
            expected = (expected[0],)
        if tuple(out.shape) != expected:
            out = out.reshape(expected)
        # the converter permutes q/k biases as it permutes their weights' rows
        if self.config.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias",
                                                          "k_proj.bias")):
            heads = self.config.num_heads if "q_proj" in name else self.config.num_kv_heads
            out = _unpermute_rope(out, heads)
        return out

    def blocks(self, name: str) -> tuple[str, torch.Tensor]:
        """The tensor as the file stores it, in the Hugging Face row order: (type, (rows, row_bytes) uint8)
        for the block types the gguf library (model/kernels) computes on, else ("F32", `get(name)`), which is exact."""
        if name in self._rows:  # rows of a fused tensor: whole rows of its blocks
            fused, rows = self._rows[name]
            kind, blocks = self.blocks(fused)
            return kind, blocks[rows].contiguous()
        t = self._tensors[name]
        kind = t.tensor_type.name
        if kind not in GGUF_KERNEL_TYPES or len(t.shape) != 2:
            return "F32", self.get(name)
        data = np.asarray(t.data)
        rows = int(t.shape[1])
        if data.ndim != 2 or data.shape[0] != rows:
            raise ModelFileError(self.path, f"tensor {t.name} ({kind}) has {data.shape} bytes for {rows} rows")
        if data.dtype != np.uint8 or not data.flags.writeable:  # not read_gguf's copy-on-write mapping
            data = np.array(data, dtype=np.uint8, copy=True)
        out = torch.from_numpy(data)  # a view of the mapped file: QLinear.from_gguf copies it once, repacking
        if self.config.arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = self.config.num_heads if "q_proj" in name else self.config.num_kv_heads
            out = _unpermute_rope(out, heads).contiguous()
        return kind, out

    def expert_blocks(self, name: str) -> tuple[str, torch.Tensor]:
        """A stacked expert tensor (llama.cpp's ffn_*_exps, E experts of `rows` rows) as the file stores it, its
        experts one after another: (type, (E * rows, row_bytes) uint8), a view of the mapped file, for the block
        types the gguf library computes on; else ("F32", (E * rows, cols) float32), the values exactly."""
        t = self._tensors[name]
        kind = t.tensor_type.name
        experts, rows = int(t.shape[2]), int(t.shape[1])
        if kind not in GGUF_KERNEL_TYPES or len(t.shape) != 3:
            values = self.get(name)
            return "F32", values.reshape(experts * rows, values.shape[-1])
        data = np.asarray(t.data)
        if data.ndim != 3 or data.shape[:2] != (experts, rows):
            raise ModelFileError(self.path, f"tensor {t.name} ({kind}) has {data.shape} bytes for {experts} experts "
                                 f"of {rows} rows")
        if data.dtype != np.uint8 or not data.flags.writeable:
            data = np.array(data, dtype=np.uint8, copy=True)
        return kind, torch.from_numpy(data).reshape(experts * rows, data.shape[2])


# llama.cpp's file_type enum (LLAMA_FTYPE_*), for naming the quantization the way users know it.
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}


def _unpermute_rope(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation for the llama architecture.

    The converter reorders each head's rows from HF's half-split rotary layout to
    interleaved pairs; we keep HF's layout and its rotate-half RoPE.
    """
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    value = f.contents()
    return value


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """Open a GGUF file and check it can be run; raises ModelFileError with a clear reason."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(path, "no such file")
    try:
        reader = reader_class()(path)
    except Exception as exc:
        raise ModelFileError(path, f"not a readable GGUF file: truncated or corrupt ({type(exc).__name__}: {exc})") from None
    size = path.stat().st_size
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if end > size:
        raise ModelFileError(path, f"truncated: tensor data needs {end} bytes but the file has {size}")
    align, base, last_end = int(getattr(reader, "alignment", 32) or 32), int(getattr(reader, "data_offset", 0)), 0
    for t in sorted(reader.tensors, key=lambda t: int(t.data_offset)):  # llama.cpp checks both too
        start = int(t.data_offset)
        if (start - base) % align or start < last_end:
            raise ModelFileError(path, f"tensor {t.name}'s data offset {start - base} is not a multiple of the "
                                 f"alignment {align}, or overlaps the tensor before it: the file is damaged")
        last_end = start + int(t.n_bytes)

    meta = {}
    for key in reader.fields:
        if key.startswith("tokenizer.ggml.") and key.split(".")[-1] in ("tokens", "scores", "token_type", "merges"):
            continue  # big arrays: read on demand by the tokenizer
        try:
            meta[key] = _field(reader, key)
        except Exception:
            meta[key] = None
    arch = meta.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(path, f"general.architecture is {arch!r}, not a name")
    if arch not in SUPPORTED_ARCHS:
        raise ModelFileError(path, "architecture " + unsupported_reason(arch, ", ".join(SUPPORTED_ARCHS)))

    tensors, types = {}, {}
    gguf_names, unread, freqs = [], [], None
    for t in reader.tensors:
        gguf_names.append(t.name)
        types[t.name] = t.tensor_type.name
        if t.tensor_type.name not in SUPPORTED_GGML_TYPES:
            raise ModelFileError(path, f"tensor {t.name} has quantization {t.tensor_type.name}, which specdec cannot load "
                                 f"(supported: {', '.join(sorted(SUPPORTED_GGML_TYPES))})")
        hf = hf_name(t.name, arch)
        if hf is not None:
            tensors[hf] = t
        elif t.name.startswith("blk.") and t.name.endswith(".bias"):  # a bias the layers do not add: refused
            raise unread_bias(path, [t.name])
        elif t.name == ROPE_FREQS:
            freqs = t
        else:
            unread.append(t.name)
    if unread:  # a tensor no name maps would vanish, and the model compute something else than the file
        raise unread_tensors(path, arch, unread)
    try:
        config = _config(path, arch, meta, tensors, freqs)
    except (TypeError, ValueError) as exc:  # a metadata value of the wrong type, or sizes that do not fit
        raise ModelFileError(path, f"metadata: {exc}") from None
    quant = quant_label(meta.get("general.file_type"), [types[t.name] for t in reader.tensors if len(t.shape) == 2])
    rows = fused_rows(tensors, config.linear_attention) if arch == qwen3next.ARCH else {}
    model = GGUFModel(path, config, meta, quant, types, gguf_names, tensors, rows)
    model.reader = reader
    _check_shapes(model)
    return model


def quant_label(file_type, matrix_types: list[str]) -> str:
    """The file's quantization as llama.cpp names it (general.file_type: Q4_K_M), or where that is absent or
    a number this table lacks, the matrices' most common tensor type (the first by name of equally common
    ones: the same label at every run)."""
    if isinstance(file_type, int) and file_type in _FILE_TYPES:
        return _FILE_TYPES[file_type]
    return max(sorted(set(matrix_types)), key=matrix_types.count) if matrix_types else "F32"


def _config(path, arch: str, meta: dict, tensors: dict, rope_freqs=None) -> ModelConfig:
    def need(key):
        value = meta.get(f"{arch}.{key}")
        if value is None:
            raise ModelFileError(path, f"metadata key {arch}.{key} is missing")
        return value

    if meta.get(f"{arch}.expert_count") and arch not in MOE_ARCHS:  # Mixtral's llama files: dense would be wrong
        raise ModelFileError(path, f"{arch}.expert_count is {meta[f'{arch}.expert_count']}: a mixture-of-experts "
                             "model, which specdec cannot run yet")
    if arch == GEMMA4:  # per-layer arrays and its own keys: model/gemma4_gguf.py
        return gemma4_gguf_config(path, meta, tensors, rope_freqs)
    _check_sizes(path, arch, meta, tensors)
    if arch in HYBRID_ARCHS:  # hybrid: model/qwen35_checkpoint.py
        return qwen35_gguf_config(path, meta, tensors)
    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv") or heads)
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    embed = tensors.get("model.embed_tokens.weight")
    if embed is None:
        raise ModelFileError(path, "tensor token_embd.weight is missing")
    vocab = int(meta.get(f"{arch}.vocab_size") or embed.shape[-1])
    nextn = int(meta.get(f"{arch}.nextn_predict_layers") or 0)
    scaling = meta.get(f"{arch}.rope.scaling.type")
    gemma = _gemma3_fields(path, meta, hidden, heads, head_dim) if arch == "gemma3" else {}
    if arch == "gemma3" and scaling == "linear":  # the global layers' (llama.cpp: the local ones keep scale 1)
        factor = meta.get(f"{arch}.rope.scaling.factor")
        if factor is None:
            raise ModelFileError(path, f"{arch}.rope.scaling.type is linear but {arch}.rope.scaling.factor is missing")
        gemma["rope_freq_factors"] = linear_rope_factors(head_dim, float(factor))
    elif scaling not in (None, "none"):
        raise ModelFileError(path, f"rope scaling {scaling!r} ({arch}.rope.scaling.type) is not supported (specdec "
                             "computes plain RoPE and Llama 3.x rope_freqs); running without it would change the output")
    rotated = meta.get(f"{arch}.rope.dimension_count")
    rope_dims = int(rotated) if arch == "glm4moe" and rotated is not None and int(rotated) != head_dim else 0
    if rotated is not None and int(rotated) != head_dim and not rope_dims:
        raise ModelFileError(path, f"RoPE rotates {rotated} of {head_dim} head dimensions ({arch}.rope.dimension_count); "
                             "specdec rotates the whole head")
    factors = None
    if rope_freqs is not None:  # Llama 3.x: one divisor per rotated pair
        factors = tuple(float(f) for f in np.asarray(dequantize(rope_freqs.data, rope_freqs.tensor_type)).reshape(-1))
    gemma.setdefault("rope_freq_factors", factors)
    layers = int(need("block_count")) - nextn
    moe = None
    if arch in MOE_ARCHS:
        try:
            moe = moe_from_gguf(meta, arch, layers, any(n.endswith(".mlp.gate.e_score_correction_bias") for n in tensors))
        except KeyError as exc:
            raise ModelFileError(path, f"metadata key {exc.args[0]} is missing") from None
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(need("feed_forward_length")),
        rope_theta=float(meta.get(f"{arch}.rope.freq_base") or 10000.0),
        rms_norm_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon") or 1e-6),
        context_length=int(meta.get(f"{arch}.context_length") or 4096),
        qkv_bias="model.layers.0.self_attn.q_proj.bias" in tensors,
        qk_norm="model.layers.0.self_attn.q_norm.weight" in tensors,
        tie_embeddings="lm_head.weight" not in tensors,
        mtp_layers_declared=nextn,
        rope_dims=rope_dims,
        moe=moe,
        **gemma,
    )


MOE_ARCHS = ("qwen3moe", "glm4moe", "qwen35moe", "qwen3next")  # GGUF architectures whose expert_* keys specdec reads (model/moe_config.py)
_COUNTS = ("embedding_length", "attention.head_count", "attention.head_count_kv", "attention.key_length",
           "vocab_size", "block_count", "feed_forward_length", "context_length")
_POSITIVE = ("rope.freq_base", "attention.layer_norm_rms_epsilon")


def _check_sizes(path, arch: str, meta: dict, tensors: dict) -> None:
    """Sizes that are given must be whole and at least 1, and rates positive (a 0 is never read as a default,
    64.9 never cut to 64). block_count (with the nextn layers) must match the layers in the file: fewer would run
    the model without its last layers, more (4e9) would build billions of expected shapes before naming the first
    missing tensor."""
    for key in _COUNTS:
        value = meta.get(f"{arch}.{key}")
        if value is not None and not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ModelFileError(path, f"{arch}.{key} is {value!r}; a whole number of at least 1 is expected")
    for key in _POSITIVE:
        value = meta.get(f"{arch}.{key}")
        if value is not None and not (isinstance(value, (int, float)) and 0 < value < math.inf):
            raise ModelFileError(path, f"{arch}.{key} is {value!r}; a positive number is expected")
    blocks = meta.get(f"{arch}.block_count")
    if blocks is None:
        return  # said where the config is read
    layers = sorted({int(m.group(1)) for n in tensors if (m := re.match(r"model\.layers\.(\d+)\.", n))})
    beyond = [i for i in layers if i >= blocks]
    if beyond:  # llama.cpp refuses such a file too: the model would run without those layers
        raise ModelFileError(path, f"the file holds layer {beyond[0]}, but its block_count says {blocks} layers "
                             f"(0..{blocks - 1})")
    nextn = meta.get(f"{arch}.nextn_predict_layers")  # MTP layers a conversion may have left out
    main = blocks - (nextn if isinstance(nextn, int) and 0 < nextn < blocks else 0)
    if main > (layers[-1] if layers else -1) + 1:
        top = layers[-1] if layers else -1
        raise ModelFileError(path, f"{arch}.block_count says {main} layers, but the file holds layers up to {top}: "
                             f"tensors for model.layers.{top + 1} and on are missing")


def _gemma3_fields(path, meta: dict, hidden: int, heads: int, head_dim: int) -> dict:
    """ModelConfig's Gemma 3 fields from a gemma3 GGUF, read as llama.cpp reads them (llama-model.cpp): with a
    sliding window, every 6th layer global and the others local with RoPE base 10000 (no window: all global);
    attention scale 1/sqrt(head_dim), except the 27B (62 layers) whose query_pre_attn_scalar is hidden / heads."""
    if meta.get("gemma3.attn_logit_softcapping") is not None:
        raise ModelFileError(path, "gemma3.attn_logit_softcapping is set: specdec does not cap attention scores")
    layers = int(meta["gemma3.block_count"])
    window = int(meta.get("gemma3.attention.sliding_window") or 0)
    softcap = meta.get("gemma3.final_logit_softcapping")
    return dict(
        mlp_act="gelu_tanh",
        sandwich_norms=True,
        embed_scale=hidden ** 0.5,
        attn_scale=float(hidden // heads if layers == 62 else head_dim) ** -0.5,
        sliding_window=window,
        sliding_layers=tuple(i for i in range(layers) if (i + 1) % 6) if window else (),
        rope_local_theta=10_000.0,
        final_logit_softcap=None if softcap is None else float(softcap),
    )


def _check_shapes(model: GGUFModel) -> None:
    c = model.config
    expected = {
        "model.embed_tokens.weight": (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
    }
    if not c.tie_embeddings:  # the gguf kernel reads the head's rows as the shape says: a narrow one past its end
        expected["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    hybrid = c.linear_attention is not None  # Qwen3.5's layers: hybrid_build.hybrid_shapes
    expected.update(hybrid_shapes(c) if hybrid else gemma4_shapes(c) if c.gemma4 is not None else {})
    for i in range(0 if hybrid or c.gemma4 is not None else c.num_layers):
        p = f"model.layers.{i}."
        expected.update({
            p + "self_attn.q_proj.weight": (c.q_size, c.hidden_size),
            p + "self_attn.k_proj.weight": (c.kv_size, c.hidden_size),
            p + "self_attn.v_proj.weight": (c.kv_size, c.hidden_size),
            p + "self_attn.o_proj.weight": (c.hidden_size, c.q_size),
            p + "mlp.gate_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.up_proj.weight": (c.intermediate_size, c.hidden_size),
            p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
            p + "input_layernorm.weight": (c.hidden_size,),
            p + "post_attention_layernorm.weight": (c.hidden_size,),
        })
        if c.moe is not None and c.moe.is_moe(i):  # a mixture in place of the dense MLP
            for part in ("gate", "up", "down"):
                del expected[p + f"mlp.{part}_proj.weight"]
            expected.update(moe_shapes(c.moe, c.hidden_size, p))
        if c.sandwich_norms:
            expected[p + "pre_feedforward_layernorm.weight"] = (c.hidden_size,)
            expected[p + "post_feedforward_layernorm.weight"] = (c.hidden_size,)
        if c.qk_norm:
            expected[p + "self_attn.q_norm.weight"] = (c.head_dim,)
            expected[p + "self_attn.k_norm.weight"] = (c.head_dim,)
        if c.qkv_bias:  # every layer's, as layer 0 has them: a missing one is named here, not a KeyError later
            expected[p + "self_attn.q_proj.bias"] = (c.q_size,)
            expected[p + "self_attn.k_proj.bias"] = (c.kv_size,)
            expected[p + "self_attn.v_proj.bias"] = (c.kv_size,)
    for name, shape in expected.items():
        if name in model._rows:  # a row selection of a fused tensor: build.py checks the rows it gets
            continue
        t = model._tensors.get(name)
        if t is None:
            raise ModelFileError(model.path, f"tensor for {name} is missing")
        got = tuple(int(d) for d in reversed(t.shape.tolist()))
        if got != shape:
            raise ModelFileError(model.path, f"tensor {t.name} has shape {got}, expected {shape}")
