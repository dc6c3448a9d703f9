"""step.c's argument structs in ctypes: the entry points it calls, each layer's weights, one forward's sizes and
buffers. Their fields mirror step.c's Kernels, Linear, Layer and Forward in order and type."""

from __future__ import annotations

import ctypes

from specdec.model.kernels.libraries import F32, I64, P, attend, gguf, moe, rows
from specdec.model.kernels.weights import GGUFParts


class StepKernels(ctypes.Structure):
    """step.c's Kernels: the entry points it calls, in the libraries the per-op path calls."""

    _fields_ = [("rms_norm", P), ("rope", P), ("store", P), ("attend", P), ("act", P), ("linear", P), ("moe", P)]


def step_kernels() -> StepKernels:
    def address(fn) -> int:
        return ctypes.cast(fn, ctypes.c_void_p).value

    return StepKernels(address(rows().rms_norm_rows), address(rows().rope_rows), address(rows().store_rows),
                       address(attend().attend_rows), address(rows().act_mul_rows), address(gguf().gguf_linear),
                       None if moe() is None else address(moe().moe_rows))


class StepLinear(ctypes.Structure):
    """step.c's Linear: a GGUFParts' arrays, its input width and bias."""

    _fields_ = [("nparts", I64), ("in_", I64), ("types", P), ("weights", P), ("rows", P), ("row_bytes", P),
                ("bias", P)]

    @classmethod
    def of(cls, parts: GGUFParts, in_features: int, bias=None) -> "StepLinear":
        return cls(parts.count, in_features, ctypes.addressof(parts.types), ctypes.addressof(parts.addresses),
                   ctypes.addressof(parts.rows), ctypes.addressof(parts.row_bytes),
                   None if bias is None else bias.data_ptr())


class StepLayer(ctypes.Structure):
    """step.c's Layer: four linears, six norm weights (None where absent), whether it is a local layer, and a
    mixture layer's moe.c arguments (MoEKernels, MoEExperts, MoERoute addresses; None in a dense layer)."""

    _fields_ = [("qkv", StepLinear), ("o", StepLinear), ("gate_up", StepLinear), ("down", StepLinear),
                ("attn_norm", P), ("mlp_norm", P), ("q_norm", P), ("k_norm", P), ("attn_out_norm", P),
                ("mlp_out_norm", P), ("local", I64), ("moe_kernels", P), ("moe_experts", P), ("moe_route", P)]


class StepForward(ctypes.Structure):
    """step.c's Forward: one exact forward's sizes, inputs and scratch (pointers into tensors the caller holds)."""

    _fields_ = [("M", I64), ("H", I64), ("nh", I64), ("nkv", I64), ("hd", I64), ("I", I64), ("act", I64),
                ("threads", I64), ("eps", F32), ("scale", F32), ("cos", P * 2), ("sin", P * 2), ("slot", P * 2),
                ("off", P * 2), ("keys", P * 2), ("nseg", I64), ("seg_slot", P), ("seg_start", P), ("seg_row", P),
                ("kcache", P), ("vcache", P), ("layer_values", I64), ("slots", I64), ("max_len", I64), ("half", I64),
                ("x", P), ("gate_up", P), ("act_out", P), ("h", P), ("qkv", P), ("qk", P), ("rot", P), ("part", P),
                ("attn", P), ("out", P), ("overflow", I64)]
