"""Memory accounting from tensor sizes (exact for what specdec allocates) and the process RSS.

    weights   every tensor a built Transformer holds (matrices, scales, norms, embedding, RoPE tables)
    kv        the preallocated KV cache (allocated) and the part a request used (used)
    drafter   a draft model's weights + its KV cache, or the Python objects of a model-free drafter

`estimate_weight_bytes` predicts `transformer_bytes` from a config alone, so `specdec inspect`
can say what a model will take without building it.
"""

from __future__ import annotations

import os
import resource
import sys
import types
from collections import deque

import torch

from specdec.model.config import ModelConfig
from specdec.model.gemma4_checkpoint import gemma4_shapes
from specdec.model.layers import ROPE_INITIAL_ROWS
from specdec.model.transformer import default_kv_dtype

INT4_GROUP = 32
KV_VALUE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # by what the KV cache holds (ModelInfo.kv_cache)


def _tensor_bytes(t) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def transformer_bytes(tr) -> int:
    """Bytes of every tensor a built Transformer holds (a DeviceTransformer: those on its device)."""
    if hasattr(tr, "device_bytes"):
        return tr.device_bytes()
    total = _tensor_bytes(tr.norm) + tr.lm_head.nbytes()
    # a tied gguf embedding reads the head's blocks (model/build.py): those bytes are held once
    embed_data = getattr(tr.embed, "blocks", tr.embed)
    if not any(part.data_ptr() == embed_data.data_ptr() for _, part in getattr(tr.lm_head, "parts", ())):
        total += _tensor_bytes(tr.embed)
    total += tr.rope.nbytes() + (tr.local_rope.nbytes() if tr.local_rope is not None else 0)
    for layer in tr.layers:
        total += sum(m.nbytes() for m in (layer.qkv, layer.o, layer.gate_up, layer.down))
        total += sum(_tensor_bytes(t) for t in (layer.attn_norm, layer.mlp_norm, layer.q_norm, layer.k_norm,
                                                layer.attn_out_norm, layer.mlp_out_norm))
        # Gemma 4 (model/gemma4.py): per-layer input projections, their norm, the layer scalar
        total += sum(m.nbytes() for m in (getattr(layer, "ple_gate", None), getattr(layer, "ple_proj", None)) if m)
        total += sum(_tensor_bytes(getattr(layer, n, None)) for n in ("ple_norm", "scalar"))
    ple = getattr(tr, "ple", None)
    if ple is not None:  # Gemma 4's per-layer input table and projection
        total += _tensor_bytes(ple.embed) + ple.proj.nbytes() + _tensor_bytes(ple.norm)
    return total


def linear_bytes(out_features: int, in_features: int, fmt: str, bias: bool = False) -> int:
    """Bytes of one QLinear (model/linear.py) in a weight format."""
    n, k = out_features, in_features
    if fmt in ("int4", "w8a8") and k % INT4_GROUP != 0:
        fmt = "int8"  # QLinear falls back the same way
    size = {"fp32": 4 * n * k, "bf16": 2 * n * k, "int8": n * k + 2 * n, "w8a8": n * k + 4 * n,
            "int4": n * k // 2 + (k // INT4_GROUP) * n * 2 * 2}[fmt]
    return size + (4 * n if bias else 0)


def gguf_tensor_bytes(checkpoint) -> int | None:
    """Bytes of a GGUF checkpoint's tensors as stored (what the gguf format holds); None for another kind."""
    tensors = getattr(checkpoint, "_tensors", None)
    if not tensors or not all(hasattr(t, "n_bytes") for t in tensors.values()):
        return None
    return sum(int(t.n_bytes) for t in tensors.values())


def estimate_weight_bytes(c: ModelConfig, fmt: str, gguf_bytes: int | None = None) -> int | None:
    """What `transformer_bytes` will be once the model is built in format `fmt`. The gguf format holds the
    file's tensors as stored: pass `gguf_tensor_bytes(checkpoint)`; None when that is None."""
    if fmt == "gguf":
        return None if gguf_bytes is None else gguf_bytes + _rope_bytes(c)
    h = c.hidden_size
    if c.gemma4 is not None:  # layers of two widths, per-layer inputs: from every tensor's shape
        shapes = gemma4_shapes(c)
        table = shapes.pop("model.embed_tokens_per_layer.weight", None)
        total = sum(linear_bytes(*s, fmt) if len(s) == 2 else 4 * s[0] for s in shapes.values())
        total += 0 if table is None else table[0] * table[1] * (4 if fmt == "fp32" else 2)
        return total + c.vocab_size * h * (4 if fmt == "fp32" else 2) + linear_bytes(c.vocab_size, h, fmt) + 4 * h \
            + _rope_bytes(c)
    per_layer = (
        linear_bytes(c.q_size + 2 * c.kv_size, h, fmt, bias=c.qkv_bias)
        + linear_bytes(h, c.q_size, fmt)
        + linear_bytes(2 * c.intermediate_size, h, fmt)
        + linear_bytes(h, c.intermediate_size, fmt)
        + 2 * 4 * h
        + (2 * 4 * c.head_dim if c.qk_norm else 0)
        + (2 * 4 * h if c.sandwich_norms else 0)
    )
    embed = c.vocab_size * h * (4 if fmt == "fp32" else 2)
    return c.num_layers * per_layer + embed + linear_bytes(c.vocab_size, h, fmt) + 4 * h + _rope_bytes(c)


def _rope_bytes(c: ModelConfig) -> int:
    """The RoPE tables at start (layers.RopeTable: they grow as positions reach further)."""
    tables = 2 if c.sliding_layers and c.rope_local_theta is not None else 1
    if c.gemma4 is not None:  # its global layers' table has their own width
        return 2 * 4 * min(ROPE_INITIAL_ROWS, c.context_length) * (c.gemma4.global_head_dim + c.head_dim)
    return tables * 2 * 4 * min(ROPE_INITIAL_ROWS, c.context_length) * c.head_dim


def kv_bytes_per_token(c: ModelConfig, kv_cache: str) -> int:
    """Bytes of KV cache one token takes, for a cache holding `kv_cache` values ("float16", ...)."""
    return c.kv_bytes_per_token(KV_VALUE_BYTES[kv_cache])


def default_kv_cache(weights_format: str) -> str:
    """What the CPU runtime's KV cache holds by default for a weight format, as ModelInfo.kv_cache says it."""
    return str(default_kv_dtype(weights_format)).removeprefix("torch.")


_SKIP = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType)


def object_bytes(obj, limit: int = 2_000_000) -> int:
    """Approximate bytes of a Python object graph (tensors by their storage); stops after `limit` objects."""
    seen: set[int] = set()
    todo = deque([obj])
    total = 0
    while todo and len(seen) < limit:
        o = todo.popleft()
        if id(o) in seen or isinstance(o, _SKIP):
            continue
        seen.add(id(o))
        if isinstance(o, torch.Tensor):
            total += _tensor_bytes(o)
            continue
        total += sys.getsizeof(o, 0)
        if isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset, deque)):
            todo.extend(o)
        elif hasattr(o, "__array_interface__"):  # numpy arrays: getsizeof counts their buffer
            continue
        else:
            if hasattr(o, "__dict__"):
                todo.append(vars(o))
            for slot in getattr(type(o), "__slots__", ()):
                if hasattr(o, slot):
                    todo.append(getattr(o, slot))
    return total


def drafter_bytes(drafter) -> tuple[int, str]:
    """(bytes, how measured) for one drafter the engine built."""
    inner = getattr(drafter, "inner", drafter)
    inner = getattr(inner, "inner", inner)  # CrossTokenizerDrafter wraps a DraftModelDrafter
    draft = getattr(inner, "draft", None)
    if draft is not None and hasattr(draft, "transformer"):
        cache = getattr(inner, "cache", None)
        return transformer_bytes(draft.transformer) + (cache.nbytes() if cache is not None else 0), "tensor sizes"
    return object_bytes(inner), "python object sizes (approx.)"


def rss_bytes() -> int:
    """Resident memory of this process now (Linux /proc; 0 where unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
