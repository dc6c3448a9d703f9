"""The mixture-of-experts MLP at run time: routing, the routed experts, the shared expert.

What it computes is model/moe_config.py's (transformers' qwen3_moe / glm4_moe / qwen3_5_moe blocks):

    scores (n, E) = softmax or sigmoid(router(h))        choice: top k of scores (+ bias, by group)
    out (n, H)    = sum over the row's k experts, in increasing expert id, of weight * expert(h)  (+ shared)

Exactness: a row's bits depend on its own inputs only. Its router logits come from a row-invariant linear
(fp32 one row at a time, or the gguf kernel), its scores, choice and weights from per-row ops, and each
expert runs the kernels of model/linear.py over the rows routed to it (row-invariant for exact rows). A
row's k expert outputs are then added one by one in increasing expert id, whatever rows share the call:
so a row verified among k drafted rows, or beside other sequences, gets the bits of a single step.
Prefill (exact=False) rows of each sequence run apart, as the dense layers' do (transformer._linear_by_spans).

Cost: only the chosen experts' weights are read. In the gguf format the file's stacked expert tensors
(llama.cpp's ffn_*_exps, (E, rows, row_bytes) blocks) are repacked once, whole, and each expert is a view
of its rows (a pointer into them), given to the gguf kernel for the rows routed to it: nothing is copied
per token and a step reads k of the E experts. Where moe.c loaded (kernels.moe), a layer's router, routing and
routed experts run in one C call (the routing with its own exp, row by row; the experts through the same kernels
in the same order as the Python loop over experts below, so the same bits; see moe.c). Other formats hold one
QLinear pair per expert.
"""

from __future__ import annotations

import ctypes
from functools import partial

import torch

from specdec.model import kernels
from specdec.model.errors import ModelFileError
from specdec.model.layers import _row_kernel, mlp_act
from specdec.model.linear import GGUF_KERNEL_TYPES, QLinear
from specdec.model.moe_config import MoEConfig

Spans = list[tuple[slice, bool]]  # (rows, exact) of each sequence in a forward, in row order


class _ExpertParts:
    """One expert's rows inside stacked, repacked gguf parts, in the shape kernels.gguf_linear takes (GGUFParts'
    count / types / addresses / rows / row_bytes / out_features): pointers into the whole, no copy."""

    def __init__(self, parts: list[tuple[int, int, int, int]]):
        n = len(parts)  # (ggml type id, address, rows, row_bytes) each
        self.count = n
        self.types = (ctypes.c_int32 * n)(*[p[0] for p in parts])
        self.addresses = (ctypes.c_uint64 * n)(*[p[1] for p in parts])
        self.rows = (ctypes.c_int64 * n)(*[p[2] for p in parts])
        self.row_bytes = (ctypes.c_int64 * n)(*[p[3] for p in parts])
        self.out_features = sum(p[2] for p in parts)


class GGUFExperts:
    """E experts from a GGUF file's stacked tensors, computed on the file's blocks (the gguf format).

    gate, up: (type, (E * I, row_bytes)) as GGUFModel.expert_blocks gives them; down: (type, (E * H, row_bytes)).
    """

    def __init__(self, gate, up, down, experts: int, hidden: int, intermediate: int):
        self.experts, self.hidden, self.intermediate = experts, hidden, intermediate
        # each stacked tensor repacked once (kernels.GGUFParts); experts are views of their rows
        self.whole = [kernels.GGUFParts([(0, t.float().contiguous()) if kind == "F32" else (GGUF_KERNEL_TYPES[kind], t)])
                      for kind, t in (gate, up, down)]

        def view(part: kernels.GGUFParts, e: int, rows: int) -> tuple[int, int, int, int]:
            t, type_id = part.tensors[0], part.types[0]
            row_bytes = t.shape[1] * t.element_size()
            return type_id, t.data_ptr() + e * rows * row_bytes, rows, row_bytes

        g, u, d = self.whole
        self.gate_up = [_ExpertParts([view(g, e, intermediate), view(u, e, intermediate)]) for e in range(experts)]
        self.down = [_ExpertParts([view(d, e, hidden)]) for e in range(experts)]
        # moe.c: all of a layer's routed experts in one call (the same kernels, the same bits), where it loaded
        self.native = None if kernels.moe() is None else (kernels.MoEExperts.of(self.whole, experts, hidden,
                                                                                intermediate), kernels.moe_kernels())

    def gate_up_rows(self, e: int, x: torch.Tensor, exact: bool) -> torch.Tensor:
        """(n, H) -> (n, 2I): expert e's gate rows, then its up rows."""
        return kernels.gguf_linear(x, self.gate_up[e])

    def down_rows(self, e: int, a: torch.Tensor, exact: bool) -> torch.Tensor:
        """(n, I) -> (n, H)."""
        return kernels.gguf_linear(a, self.down[e])

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for part in self.whole for t in part.tensors)


class QExperts:
    """E experts as one QLinear pair each (gate and up fused, then down), in any weight format but gguf."""

    def __init__(self, matrices: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], fmt: str):
        # matrices: per expert (gate (I, H), up (I, H), down (H, I)) float32
        self.experts = len(matrices)
        self.gate_up = [QLinear(torch.cat([g, u]), None, fmt) for g, u, _ in matrices]
        self.down = [QLinear(d, None, fmt) for _, _, d in matrices]

    def gate_up_rows(self, e: int, x: torch.Tensor, exact: bool) -> torch.Tensor:
        return self.gate_up[e](x, exact)

    def down_rows(self, e: int, a: torch.Tensor, exact: bool) -> torch.Tensor:
        return self.down[e](a, exact)

    def nbytes(self) -> int:
        return sum(m.nbytes() for m in (*self.gate_up, *self.down))


class MoE:
    """One mixture layer's MLP: (N, H) normed rows -> (N, H). See the module docstring.

    router: (E, H) QLinear; bias: (E,) float32 selection bias or None; experts: GGUFExperts or QExperts;
    shared: (gate_up (2S, H), down (H, S)) QLinears or None; shared_gate: (1, H) QLinear or None;
    act: the MLP activation; norm: the layer's MLP norm weight (which activation kernel runs, as mlp_act says).
    """

    def __init__(self, cfg: MoEConfig, router: QLinear, bias: torch.Tensor | None, experts, shared, shared_gate,
                 act: str, norm: torch.Tensor):
        self.cfg, self.router, self.bias, self.experts = cfg, router, bias, experts
        self.shared, self.shared_gate, self.act, self.norm = shared, shared_gate, act, norm

    def __call__(self, h: torch.Tensor, spans: Spans | None = None) -> torch.Tensor:
        """h (N, H) -> (N, H). spans: each sequence's (rows, exact); default all rows exact, one sequence."""
        spans = spans or [(slice(0, h.shape[0]), True)]
        exact_rows = [torch.arange(rows.start, rows.stop) for rows, exact in spans if exact]
        groups = [(torch.cat(exact_rows), True)] if exact_rows else []
        groups += [(torch.arange(rows.start, rows.stop), False) for rows, exact in spans if not exact]
        if len(groups) == 1 and len(groups[0][0]) == h.shape[0]:
            return self._rows(h, groups[0][1])
        out = torch.empty_like(h)
        for rows, exact in groups:  # the exact rows together (row-invariant), each prefill span alone
            out[rows] = self._rows(h[rows], exact)
        return out

    # -- routing -------------------------------------------------------------------------------
    def route(self, h: torch.Tensor, exact: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """h (n, H) -> (ids (n, k) int64 in increasing order, weights (n, k) float32): each row's experts and
        their weights, from per-row ops only."""
        c = self.cfg
        logits = self.router(h, exact)  # (n, E) float32
        if (native := self._route(h)) is not None:  # moe.c's routing, row by row (see moe.c)
            return kernels.moe_route(logits, native)
        scores = _by_row(partial(torch.softmax, dim=-1) if c.scoring == "softmax" else torch.sigmoid, logits, exact)
        choice = scores if self.bias is None else scores + self.bias
        if c.groups > 1:  # keep the best groups_used groups, a group scored by the sum of its two best
            grouped = choice.view(-1, c.groups, c.experts // c.groups)
            best2 = grouped.topk(2, dim=-1).values  # (n, G, 2)
            keep = (best2[..., 0] + best2[..., 1]).topk(c.groups_used, dim=-1).indices  # (n, used)
            mask = torch.zeros(grouped.shape[:2], dtype=torch.bool).scatter_(1, keep, True)
            choice = grouped.masked_fill(~mask[..., None], float("-inf")).view(-1, c.experts)
        ids = choice.topk(c.experts_per_token, dim=-1).indices.sort(dim=-1).values  # (n, k)
        weights = scores.gather(1, ids)
        if c.norm_topk:
            total = weights[:, 0]
            for j in range(1, weights.shape[1]):  # in id order, one add at a time: the same bits whatever n is
                total = total + weights[:, j]
            weights = weights / (total + c.norm_floor if c.norm_floor else total)[:, None]
        if c.routed_scale != 1.0:
            weights = weights * c.routed_scale
        return ids, weights

    # -- the rows of one group ------------------------------------------------------------------
    def _route(self, h: torch.Tensor):
        """moe.c's Route of this layer where moe.c routes it, else None: a gguf router, the kernel loaded, and
        mlp_act's own test on h (the runtime's tensors; a module computes one way, as there)."""
        if not hasattr(self, "_c_route"):
            ok = kernels.moe() is not None and getattr(self.router, "fmt", None) == "gguf"
            self._c_route = kernels.MoERoute.of(self.cfg, self.router._kernel_parts, self.bias) if ok else None
        return self._c_route if self._c_route is not None and _row_kernel(h, self.norm) else None

    def step_args(self) -> tuple[int, int, int] | None:
        """step.c's arguments for this layer (the addresses of its MoEKernels, MoEExperts and MoERoute), where
        _rows makes one moe.c call for all rows and nothing else (no shared expert); else None."""
        native, route = getattr(self.experts, "native", None), self._route(self.norm)  # h: float32 rows as norm is
        if native is None or route is None or self.shared is not None:
            return None
        return ctypes.addressof(native[1]), ctypes.addressof(native[0]), ctypes.addressof(route)

    def _rows(self, h: torch.Tensor, exact: bool) -> torch.Tensor:
        native, route = getattr(self.experts, "native", None), self._route(h)
        if native is not None and route is not None:  # moe.c: router, routing and routed experts in one call
            out = kernels.moe_rows(h, native[0], route, self.act, native[1])[0]
        else:
            out = self._routed(h, exact)
        if self.shared is not None:
            gate_up, down = self.shared
            g, u = gate_up(h, exact).chunk(2, dim=-1)
            shared = down(mlp_act(g, u, self.act, self.norm), exact)
            if self.shared_gate is not None:
                shared = _by_row(torch.sigmoid, self.shared_gate(h, exact), exact) * shared
            out = out + shared
        return out

    def _routed(self, h: torch.Tensor, exact: bool) -> torch.Tensor:
        """The routed experts' weighted sum (n, H) through a Python loop over experts (moe.c's work, the same bits)."""
        n, H = h.shape
        ids, weights = self.route(h, exact)
        k = ids.shape[1]
        if n == 1:  # a decode step: the same products and adds as below, without the bookkeeping (~1/4 of a step)
            out = None
            for j, e in enumerate(ids[0].tolist()):
                part = self.expert(e, h, exact) * weights[:, j, None]
                out = part if out is None else out + part
        else:
            parts = torch.empty(n, k, H)  # weight * expert output, by (row, rank in id order)
            for e in torch.unique(ids).tolist():
                rows, ranks = (ids == e).nonzero(as_tuple=True)
                parts[rows, ranks] = self.expert(e, h[rows], exact) * weights[rows, ranks, None]
            out = parts[:, 0]
            for j in range(1, k):
                out = out + parts[:, j]
        return out

    def expert(self, e: int, x: torch.Tensor, exact: bool = True) -> torch.Tensor:
        """Expert e's MLP on rows x (n, H) -> (n, H)."""
        g, u = self.experts.gate_up_rows(e, x, exact).chunk(2, dim=-1)
        return self.experts.down_rows(e, mlp_act(g, u, self.act, self.norm), exact)

    # -- sizes -----------------------------------------------------------------------------------
    def _dense(self) -> list[QLinear]:
        return [self.router, *(self.shared or ()), *([self.shared_gate] if self.shared_gate is not None else [])]

    def nbytes(self) -> int:
        """Bytes held: router, every expert, the shared expert."""
        return sum(m.nbytes() for m in self._dense()) + self.experts.nbytes()

    def active_bytes(self) -> int:
        """Bytes one token's step reads: router, shared expert and k of the E experts."""
        return sum(m.nbytes() for m in self._dense()) + self.experts.nbytes() * self.cfg.experts_per_token // \
            self.cfg.experts


def _by_row(fn, x: torch.Tensor, exact: bool) -> torch.Tensor:
    """fn(x) for x (n, m), each row computed alone where exact: torch's vectorized sigmoid and exp give an element
    other bits in a vector's tail than in its body, and where the tail falls depends on how many rows share the
    call (measured: sigmoid of 8 rows of 8 scores differs from 8 one-row calls)."""
    if not exact or x.shape[0] == 1:
        return fn(x)
    return torch.cat([fn(x[i : i + 1]) for i in range(x.shape[0])])


# -- building one from a checkpoint ---------------------------------------------------------------
def build_moe(source, c, prefix: str, weights_format: str, norm: torch.Tensor, get) -> MoE:
    """The MoE of the layer at `prefix` ("model.layers.3.") of a checkpoint: a GGUFModel (stacked experts,
    llama.cpp's layout renamed) or an HFModel (per-expert tensors mlp.experts.{e}.gate_proj.weight ..., or
    transformers 5's fused mlp.experts.gate_up_proj / down_proj). get(name, shape): the checked tensor."""
    m: MoEConfig = c.moe
    E, I, H, S = m.experts, m.expert_intermediate, c.hidden_size, m.shared_intermediate
    names = set(source.names())

    def linear(weights: list[str], shape: tuple[int, int]) -> QLinear:
        if weights_format == "gguf":
            q = QLinear.from_gguf([source.blocks(n) for n in weights], None)
            if (q.out_features, q.in_features) != shape:
                raise ModelFileError(getattr(source, "path", "checkpoint"), f"{' + '.join(weights)}: shape "
                                     f"{(q.out_features, q.in_features)}; the metadata imply {shape}")
            return q
        return QLinear(torch.cat([get(n, (shape[0] // len(weights), shape[1])) for n in weights]), None, weights_format)

    # the router in float32 whatever the format (a choice of experts is no place to round), or the file's blocks
    router = (linear([prefix + "mlp.gate.weight"], (E, H)) if weights_format == "gguf"
              else QLinear(get(prefix + "mlp.gate.weight", (E, H)), None, "fp32"))
    bias = get(prefix + "mlp.gate.e_score_correction_bias", (E,)).float().contiguous() if m.score_bias else None
    stacked = prefix + "mlp.experts.gate_proj.weight" in names
    if weights_format == "gguf":
        if not stacked:
            raise ValueError("--weights gguf keeps a GGUF file's own quantized blocks, and this checkpoint is not a "
                             "GGUF file; use --weights int8, w8a8, bf16 or fp32")
        blocks = [source.expert_blocks(prefix + f"mlp.experts.{p}_proj.weight") for p in ("gate", "up", "down")]
        for (kind, t), rows in zip(blocks, (I, I, H)):
            if t.shape[0] != E * rows:
                raise ModelFileError(source.path, f"{prefix}experts: {t.shape[0]} rows for {E} experts of {rows}")
        experts = GGUFExperts(*blocks, E, H, I)
    else:
        experts = QExperts(_expert_matrices(get, names, prefix, E, I, H, stacked), weights_format)
    shared = shared_gate = None
    if S:
        base = prefix + ("mlp.shared_experts." if prefix + "mlp.shared_experts.gate_proj.weight" in names
                         else "mlp.shared_expert.")
        shared = (linear([base + "gate_proj.weight", base + "up_proj.weight"], (2 * S, H)),
                  linear([base + "down_proj.weight"], (H, S)))
        if m.shared_gate:
            gate = get(prefix + "mlp.shared_expert_gate.weight").reshape(1, H)
            shared_gate = QLinear(gate, None, "fp32")
    return MoE(m, router, bias, experts, shared, shared_gate, c.mlp_act, norm)


def _expert_matrices(get, names: set[str], prefix: str, E: int, I: int, H: int, stacked: bool):
    """[(gate (I, H), up (I, H), down (H, I))] per expert, float32, from whichever layout the checkpoint has."""
    if stacked:  # a GGUF file read in another format: llama.cpp's stacked tensors
        g, u, d = (get(prefix + f"mlp.experts.{p}_proj.weight", shape)
                   for p, shape in (("gate", (E, I, H)), ("up", (E, I, H)), ("down", (E, H, I))))
        return [(g[e], u[e], d[e]) for e in range(E)]
    if prefix + "mlp.experts.gate_up_proj" in names:  # transformers 5's fused (E, 2I, H) and (E, H, I)
        gu = get(prefix + "mlp.experts.gate_up_proj", (E, 2 * I, H))
        d = get(prefix + "mlp.experts.down_proj", (E, H, I))
        return [(gu[e, :I], gu[e, I:], d[e]) for e in range(E)]
    p = prefix + "mlp.experts."
    return [(get(f"{p}{e}.gate_proj.weight", (I, H)), get(f"{p}{e}.up_proj.weight", (I, H)),
             get(f"{p}{e}.down_proj.weight", (H, I))) for e in range(E)]
