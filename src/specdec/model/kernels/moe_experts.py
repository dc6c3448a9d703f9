"""moe.c's argument structs in ctypes and its ops: a mixture layer's routing and routed experts over gguf-format
weights in one C call (see moe.c). The fields mirror moe.c's Kernels, Experts and Route in order and type."""

from __future__ import annotations

import ctypes

import torch

from specdec.model.config import MLP_ACTIVATIONS  # act_mul_rows' kinds: their indices
from specdec.model.kernels.libraries import F32, I64, P, gguf, moe, rows


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


class MoERoute(ctypes.Structure):
    """moe.c's Route: a MoEConfig's routing fields, the selection bias (or None) and the router's GGUFParts."""

    _fields_ = [("experts", I64), ("k", I64), ("groups", I64), ("groups_used", I64), ("sigmoid", ctypes.c_int32),
                ("norm_topk", ctypes.c_int32), ("norm_floor", F32), ("routed_scale", F32), ("bias", P),
                ("nparts", I64), ("types", P), ("weights", P), ("rows", P), ("row_bytes", P)]

    @classmethod
    def of(cls, cfg, router_parts, bias=None) -> "MoERoute":
        """cfg: a MoEConfig; router_parts: the router's kernels.GGUFParts (E rows); bias: (E,) float32 or None,
        held by the caller as long as this is used."""
        if router_parts.out_features != cfg.experts:
            raise ValueError(f"a router of {router_parts.out_features} rows for {cfg.experts} experts")
        p = router_parts
        return cls(cfg.experts, cfg.experts_per_token, cfg.groups, cfg.groups_used, int(cfg.scoring == "sigmoid"),
                   int(cfg.norm_topk), cfg.norm_floor, cfg.routed_scale, None if bias is None else bias.data_ptr(),
                   p.count, ctypes.addressof(p.types), ctypes.addressof(p.addresses), ctypes.addressof(p.rows),
                   ctypes.addressof(p.row_bytes))


def moe_route(logits, route: MoERoute):
    """logits (n, E) float32 -> (ids (n, k) int64 in increasing order, weights (n, k) float32), row by row (moe.c)."""
    logits = logits.to(torch.float32).contiguous()
    if logits.dim() != 2 or logits.shape[1] != route.experts:
        raise ValueError(f"router logits {tuple(logits.shape)} for {route.experts} experts")
    n = logits.shape[0]
    ids, weights = torch.empty(n, route.k, dtype=torch.int64), torch.empty(n, route.k)
    if moe().moe_route(ctypes.byref(route), logits.data_ptr(), n, ids.data_ptr(), weights.data_ptr()):
        raise MemoryError(f"the mixture kernel could not allocate scratch to route {n} rows")
    return ids, weights


def moe_rows(x, experts: MoEExperts, route: MoERoute, act: str, handles: MoEKernels | None = None):
    """x (n, H) float32 -> (out (n, H), ids (n, k), weights (n, k)): the router, each row's routing and its routed
    experts' weighted sum in one call (moe.c), as moe_route and moe_experts compute them."""
    if act not in MLP_ACTIVATIONS:
        raise ValueError(f"unknown MLP activation {act!r}; the kernel computes {', '.join(MLP_ACTIVATIONS)}")
    x = x.contiguous()
    if x.dim() != 2 or x.shape[1] != experts.hidden:
        raise ValueError(f"rows {tuple(x.shape)} for experts of hidden size {experts.hidden}")
    n = x.shape[0]
    out = torch.empty(n, experts.hidden)
    ids, weights = torch.empty(n, route.k, dtype=torch.int64), torch.empty(n, route.k)
    if n and moe().moe_rows(ctypes.byref(handles or moe_kernels()), ctypes.byref(experts), ctypes.byref(route),
                            x.data_ptr(), n, MLP_ACTIVATIONS.index(act), ids.data_ptr(), weights.data_ptr(),
                            out.data_ptr(), torch.get_num_threads()):
        raise MemoryError(f"the mixture kernel could not allocate scratch for {n} rows")
    return out, ids, weights


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
