"""moe.c's argument structs in ctypes and its op: a mixture layer's routed experts over gguf-format weights in
one C call (see moe.c). The fields mirror moe.c's Kernels and Experts in order and type."""

from __future__ import annotations

import ctypes

import torch

from specdec.model.config import MLP_ACTIVATIONS  # act_mul_rows' kinds: their indices
from specdec.model.kernels.libraries import I64, P, gguf, moe, rows


class MoEKernels(ctypes.Structure):
    """moe.c's Kernels: rows.c's act_mul_rows and gguf_linear.c's gguf_linear, as the per-expert path calls them."""

    _fields_ = [("act", P), ("linear", P)]


def moe_kernels() -> MoEKernels:
    def address(fn) -> int:
        return ctypes.cast(fn, ctypes.c_void_p).value

    return MoEKernels(address(rows().act_mul_rows), address(gguf().gguf_linear))


class MoEExperts(ctypes.Structure):
    """moe.c's Experts: E experts' stacked gate, up and down weights in the kernel's layout (GGUFParts of
    (E * I, row_bytes), (E * I, row_bytes) and (E * H, row_bytes)): type, address and row bytes of each."""

    _fields_ = [("experts", I64), ("hidden", I64), ("inter", I64), ("types", ctypes.c_int32 * 3),
                ("pad", ctypes.c_int32), ("base", ctypes.c_uint64 * 3), ("row_bytes", I64 * 3)]

    @classmethod
    def of(cls, parts, experts: int, hidden: int, intermediate: int) -> "MoEExperts":
        """parts: the three one-part kernels.GGUFParts (gate, up, down)."""
        types = [p.types[0] for p in parts]
        tensors = [p.tensors[0] for p in parts]
        return cls(experts, hidden, intermediate, (ctypes.c_int32 * 3)(*types), 0,
                   (ctypes.c_uint64 * 3)(*[t.data_ptr() for t in tensors]),
                   (I64 * 3)(*[t.shape[1] * t.element_size() for t in tensors]))


def moe_experts(x, ids, weights, experts: MoEExperts, act: str, handles: MoEKernels | None = None):
    """x (n, H) float32, ids (n, k) int64 (each row's experts, distinct, in increasing order, each < E),
    weights (n, k) float32 -> (n, H) float32: sum over j in order of weights[:, j] * expert ids[:, j] (x)."""
    if act not in MLP_ACTIVATIONS:
        raise ValueError(f"unknown MLP activation {act!r}; the kernel computes {', '.join(MLP_ACTIVATIONS)}")
    x = x.contiguous()
    ids, weights = ids.to(torch.int64).contiguous(), weights.to(torch.float32).contiguous()
    n, k = ids.shape
    if x.shape != (n, experts.hidden) or weights.shape != (n, k):
        raise ValueError(f"rows {tuple(x.shape)}, ids {tuple(ids.shape)} and weights {tuple(weights.shape)} do not "
                         f"fit {experts.experts} experts of hidden size {experts.hidden}")
    if n and (int(ids.min()) < 0 or int(ids.max()) >= experts.experts):
        raise ValueError(f"expert ids must lie in 0..{experts.experts - 1}")
    out = torch.empty(n, experts.hidden)
    handles = handles or moe_kernels()
    if moe().moe_experts(ctypes.byref(handles), ctypes.byref(experts), x.data_ptr(), n, k, ids.data_ptr(),
                         weights.data_ptr(), MLP_ACTIVATIONS.index(act), out.data_ptr(), torch.get_num_threads()):
        raise MemoryError(f"the mixture kernel could not allocate scratch for {n} rows of {k} experts")
    return out
