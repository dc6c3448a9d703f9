"""The runtime on an accelerator (CUDA): the same exact engine, each exact step one fixed-shape program.

    model = load_model("qwen2.5-coder-1.5b", device="cuda")   # model.transformer is a DeviceTransformer
    Engine(model, spec)                                       # drafters, verification: unchanged

Numerics. The CPU runtime is row-invariant because its kernels compute every row alone
(model/transformer.py). A GPU library picks its matmul algorithm by shape, so a 1-row and a 4-row
product may round differently. Here every exact forward runs one program of one shape:
`rows` (default 16) query rows, the real ones first and the rest padding, over all `width` key
positions of its cache slot (max_len and a spare one, rounded up to a multiple of KEY_ALIGN), the
keys a row may not see masked to -inf.
Decode and verify are then the same kernels on the same shapes, and a row's bits depend on its
own inputs only. What this rests on, and what tests/model/test_device.py (CPU) and
scripts/cuda_check.py (GPU) check: a fixed-shape matmul rounds a row the same whichever row of
the operand it is.

Trees are refused in exact forwards (ValueError; the engine refuses --spec-tree-topk > 1 first). A
tree node's ancestors sit at cache offsets start + node index, not at their positions as in the
single steps of its path, and a fixed-width reduction rounds by column: the bits would differ. (The
CPU runtime gathers each row's keys; a per-row gather of the whole key buffer is rows times the
reads here. Left for a kernel that takes per-row key lists.)

What it costs: a decode step is a 16-row forward (on a GPU about a 1-row one, where the weights'
read dominates) and reads all max_len keys of its slot, so a context far longer than the work
is waste (choose --ctx-size to fit). A tree or chain longer than `rows` runs in several calls.

The programs, their cache and their masks are in model/device_program.py. Prefill (exact=False)
runs unpadded with fused attention, as on the CPU: plain and speculative decoding share it.
Weights are dense: a GGUF or int8 model's values as its format represents them
(QLinear.dense_weight), rounded to bf16 on CUDA (--weights fp32 stays float32).

Logits and hidden states come back to the host as float32, so samplers, verifiers and drafter
heads run unchanged; the heads read the target's embedding, norm and output head from the CPU
model it was made from (`host`), which stays loaded.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from specdec.model.config import ModelConfig
from specdec.model.device_program import DeviceKVCache, Program, chain_masks, row_masks
from specdec.model.layers import decoder_layer, rms_norm, rope_tables, softcap
from specdec.model.segments import ForwardOutput, Segment, segment_layout
from specdec.model.transformer import Transformer

DEFAULT_ROWS = 16  # rows of every exact program: the longest draft tree verified in one call, + 1
DEVICES = ("cpu", "cuda")


def pick_device(device: str | None) -> str:
    """The device a model runs on: `device` checked, or cuda when torch sees one, else cpu."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.split(":")[0] not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose cpu or cuda (cuda:N for another GPU)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        built = "with" if torch.backends.cuda.is_built() else "without"
        raise ValueError(f"--device {device}: torch {torch.__version__} (built {built} CUDA) sees no CUDA device here")
    index = device.partition(":")[2]
    if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
        raise ValueError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA device(s), cuda:0 to "
                         f"cuda:{torch.cuda.device_count() - 1}")
    return device


@dataclass
class DenseLayer:
    """One decoder layer's weights on the device, q/k/v and gate/up fused as in model/transformer.Layer."""

    qkv: torch.Tensor  # (q_size + 2 * kv_size, H)
    qkv_bias: torch.Tensor | None
    o: torch.Tensor  # (H, q_size)
    gate_up: torch.Tensor  # (2 * I, H)
    down: torch.Tensor  # (H, I)
    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    attn_out_norm: torch.Tensor | None = None
    mlp_out_norm: torch.Tensor | None = None


class _DenseWeights:
    """A DenseLayer as model.layers.LayerWeights."""

    def __init__(self, layer: DenseLayer, config: ModelConfig):
        self.layer = layer
        self.heads, self.kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.eps, self.act = config.rms_norm_eps, config.mlp_act
        self.attn_norm, self.mlp_norm = layer.attn_norm, layer.mlp_norm
        self.q_norm, self.k_norm = layer.q_norm, layer.k_norm
        self.attn_out_norm, self.mlp_out_norm = layer.attn_out_norm, layer.mlp_out_norm

    def qkv(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.layer.qkv, self.layer.qkv_bias)

    def o(self, attn: torch.Tensor) -> torch.Tensor:
        return F.linear(attn, self.layer.o)

    def gate_up(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.linear(h, self.layer.gate_up).chunk(2, dim=-1)

    def down(self, a: torch.Tensor) -> torch.Tensor:
        return F.linear(a, self.layer.down)


class DeviceTransformer:
    """Transformer's forward and forward_batch on a device, over dense weights; see the module docstring.

    host: the CPU Transformer these weights came from, if any: drafter heads read its embed, norm and
    lm_head (they run on the CPU), and weights_format names the format the values came from.
    """

    exact_trees = False  # exact forwards take chains only (module docstring)

    def __init__(self, config: ModelConfig, embed: torch.Tensor, layers: list[DenseLayer], norm: torch.Tensor,
                 lm_head: torch.Tensor, device: str | torch.device, rows: int = DEFAULT_ROWS,
                 host: Transformer | None = None, graphs: bool = True):
        if rows < 1:
            raise ValueError(f"a device program needs at least one row, got rows={rows}")
        self.config = config
        self.device = torch.device(device)
        self.dtype = embed.dtype
        self.kv_dtype = self.dtype  # what DeviceKVCache holds
        self.rows, self.graphs, self.host = rows, graphs, host
        self.weights = embed, layers, norm, lm_head  # (V, H), [DenseLayer], (H,), (V, H): on the device
        self.max_positions = config.context_length
        self.weights_format = host.weights_format if host is not None else str(self.dtype).removeprefix("torch.")
        self.windows = sorted({config.window(i) for i in range(config.num_layers)})
        cos, sin = rope_tables(config.head_dim, config.rope_theta, self.max_positions, config.rope_freq_factors)
        self.rope = cos.to(self.device, self.dtype), sin.to(self.device, self.dtype)
        self.local_rope = self.rope
        if config.sliding_layers and config.rope_local_theta is not None:
            cos, sin = rope_tables(config.head_dim, config.rope_local_theta, self.max_positions)
            self.local_rope = cos.to(self.device, self.dtype), sin.to(self.device, self.dtype)
        self.attn_scale = config.attention_scale
        self.embed_scale = (torch.tensor(config.embed_scale, dtype=self.dtype, device=self.device)
                            if config.embed_scale != 1.0 else None)
        self._pool = None
        self._pinned: torch.Tensor | None = None  # host buffer that program outputs come back through (CUDA)

    @classmethod
    def from_transformer(cls, host: Transformer, device: str | torch.device, dtype: torch.dtype | None = None,
                         rows: int = DEFAULT_ROWS) -> DeviceTransformer:
        """The CPU model's weights, as its format represents them, in `dtype` on `device` (default bf16 on
        CUDA, but float32 for --weights fp32 and off CUDA)."""
        device = torch.device(device)
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" and host.weights_format != "fp32" else torch.float32)

        def put(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device=device, dtype=dtype)

        layers = [DenseLayer(put(layer.qkv.dense_weight()), put(layer.qkv.bias), put(layer.o.dense_weight()),
                             put(layer.gate_up.dense_weight()), put(layer.down.dense_weight()), put(layer.attn_norm),
                             put(layer.mlp_norm), put(layer.q_norm), put(layer.k_norm), put(layer.attn_out_norm),
                             put(layer.mlp_out_norm)) for layer in host.layers]
        vocab = host.config.vocab_size
        embed = torch.empty(vocab, host.config.hidden_size, dtype=dtype, device=device)
        for lo in range(0, vocab, 8192):  # a block-quantized table is dequantized a few rows at a time
            embed[lo : lo + 8192] = put(host.embed[torch.arange(lo, min(lo + 8192, vocab))])
        return cls(host.config, embed, layers, put(host.norm), put(host.lm_head.dense_weight()), device, rows, host)

    # -- what the engine and the drafters read, as of a Transformer -------------------------------
    @property
    def embed(self):
        return self._host().embed

    @property
    def norm(self) -> torch.Tensor:
        return self._host().norm

    @property
    def lm_head(self):
        return self._host().lm_head

    @property
    def layers(self):
        return self._host().layers

    def _host(self) -> Transformer:
        if self.host is None:
            raise RuntimeError("this device model was built from tensors, without a CPU model: drafter heads that "
                               "read the target's embedding or output head cannot run beside it")
        return self.host

    def weight_tensors(self) -> list[torch.Tensor]:
        """Every weight on the device: the embedding, the final norm, the output head, each layer's."""
        embed, layers, norm, lm_head = self.weights
        return [embed, norm, lm_head] + [t for layer in layers for t in vars(layer).values() if t is not None]

    def weight_bytes_per_token(self) -> int:
        """Bytes of weights one decode step reads (all matrices, norms, one embedding row)."""
        embed, *rest = self.weight_tensors()
        return sum(t.numel() * t.element_size() for t in rest) + embed.shape[1] * embed.element_size()

    def device_bytes(self) -> int:
        """Bytes of every tensor this model holds on its device (weights and RoPE tables)."""
        tables = [*self.rope, *(self.local_rope if self.local_rope is not self.rope else ())]
        return sum(t.numel() * t.element_size() for t in self.weight_tensors() + tables)

    def new_cache(self, max_len: int | None = None, num_slots: int = 1) -> DeviceKVCache:
        max_len = min(max_len or self.config.context_length, self.max_positions)
        return DeviceKVCache(self.config, max_len, num_slots, self.kv_dtype, self.device)

    def graph_pool(self):
        """One CUDA graph memory pool for every program of this model."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    # -- forward -------------------------------------------------------------------------------
    forward = Transformer.forward  # builds one Segment per sequence and calls forward_batch

    @torch.inference_mode()
    def forward_batch(self, segments: list[Segment], cache: DeviceKVCache,
                      hidden_layers: tuple[int, ...] = ()) -> list[ForwardOutput]:
        """As Transformer.forward_batch; the sequences run one after another (one program each)."""
        if not isinstance(cache, DeviceKVCache):
            raise TypeError("a device model runs on its own cache: make it with model.new_cache()")
        if not segments:
            return []
        starts, positions = segment_layout(segments, cache, self.max_positions)
        outs = []
        for seg, start, pos in zip(segments, starts, positions):
            if seg.exact and not _is_chain(seg.tree_mask, start, pos):
                raise ValueError(f"slot {seg.slot}: the device runtime verifies chains only, and this forward "
                                 "is a tree (its rows would not be bitwise the single steps of their paths)")
        # the model's GPU as the current one: a program's side stream, its graph capture and its copies'
        # event belong to the current device, while torch launches a tensor's kernels on its own device's
        # stream: on cuda:1, a capture on cuda:0 would not hold the program's kernels
        with torch.cuda.device(self.device) if self.device.type == "cuda" else nullcontext():
            for seg, start, pos in zip(segments, starts, positions):
                tokens = torch.as_tensor(seg.tokens).reshape(-1)
                run = self._exact if seg.exact else self._prefill
                logits, hidden = run(seg, cache, start, tokens, pos, tuple(hidden_layers))
                cache.lengths[seg.slot] = start + len(tokens)
                outs.append(ForwardOutput(logits[None], {layer: h[None] for layer, h in hidden.items()}))
        return outs

    def _exact(self, seg: Segment, cache: DeviceKVCache, start: int, tokens: torch.Tensor, positions: torch.Tensor,
               hidden_layers: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The segment's rows through the slot's program, `rows` at a time -> logits (T or 1, V) and
        hidden {layer: (T, H)}, float32 on the host."""
        key = (seg.slot, hidden_layers)
        if key not in cache.programs:
            cache.programs[key] = Program(self, cache, seg.slot, hidden_layers)
        program, R, T = cache.programs[key], self.rows, len(tokens)
        embed, _, _, lm_head = self.weights
        logits = torch.empty(1 if seg.last_only else T, lm_head.shape[0])
        hidden = {layer: torch.empty(T, embed.shape[1]) for layer in hidden_layers}
        for lo in range(0, T, R):
            n = min(R, T - lo)
            out, out_hidden = program(tokens[lo : lo + n], start + lo)  # the next call overwrites them: copy now
            fetch = [(hidden[layer][lo : lo + n], out_hidden[layer][:n]) for layer in hidden_layers]
            if not seg.last_only:
                fetch.append((logits[lo : lo + n], out[:n]))
            elif lo + n == T:
                fetch.append((logits, out[n - 1 : n]))
            self._fetch(fetch)
        return logits, hidden

    def _fetch(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Copy each (host destination, device float32 source). From CUDA through one pinned buffer and one
        wait: a copy into pageable memory stages through the driver's own buffer (16 rows of Llama-3's
        logits, 8 MB: 3 ms a verify). The buffer is this model's: programs run
        one after another, and each call waits for its copies before the next begins."""
        if self.device.type != "cuda":
            for dst, src in pairs:
                dst.copy_(src)
            return
        need = sum(src.numel() for _, src in pairs)
        if self._pinned is None or self._pinned.numel() < need:
            self._pinned = torch.empty(need, dtype=torch.float32, pin_memory=True)
        views, at = [], 0
        for _, src in pairs:
            views.append(self._pinned[at : at + src.numel()].view(src.shape))
            views[-1].copy_(src, non_blocking=True)
            at += src.numel()
        torch.cuda.current_stream(self.device).synchronize()
        for (dst, _), view in zip(pairs, views):
            dst.copy_(view)

    def _exact_program(self, p: Program, cache: DeviceKVCache, slot: int,
                       hidden_layers: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """The ops of one program over its fixed buffers (what a CUDA graph captures)."""
        biases = {w: torch.zeros(p.writes.shape[0], cache.width, dtype=torch.float32, device=self.device).masked_fill_(
                      ~chain_masks(p.writes, cache.width, w), float("-inf")) for w in self.windows}
        attend = partial(self._attend_fixed, cache, slot, p.writes)
        logits, hidden = self._layers(p.tokens, p.positions, hidden_layers, lambda li, w: partial(attend, li, biases[w]))
        return logits.float(), {layer: h.float() for layer, h in hidden.items()}  # as the host takes them

    def _prefill(self, seg: Segment, cache: DeviceKVCache, start: int, tokens: torch.Tensor, positions: torch.Tensor,
                 hidden_layers: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """exact=False: the T rows unpadded, fused attention over the slot's first start + T keys."""
        T = len(tokens)
        masks = {w: row_masks(seg.tree_mask, start, positions, w, range(T), T, start + T).to(self.device)
                 for w in self.windows}
        attend = partial(self._attend_prefill, cache, seg.slot, start)
        logits, hidden = self._layers(tokens.to(self.device), positions.to(self.device), hidden_layers,
                                      lambda li, w: partial(attend, li, masks[w]), seg.last_only)
        return _to_host(logits), {layer: _to_host(h) for layer, h in hidden.items()}

    def _layers(self, tokens: torch.Tensor, positions: torch.Tensor, hidden_layers: tuple[int, ...], attend_for,
                last_only: bool = False) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """tokens, positions (N,) on the device -> logits (N or 1, V), hidden {layer: (N, H)} in the model's
        dtype; attend_for(layer index, window) gives the layer's Attend."""
        c = self.config
        embed, layers, norm, lm_head = self.weights
        x = embed[tokens]  # (N, H)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        rope = [t[positions][:, None] for t in self.rope]  # cos, sin: (N, 1, hd)
        local = rope if self.local_rope is self.rope else [t[positions][:, None] for t in self.local_rope]
        hidden = {0: x} if 0 in hidden_layers else {}
        for li, layer in enumerate(layers):
            window = c.window(li)
            x = decoder_layer(x, _DenseWeights(layer, c), attend_for(li, window), *(local if window else rope))
            if li + 1 in hidden_layers:
                hidden[li + 1] = x
        h = rms_norm(x[-1:] if last_only else x, norm, c.rms_norm_eps)
        return softcap(F.linear(h, lm_head), c.final_logit_softcap), hidden

    def _attend_fixed(self, cache: DeviceKVCache, slot: int, writes: torch.Tensor, li: int, bias: torch.Tensor,
                      q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (R, nh, hd), k, v (R, nkv, hd) -> (R, nh, hd): K/V written at `writes` (R,), then every row over
        all `width` positions of the slot, bias (R, width) 0 or -inf added to its scores."""
        R, nh, hd = q.shape
        keys, values = cache.k[li, slot], cache.v[li, slot]  # (nkv, width, hd)
        nkv = keys.shape[0]
        group = nh // nkv
        keys.index_copy_(1, writes, k.transpose(0, 1).to(keys.dtype))
        values.index_copy_(1, writes, v.transpose(0, 1).to(values.dtype))
        qg = q.reshape(R, nkv, group, hd).permute(1, 0, 2, 3).reshape(nkv, R * group, hd)
        scores = torch.matmul(qg, keys.transpose(1, 2)).float() * self.attn_scale  # (nkv, R * group, width)
        scores = scores.view(nkv, R, group, -1) + bias[None, :, None, :]
        p = torch.softmax(scores, dim=-1).to(values.dtype).view(nkv, R * group, -1)
        out = torch.matmul(p, values)  # (nkv, R * group, hd)
        return out.view(nkv, R, group, hd).permute(1, 0, 2, 3).reshape(R, nh, hd)

    def _attend_prefill(self, cache: DeviceKVCache, slot: int, start: int, li: int, mask: torch.Tensor,
                        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (T, nh, hd), k, v (T, nkv, hd) -> (T, nh, hd): K/V written at start.., then fused attention over
        the first start + T keys under mask (T, start + T)."""
        T, nh, _ = q.shape
        end = start + T
        cache.k[li, slot, :, start:end] = k.transpose(0, 1)
        cache.v[li, slot, :, start:end] = v.transpose(0, 1)
        group = nh // cache.k.shape[2]
        keys = cache.k[li, slot, :, :end].repeat_interleave(group, dim=0)  # (nh, end, hd)
        values = cache.v[li, slot, :, :end].repeat_interleave(group, dim=0)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=mask, scale=self.attn_scale)
        return out.transpose(0, 1)


def _is_chain(tree_mask: torch.Tensor | None, start: int, positions: torch.Tensor) -> bool:
    """Whether a segment's rows are a chain: causal mask (or none) and positions start, start + 1, ..."""
    if tree_mask is None:
        return bool(torch.equal(positions, start + torch.arange(len(positions))))
    causal = torch.ones(len(positions), len(positions), dtype=torch.bool).tril()
    return bool(torch.equal(tree_mask.to(torch.bool), causal)) and _is_chain(None, start, positions)


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A float32 copy on the host (a copy even where t is one already)."""
    return t.to(device="cpu", dtype=torch.float32, copy=True)
