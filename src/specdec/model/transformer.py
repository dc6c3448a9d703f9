"""The decoder-only transformer (Llama, Qwen2, Qwen3, Gemma 3), written for speculation.

One forward takes several new tokens per sequence with explicit positions, an
optional tree mask, and returns logits plus the hidden states of chosen layers.

Numerics: with `exact=True` every output row is computed with exactly the ops a
one-token decode step would use (row-invariant matmuls, and attention that reduces
each query row over exactly its own keys, in order). So verifying k drafted tokens
in one pass gives bitwise the logits k single steps would give, and greedy
speculative output equals plain greedy output by construction. The exact attention rows of a
whole forward (every sequence of a batch) go through one call of model/kernels/attend.c, which
computes each row in a fixed order of its own; without a C compiler or AVX2, torch does the same
row by row (different bits from the kernel's, the same guarantee).
`exact=False` (prefill) uses fused attention; plain and speculative decoding share it.

The layer itself is model/layers.py's decoder_layer, the one every model in specdec runs;
this file gives it the runtime's weights (fused QLinear matrices, see model/linear.py) and its
attention over the per-slot KV cache (model/cache_attention.py, over cache/kv.py). A forward whose
rows are all exact, over gguf weights, runs the same ops through model/kernels/step.c instead (two
C calls a layer, the same kernels in the same order: the same bits), which took smollm2-135m's
decode step from ~5.8 to ~4.2 ms.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import partial

import torch

from specdec.cache.kv import KVCache
from specdec.model import kernels
from specdec.model.cache_attention import KERNEL_CACHE_DTYPES, CacheAttention
from specdec.model.config import MLP_ACTIVATIONS, ModelConfig
from specdec.model.errors import CacheOverflowError
from specdec.model.layers import RopeTable, decoder_layer, rms_norm, softcap
from specdec.model.linear import ROW_VARIANT_FORMATS, QLinear
from specdec.model.moe import MoE
from specdec.model.segments import ForwardOutput, Segment, segment_layout

# What the KV cache holds (--cache-type): float16, as llama.cpp keeps it by default, or float32. A step reads
# every cached key and value of every layer, so at long contexts the cache's bytes rival the weights': after
# 3000 tokens qwen2.5-coder-1.5b's is 172 MB a step in float32, against ~1 GB of weights. Both are exact
# (a k-token forward reads the same stored values as k one-token steps); float16 rounds each stored value.
CACHE_TYPES = {"f16": torch.float16, "f32": torch.float32}


def default_kv_dtype(weights_format: str) -> torch.dtype:
    """What the CPU runtime's KV cache holds unless --cache-type says: f16 (half the bytes read at long
    contexts, output exact either way), f32 for fp32 weights."""
    return torch.float32 if weights_format == "fp32" else torch.float16


@dataclass
class Layer:
    """One decoder layer's weights as the runtime stores them: q/k/v and gate/up fused into one QLinear."""

    qkv: QLinear  # q, k, v projections fused: (q_size + 2 * kv_size, H)
    o: QLinear
    gate_up: QLinear | None  # gate and up fused: (2 * I, H); None in a mixture-of-experts layer
    down: QLinear | None
    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None  # Gemma 3: norms of the attention and MLP outputs
    mlp_out_norm: torch.Tensor | None = None
    moe: MoE | None = None  # a mixture-of-experts layer's MLP (model/moe.py), in place of gate_up and down


class _QuantWeights:
    """A Layer as model.layers.LayerWeights for one forward over the rows of one or more sequences.

    spans: (rows, exact) per sequence, in row order. Exact rows of every format but fp32 are
    row-invariant, so one matmul serves them all; fp32, and the prefill (exact=False) path of the
    int8 formats, run each sequence's rows as that sequence alone would (see _linear_by_spans),
    so a sequence's numerics never depend on what else is in the batch.
    """

    __slots__ = ("layer", "spans", "heads", "kv_heads", "head_dim", "eps", "attn_norm", "mlp_norm", "q_norm",
                 "k_norm", "attn_out_norm", "mlp_out_norm", "act", "moe")

    def __init__(self, layer: Layer, config: ModelConfig, spans: list[tuple[slice, bool]]):
        self.layer, self.spans = layer, spans
        self.heads, self.kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.eps = config.rms_norm_eps
        self.attn_norm, self.mlp_norm = layer.attn_norm, layer.mlp_norm
        self.q_norm, self.k_norm = layer.q_norm, layer.k_norm
        self.attn_out_norm, self.mlp_out_norm, self.act = layer.attn_out_norm, layer.mlp_out_norm, config.mlp_act
        self.moe = None if layer.moe is None else partial(layer.moe, spans=spans)

    def qkv(self, h: torch.Tensor) -> torch.Tensor:
        return _linear_by_spans(self.layer.qkv, h, self.spans)

    def o(self, attn: torch.Tensor) -> torch.Tensor:
        return _linear_by_spans(self.layer.o, attn, self.spans)

    def gate_up(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return _linear_by_spans(self.layer.gate_up, h, self.spans).chunk(2, dim=-1)

    def down(self, a: torch.Tensor) -> torch.Tensor:
        return _linear_by_spans(self.layer.down, a, self.spans)


def _moe(layer) -> MoE | None:
    """A layer's mixture-of-experts MLP, None for a dense one (or a kind of layer without the field)."""
    return getattr(layer, "moe", None)


def _linear_by_spans(linear: QLinear, x: torch.Tensor, spans: list[tuple[slice, bool]]) -> torch.Tensor:
    """linear(x) where x's rows belong to the sequences in spans: (N, K) -> (N, N_out).

    Exact rows of a row-invariant format go through one matmul together; every other span runs
    alone (fp32, and the prefill paths whose bits depend on the row count), as it would unbatched.
    """
    if len(spans) == 1:
        return linear(x, spans[0][1])
    if linear.fmt in ROW_VARIANT_FORMATS:  # their prefill (inexact) rows depend on the row count too
        return torch.cat([linear(x[rows], exact) for rows, exact in spans])
    if all(exact for _, exact in spans):
        return linear(x, True)
    y = torch.empty(x.shape[0], linear.out_features)
    exact_rows = [torch.arange(rows.start, rows.stop) for rows, exact in spans if exact]
    if exact_rows:
        picked = torch.cat(exact_rows)
        y[picked] = linear(x[picked], True)
    prefill = [rows for rows, exact in spans if not exact]
    for rows, part in zip(prefill, linear.prefill([x[rows] for rows in prefill])):
        y[rows] = part
    return y


class Transformer(CacheAttention):
    exact_trees = True  # a tree's rows are bitwise the single steps of their paths (module docstring)
    # forwards whose rows are all exact run their layers through model/kernels/step.c where it can (gguf
    # weights, the kernels loaded): the same bits as the per-op path, without ~15 Python-level ops a layer
    step_kernel = True

    def __init__(self, config: ModelConfig, embed: torch.Tensor, layers: list[Layer], norm: torch.Tensor,
                 lm_head: QLinear, weights_format: str):
        self.config = config
        self.embed = embed  # (V, H): float32 or bf16 rows, or the file's blocks (BlockRows); looked up, widened
        self.layers = layers
        self.norm = norm
        self.lm_head = lm_head
        self.weights_format = weights_format
        self.kv_dtype = default_kv_dtype(weights_format)  # load_model's cache_type may change it
        self.max_positions = config.context_length
        # rows computed as positions reach them, not max_positions of them at every start (RopeTable)
        self.rope = RopeTable(config.rotary_dims, config.rope_theta, self.max_positions, config.rope_freq_factors)
        self.local_rope = None  # the local layers' table, when their RoPE differs
        if config.sliding_layers and config.rope_local_theta is not None:
            self.local_rope = RopeTable(config.rotary_dims, config.rope_local_theta, self.max_positions)
        self.attn_scale = config.attention_scale  # query_pre_attn_scalar ** -0.5 for Gemma
        # exact attention rows through attend.c when it builds here (AVX2, a C compiler) and fits the heads
        self._attend_kernel = (config.head_dim % 8 == 0 and config.head_dim <= kernels.ATTEND_MAX_HEAD_DIM
                               and config.num_heads // config.num_kv_heads <= kernels.ATTEND_MAX_GROUP
                               and kernels.attend() is not None)
        # float32, as transformers multiplies an fp32 embedding (and llama.cpp its dequantized rows)
        self.embed_scale = torch.tensor(config.embed_scale, dtype=torch.float32) if config.embed_scale != 1.0 else None

    # -- sizes -------------------------------------------------------------------------------
    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads (all matrices, norms, one embedding row)."""
        row = self.embed.row_bytes() if hasattr(self.embed, "row_bytes") else self.embed.shape[1] * self.embed.element_size()
        total = self.lm_head.nbytes() + row
        for layer in self.layers:  # a mixture layer: its router, shared expert and k of its experts
            total += sum(m.nbytes() for m in (layer.qkv, layer.o, layer.gate_up, layer.down) if m is not None)
            total += layer.moe.active_bytes() if layer.moe is not None else 0
        return total

    def new_cache(self, max_len: int | None = None, num_slots: int = 1) -> KVCache:
        c = self.config
        max_len = min(max_len or c.context_length, self.max_positions)
        return KVCache(c.num_layers, c.num_kv_heads, c.head_dim, max_len, num_slots, dtype=self.kv_dtype)

    # -- forward -----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        slots: list[int],
        positions: torch.Tensor | None = None,
        tree_mask: torch.Tensor | None = None,
        hidden_layers: tuple[int, ...] = (),
        exact: bool = True,
        last_only: bool = False,
    ) -> ForwardOutput:
        """Run new tokens through the model, appending their K/V to each slot of the cache.

        tokens:    (B, T) ids; row b continues the sequence in cache slot slots[b].
        positions: (B, T) RoPE positions; default start_b + arange(T). A tree passes
                   start_b + depth - 1 for each node.
        tree_mask: (B, T, T) bool; [b, i, j] True when new token i attends new token j.
                   Default causal. Every row always attends the whole committed prefix.
        hidden_layers: indices as in transformers' hidden_states: 0 = embeddings,
                   i = output of decoder layer i-1, num_layers = last layer before the norm.
        exact:     decode-identical numerics per row (see module docstring).
        last_only: compute logits for the last row of each sequence only (prefill).
        The cache length of each slot grows by T; the caller truncates what it rejects.
        """
        segments = [Segment(tokens[b], slot, None if positions is None else positions[b],
                            None if tree_mask is None else tree_mask[b], exact, last_only)
                    for b, slot in enumerate(slots)]
        outs = self.forward_batch(segments, cache, hidden_layers)
        return ForwardOutput(torch.cat([o.logits for o in outs]),
                             {layer: torch.cat([o.hidden[layer] for o in outs]) for layer in outs[0].hidden})

    @torch.inference_mode()
    def forward_batch(self, segments: list[Segment], cache: KVCache,
                      hidden_layers: tuple[int, ...] = ()) -> list[ForwardOutput]:
        """One forward over several sequences' new tokens, each T_b long (continuous batching).

        All rows go through each matmul together; attention runs per sequence over its own slot.
        A sequence's outputs are bitwise what a forward of that sequence alone gives (the
        formats are row-invariant; see _QuantWeights), so batching never changes an answer.
        Returns one ForwardOutput per segment: logits (1, T_b or 1, V), hidden {layer: (1, T_b, H)}.
        """
        c = self.config
        if not segments:
            return []
        starts, positions = segment_layout(segments, cache, self.max_positions)
        sizes = [len(seg.tokens) for seg in segments]
        spans, row = [], 0
        for seg, size in zip(segments, sizes):
            spans.append((slice(row, row + size), seg.exact))
            row += size
        positions = torch.cat(positions)
        rope = self.rope.rows(positions)  # cos, sin: (N, 1, hd)
        local_rope = rope if self.local_rope is None else self.local_rope.rows(positions)

        tokens = torch.cat([torch.as_tensor(seg.tokens).reshape(-1) for seg in segments])
        x = self.embed_rows(tokens)  # (N, H)
        hidden = {}
        if 0 in hidden_layers:
            hidden[0] = x
        key_lists: dict[int, tuple] = {}  # window -> the exact rows' key lists (attend.c), shared by the layers
        if (self.step_kernel and all(exact for _, exact in spans) and cache.k.dtype in KERNEL_CACHE_DTYPES
                and self._step_layers() is not None):
            for window in {c.window(li) for li in range(c.num_layers)}:
                key_lists[window] = self._exact_key_lists(segments, starts, spans, positions, window)
            x = self._layers_in_c(x, cache, segments, starts, spans, rope, local_rope, key_lists, hidden_layers, hidden)
        else:  # the per-op path
            for li, layer in enumerate(self.layers):
                window = c.window(li)
                attend = partial(self._attend_segments, cache, li, window, segments, starts, spans, positions,
                                 key_lists)
                x = decoder_layer(x, _QuantWeights(layer, c, spans), attend, *(local_rope if window else rope))
                if li + 1 in hidden_layers:
                    hidden[li + 1] = x
        for seg, start, size in zip(segments, starts, sizes):
            cache.lengths[seg.slot] = start + size

        return self._outputs(x, segments, spans, hidden)

    def _outputs(self, x: torch.Tensor, segments: list[Segment], spans: list[tuple[slice, bool]],
                 hidden: dict[int, torch.Tensor]) -> list[ForwardOutput]:
        """Each segment's ForwardOutput from the last layer's rows x (N, H): logits of its last row (last_only)
        or of all its rows, final norm and head per span as the layers ran, and its rows of `hidden`."""
        c = self.config
        head_spans, picked, row = [], [], 0  # the rows that get logits, and each sequence's span among them
        for seg, (rows, exact) in zip(segments, spans):
            take = slice(rows.stop - 1, rows.stop) if seg.last_only else rows
            picked.append(x[take])
            head_spans.append((slice(row, row + take.stop - take.start), exact))
            row += take.stop - take.start
        h = rms_norm(torch.cat(picked), self.norm, c.rms_norm_eps)
        logits = _linear_by_spans(self.lm_head, h, head_spans)
        logits = softcap(logits, c.final_logit_softcap)
        return [ForwardOutput(logits[hs][None], {layer: t[rows][None] for layer, t in hidden.items()})
                for (hs, _), (rows, _) in zip(head_spans, spans)]

    def _step_layers(self):
        """(step.c's kernels, its Layer array, the tensors they point into) for this model, built once; None
        where step.c cannot run it: a matrix not in the gguf format, or a kernel that did not load here."""
        if not hasattr(self, "_step"):
            self._step = None
            if self._attend_kernel and kernels.step() is not None and not self.config.rope_dims and all(
                    m is not None and m.fmt == "gguf" for layer in self.layers
                    for m in (layer.qkv, layer.o, *((layer.gate_up, layer.down) if _moe(layer) is None else ()))) and all(
                    _moe(layer).step_args() is not None for layer in self.layers if _moe(layer) is not None):
                keep, layers = [], []

                def address(t):
                    if t is None:
                        return None
                    keep.append(t.float().contiguous())
                    return keep[-1].data_ptr()

                for li, layer in enumerate(self.layers):
                    linears = [kernels.StepLinear() if m is None else kernels.StepLinear.of(m._kernel_parts,
                                                                                            m.in_features, m.bias)
                               for m in (layer.qkv, layer.o, layer.gate_up, layer.down)]  # a mixture: no gate_up, down
                    norms = [address(t) for t in (layer.attn_norm, layer.mlp_norm, layer.q_norm, layer.k_norm,
                                                  layer.attn_out_norm, layer.mlp_out_norm)]
                    moe = (None,) * 3 if _moe(layer) is None else _moe(layer).step_args()  # model/moe.py's moe.c call
                    layers.append(kernels.StepLayer(*linears, *norms, int(self.config.window(li) > 0), *moe))
                self._step = kernels.step_kernels(), (kernels.StepLayer * len(layers))(*layers), keep
        return self._step

    def _layers_in_c(self, x: torch.Tensor, cache: KVCache, segments: list[Segment], starts: list[int],
                     spans: list[tuple[slice, bool]], rope, local_rope, key_lists: dict, hidden_layers,
                     hidden: dict) -> torch.Tensor:
        """The decoder layers of a forward whose rows are all exact, through step.c: the per-op path's
        kernels in its order (the same bits), one C call for the layers between two hidden states the
        caller keeps. x (N, H) is updated in place and returned; hidden as the per-op path fills it."""
        c = self.config
        step_kernels, layers, _ = self._step
        M, H, nh, nkv, hd = x.shape[0], c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        inter = max((layer.gate_up.out_features // 2 for layer in self.layers if layer.gate_up is not None), default=1)
        x = x.clone() if 0 in hidden_layers else x.contiguous()  # hidden[0] keeps the embedding rows

        def scratch(width: int) -> torch.Tensor:
            return torch.empty(M, width)

        bufs = {"gate_up": scratch(2 * inter), "act_out": scratch(inter), "h": scratch(H),
                "qkv": scratch((nh + 2 * nkv) * hd), "qk": scratch((nh + nkv) * hd), "rot": scratch((nh + nkv) * hd),
                "part": scratch(nh * hd), "attn": scratch(nh * hd), "out": scratch(max(H, nkv * hd))}
        first_rows = torch.tensor([0] + [rows.stop for rows, _ in spans], dtype=torch.int64)
        seg = [torch.tensor([s.slot for s in segments], dtype=torch.int64), torch.tensor(starts, dtype=torch.int64),
               first_rows]
        pair = ctypes.c_void_p * 2
        windows = (0, c.sliding_window if c.sliding_layers else 0)
        ropes = (rope, local_rope)
        # (slot, offsets, keys) of the global and the local layers (a kind of layer the model lacks: unread)
        lists = [key_lists.get(w, next(iter(key_lists.values())))[1:] for w in windows]
        f = kernels.StepForward(
            M, H, nh, nkv, hd, inter, MLP_ACTIVATIONS.index(c.mlp_act), torch.get_num_threads(), c.rms_norm_eps,
            self.attn_scale, pair(*(r[0].data_ptr() for r in ropes)), pair(*(r[1].data_ptr() for r in ropes)),
            *(pair(*(keys[i].data_ptr() for keys in lists)) for i in range(3)),
            len(segments), *(t.data_ptr() for t in seg), cache.k.data_ptr(), cache.v.data_ptr(), cache.k[0].numel(),
            cache.k.shape[1], cache.k.shape[3], int(cache.k.dtype == torch.float16), x.data_ptr(),
            *(b.data_ptr() for b in bufs.values()))
        stops = sorted({li for li in hidden_layers if 0 < li < len(self.layers)} | {len(self.layers)})
        done = 0
        for stop in stops:
            kernels.step().step_layers(ctypes.byref(step_kernels), layers, done, stop, ctypes.byref(f))
            if f.overflow:
                raise CacheOverflowError(f.overflow)
            if stop in hidden_layers:
                hidden[stop] = x.clone()
            done = stop
        return x

    def embed_rows(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (N,) -> the first layer's input rows (N, H) float32 (Gemma: scaled by sqrt(H))."""
        x = self.embed[tokens].float()
        return x if self.embed_scale is None else x * self.embed_scale
