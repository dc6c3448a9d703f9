"""The kernels' ops on torch tensors: each checks and lays out its operands, allocates its output and makes one
C call. Each needs its library loaded (kernels.rows(), gguf(), w8a8(), attend()); `lib` picks another build."""

from __future__ import annotations

import torch

from specdec.model.config import MLP_ACTIVATIONS  # act_mul_rows' kinds: their indices
from specdec.model.kernels.libraries import attend, gguf, rows, w8a8
from specdec.model.kernels.weights import GGUFParts

BLOCK = 32  # activations are quantized in blocks of this many values


def rms_norm_rows(x, weight, eps: float):
    """x (..., n) float32, weight (n,) float32 or None -> rms_norm(x) * weight (rows.c)."""
    x = x.contiguous()
    weight = None if weight is None else weight.contiguous()
    y = torch.empty_like(x)
    n = x.shape[-1]
    rows().rms_norm_rows(x.data_ptr(), None if weight is None else weight.data_ptr(), x.numel() // n, n, eps,
                         y.data_ptr())
    return y


def rope(x, cos, sin):
    """x (N, heads, hd) float32, cos, sin (N, 1, hd) float32 -> x rotated (rows.c)."""
    x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
    y = torch.empty_like(x)
    N, heads, hd = x.shape
    rows().rope_rows(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), N, heads, hd, y.data_ptr())
    return y


def act_mul(gate, up, act: str):
    """act(gate) * up for gate, up (N, I) float32 (rows.c; act "silu" or "gelu_tanh"). Rows may sit at any
    stride (the two halves of one gate_up output): only the last dim must be dense."""
    if act not in MLP_ACTIVATIONS:
        raise ValueError(f"unknown MLP activation {act!r}; the kernel computes {', '.join(MLP_ACTIVATIONS)}")
    if gate.dim() != 2 or gate.stride(-1) != 1 or up.stride(-1) != 1:
        gate, up = gate.reshape(-1, gate.shape[-1]).contiguous(), up.reshape(-1, up.shape[-1]).contiguous()
    out = torch.empty(gate.shape, dtype=torch.float32)
    rows().act_mul_rows(gate.data_ptr(), up.data_ptr(), gate.shape[0], gate.shape[1], gate.stride(0), up.stride(0),
                        MLP_ACTIVATIONS.index(act), out.data_ptr())
    return out


def store_rows(new, layer, slot: int, start: int) -> int:
    """new (T, nkv, hd) float32 -> layer[slot, :, start:start + T] (layer: (slots, nkv, max_len, hd) float32 or
    float16, contiguous), as layer[slot, :, start:start + T] = new.transpose(0, 1) (rows.c). Returns how many
    values a float16 layer could not hold (|x| >= 65520: stored as inf); 0 for float32."""
    new = new.contiguous()
    T, nkv, hd = new.shape
    return rows().store_rows(new.data_ptr(), T, nkv, hd, layer.data_ptr(), slot, layer.shape[2], start,
                             _half(layer))


def _half(cache_layer) -> int:
    """1 for a float16 cache, 0 for float32: the kernels' `half` argument (ValueError for any other dtype)."""
    if cache_layer.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"the KV cache kernels take float32 or float16, not {cache_layer.dtype}")
    return int(cache_layer.dtype == torch.float16)


def gguf_quantize(x):
    """x (M, K) float32, K % 32 == 0 -> (xq int8 (M, K), xs (M, K/32), xsum (M, K/32)): the activations as
    gguf_acts.c quantizes them, int8 in blocks of 32 with a float scale each, and xs * sum(xq) per block."""
    x = x.contiguous()
    M, K = x.shape
    xq = torch.empty(M, K, dtype=torch.int8)
    xs = torch.empty(M, K // BLOCK, dtype=torch.float32)
    xsum = torch.empty(M, K // BLOCK, dtype=torch.float32)
    gguf().quantize_rows_sums(x.data_ptr(), M, K, xq.data_ptr(), xs.data_ptr(), xsum.data_ptr())
    return xq, xs, xsum


def gguf_linear(x, parts: GGUFParts, bias=None, lib=None):
    """x (M, K) float32 @ W.T (+ bias) -> (M, N) float32, W the parts stacked row-wise (gguf_linear.c:
    x quantized once, one parallel pass over every output column). Needs `gguf()`;
    lib: another build of the gguf library (`gguf_build`)."""
    x = x.contiguous()
    M, K = x.shape
    y = torch.empty(M, parts.out_features)
    (lib or gguf()).gguf_linear(x.data_ptr(), M, K, parts.count, parts.types, parts.addresses, parts.rows, parts.row_bytes,
                       None if bias is None else bias.data_ptr(), y.data_ptr(), torch.get_num_threads())
    return y


def gguf_rows(type_id: int, blocks, ids, K: int, interleaved: bool = False):
    """Rows ids (n,) of (V, row_bytes) uint8 blocks of a GGUF type with K values a row, in the file's layout
    or in the kernel's (a GGUFParts part: interleaved) -> (n, K) float32, exactly the gguf package's dequantized
    values (gguf_values.c)."""
    ids = torch.as_tensor(ids).to(torch.int64).contiguous()
    out = torch.empty(ids.shape[0], K)
    gguf().gguf_rows(type_id, blocks.data_ptr(), ids.data_ptr(), ids.shape[0], K, blocks.shape[1], int(interleaved),
                     out.data_ptr())
    return out


def gguf_to_dense(type_id: int, blocks, K: int, dtype):
    """(N, row_bytes) uint8 of a GGUF type in the kernel's layout (a GGUFParts part) -> (N, K) of dtype: its values
    rounded to bf16, or as float32 exactly the gguf package's values (gguf_values.c)."""
    N = blocks.shape[0]
    out = torch.empty(N, K, dtype=dtype)
    gguf().gguf_to_dense(type_id, blocks.data_ptr(), N, K, blocks.shape[1], out.data_ptr(), int(dtype == torch.bfloat16),
                         torch.get_num_threads())
    return out


def w8a8_matmul(x, weight, scale, bias=None, lib=None):
    """y = (x quantized to int8 per block of 32) @ weight.T * scale (+ bias).

    x: (M, K) float32, K % 32 == 0; weight: (N, K) int8; scale: (N,) float32; bias: (N,) or None.
    Returns (M, N) float32. Needs `w8a8()` to have loaded; lib: another build of w8a8.c (`w8a8_build`).
    """
    lib = lib or w8a8()
    x = x.contiguous()
    M, K = x.shape
    N = weight.shape[0]
    xq = torch.empty(M, K, dtype=torch.int8)
    xs = torch.empty(M, K // BLOCK, dtype=torch.float32)
    y = torch.empty(M, N, dtype=torch.float32)
    lib.quantize_rows(x.data_ptr(), M, K, xq.data_ptr(), xs.data_ptr())
    lib.w8a8_mm(xq.data_ptr(), xs.data_ptr(), M, K, weight.data_ptr(), scale.data_ptr(),
                None if bias is None else bias.data_ptr(), y.data_ptr(), N, torch.get_num_threads())
    return y


def attend_rows(q, k, v, slot, offsets, keys, scale: float, lib=None):
    """Each query row over exactly its own keys of its own cache slot (see attend.c).

    q: (n, nh, hd) float32; k, v: one layer of the cache, (slots, nkv, max_len, hd) float32 or float16,
    contiguous; slot: (n,) int64; offsets: (n + 1,) int64 into keys; keys: key offsets in the
    slot, row r's at keys[offsets[r]:offsets[r + 1]], in reduction order. Returns (n, nh, hd).
    lib: a build of attend.c (`attend_build`); default `attend()`, which must have loaded.
    """
    q = q.contiguous()
    n, nh, hd = q.shape
    slots, nkv, max_len, _ = k.shape
    if nh % nkv:
        raise ValueError(f"{nh} query heads do not divide among {nkv} kv heads")
    if v.dtype != k.dtype:
        raise ValueError(f"keys ({k.dtype}) and values ({v.dtype}) must share a dtype")
    out = torch.empty_like(q)
    (lib or attend()).attend_rows(q.data_ptr(), k.data_ptr(), v.data_ptr(), slot.data_ptr(), offsets.data_ptr(),
                                  keys.data_ptr(), out.data_ptr(), n, nh, nkv, hd, max_len, scale, _half(k),
                                  torch.get_num_threads())
    return out
