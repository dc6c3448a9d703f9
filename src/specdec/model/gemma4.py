"""The Gemma 4 text decoder (dense), run for speculation: model/transformer.py's forward (several sequences'
new tokens with explicit positions, tree masks, every exact row computed as a one-token step computes it) over
layers whose geometry differs by kind (model/gemma4_layout.py says what each field means):

    x = embed(token) * sqrt(H);   ple = per-layer inputs (N, L, P) when the model has them
    for each layer i (kind: sliding or global, each with its own head width, kv heads and RoPE table):
        q = rope(q_norm(q_proj(h)));  k = rope(k_norm(k_proj(h)));  v = v_norm(v_proj(h) or k_proj(h))
                                      (h = rms_norm(x, input_layernorm); a KV-sharing layer takes the k, v rows
                                       of its source layer instead of its own)
        x = x + post_attention_layernorm(o(attend(q, k, v)))                  attention scale 1
        x = x + post_feedforward_layernorm(down(gelu(gate(h')) * up(h')))     h' = pre_feedforward_layernorm(x)
        x = x + post_per_layer_input_norm(proj(gelu(ple_gate(x)) * ple_i))    with per-layer inputs
        x = x * layer_scalar
    logits = softcap(lm_head(rms_norm(x)))

The KV cache (Gemma4Cache) holds the layers that own keys and values, in two geometries (sliding, global);
a KV-sharing layer attends over its source's slot rows, and its new rows are its source's rows of this
forward. Every op is row-wise or model/cache_attention.py's attention, so the runtime's exactness holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from specdec.cache.kv import KVCache
from specdec.model import kernels
from specdec.model.cache_attention import CacheAttention
from specdec.model.config import ModelConfig
from specdec.model.layers import RopeTable, apply_rope, mlp_act, rms_norm
from specdec.model.linear import QLinear
from specdec.model.segments import ForwardOutput, Segment, segment_layout
from specdec.model.transformer import Transformer, _linear_by_spans


@dataclass
class Gemma4Layer:
    qkv: QLinear  # q | k | v (q | k with k_eq_v on a global layer; q alone on a KV-sharing layer), rows (out, H)
    o: QLinear
    gate_up: QLinear
    down: QLinear
    attn_norm: torch.Tensor  # (H,) input_layernorm
    attn_out_norm: torch.Tensor  # (H,) post_attention_layernorm
    mlp_norm: torch.Tensor  # (H,) pre_feedforward_layernorm
    mlp_out_norm: torch.Tensor  # (H,) post_feedforward_layernorm
    q_norm: torch.Tensor  # (hd,)
    k_norm: torch.Tensor | None  # (hd,); None on a KV-sharing layer
    scalar: torch.Tensor  # (1,) layer_scalar
    ple_gate: QLinear | None = None  # (P, H) per_layer_input_gate
    ple_proj: QLinear | None = None  # (H, P) per_layer_projection
    ple_norm: torch.Tensor | None = None  # (H,) post_per_layer_input_norm


@dataclass
class PerLayerInputs:
    embed: torch.Tensor  # (V_ple, L * P) embed_tokens_per_layer
    proj: QLinear  # (L * P, H) per_layer_model_projection
    norm: torch.Tensor  # (P,) per_layer_projection_norm


class Gemma4Cache(KVCache):
    """The keys and values of the layers that own them: the sliding ones in KVCache's k, v (the config's
    num_kv_heads x head_dim), the global ones in global_k, global_v (global_kv_heads x global_head_dim)."""

    def __init__(self, sliding: int, global_: int, c: ModelConfig, max_len: int, num_slots: int,
                 dtype: torch.dtype):
        super().__init__(sliding, c.num_kv_heads, c.head_dim, max_len, num_slots, dtype=dtype)
        g = c.gemma4
        shape = (global_, num_slots, g.global_kv_heads, max_len, g.global_head_dim)
        self.global_k, self.global_v = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)

    def part(self, is_global: bool):
        """The k, v pair attention reads (model/cache_attention.py uses .k and .v)."""
        return SimpleNamespace(k=self.global_k, v=self.global_v) if is_global else self

    def nbytes(self) -> int:
        return super().nbytes() + 2 * self.global_k.numel() * self.global_k.element_size()

    def copy_prefix(self, source: int, slot: int, length: int) -> None:
        super().copy_prefix(source, slot, length)
        self.global_k[:, slot, :, :length] = self.global_k[:, source, :, :length]
        self.global_v[:, slot, :, :length] = self.global_v[:, source, :, :length]

    def keep(self, slot: int, start: int, offsets: list[int]) -> None:
        if offsets != list(range(len(offsets))):
            src = torch.tensor([start + o for o in offsets])
            n = len(offsets)
            self.global_k[:, slot, :, start : start + n] = self.global_k[:, slot, :, src]
            self.global_v[:, slot, :, start : start + n] = self.global_v[:, slot, :, src]
        super().keep(slot, start, offsets)


class _KindAttention(CacheAttention):
    """CacheAttention for one kind of layer's geometry (heads, kv heads, head width; scale 1)."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int):
        self.config = SimpleNamespace(num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)
        self.attn_scale = 1.0
        self._attend_kernel = (head_dim % 8 == 0 and head_dim <= kernels.ATTEND_MAX_HEAD_DIM
                               and heads // kv_heads <= kernels.ATTEND_MAX_GROUP and kernels.attend() is not None)


class Gemma4Transformer(Transformer):
    step_kernel = False  # step.c runs Transformer's layers, not these

    def __init__(self, config: ModelConfig, embed: torch.Tensor, layers: list[Gemma4Layer], norm: torch.Tensor,
                 lm_head: QLinear, weights_format: str, ple: PerLayerInputs | None = None):
        super().__init__(config, embed, layers, norm, lm_head, weights_format)
        g = config.gemma4
        self.ple = ple
        self.is_global = [li not in config.sliding_layers for li in range(config.num_layers)]
        owners = [li for li in range(config.num_layers) if g.owns_kv(li)]
        # a KV-owning layer -> its place among the owners of its kind in the cache
        self.cache_index = {li: sum(self.is_global[j] == self.is_global[li] for j in owners if j < li) for li in owners}
        self.kinds = {False: _KindAttention(config.num_heads, config.num_kv_heads, config.head_dim),
                      True: _KindAttention(config.num_heads, g.global_kv_heads, g.global_head_dim)}
        self.rope = RopeTable(g.global_head_dim, config.rope_theta, self.max_positions, g.global_rope_factors())
        self.local_rope = RopeTable(config.head_dim, config.rope_local_theta, self.max_positions)

    def geometry(self, li: int) -> tuple[int, int]:
        """Layer li's (kv heads, head width)."""
        c = self.config
        return (c.gemma4.global_kv_heads, c.gemma4.global_head_dim) if self.is_global[li] else (c.num_kv_heads,
                                                                                             c.head_dim)

    def weight_bytes_per_token(self) -> int:
        total = self.lm_head.nbytes() + _row_bytes(self.embed)
        if self.ple is not None:
            total += self.ple.proj.nbytes() + _row_bytes(self.ple.embed)
        for layer in self.layers:
            total += sum(m.nbytes() for m in (layer.qkv, layer.o, layer.gate_up, layer.down, layer.ple_gate,
                                              layer.ple_proj) if m is not None)
        return total

    def new_cache(self, max_len: int | None = None, num_slots: int = 1) -> Gemma4Cache:
        c = self.config
        max_len = min(max_len or c.context_length, self.max_positions)
        owners = list(self.cache_index)
        n_global = sum(self.is_global[li] for li in owners)
        return Gemma4Cache(len(owners) - n_global, n_global, c, max_len, num_slots, self.kv_dtype)

    def per_layer_inputs(self, x: torch.Tensor, tokens: torch.Tensor, spans) -> torch.Tensor | None:
        """The per-layer inputs (N, L, P) of rows whose scaled embeddings are x (N, H), or None."""
        c, p = self.config, self.ple
        if p is None:
            return None
        P, L = c.gemma4.ple_size, c.num_layers
        token_part = p.embed[tokens].float() * torch.tensor(P ** 0.5, dtype=torch.float32)
        proj = _linear_by_spans(p.proj, x, spans) * c.hidden_size ** -0.5  # (N, L * P)
        proj = rms_norm(proj.reshape(-1, L, P), p.norm, c.rms_norm_eps)
        return (proj + token_part.reshape(-1, L, P)) * 2.0 ** -0.5

    @torch.inference_mode()
    def forward_batch(self, segments: list[Segment], cache: Gemma4Cache,
                      hidden_layers: tuple[int, ...] = ()) -> list[ForwardOutput]:
        """As Transformer.forward_batch, over Gemma 4's layers (module docstring)."""
        c, g = self.config, self.config.gemma4
        if not segments:
            return []
        if not isinstance(cache, Gemma4Cache):
            raise TypeError("a Gemma 4 model runs on its own cache: make it with model.new_cache()")
        starts, positions = segment_layout(segments, cache, self.max_positions)
        spans, row = [], 0
        for seg in segments:
            spans.append((slice(row, row + len(seg.tokens)), seg.exact))
            row += len(seg.tokens)
        positions = torch.cat(positions)
        ropes = {True: self.rope.rows(positions), False: self.local_rope.rows(positions)}  # cos, sin (N, 1, hd)
        tokens = torch.cat([torch.as_tensor(seg.tokens).reshape(-1) for seg in segments])
        x = self.embed_rows(tokens)  # (N, H)
        ple = self.per_layer_inputs(x, tokens, spans)
        hidden = {0: x} if 0 in hidden_layers else {}
        key_lists: dict[int, tuple] = {}  # window -> attend.c's key lists, shared by the layers
        kv_rows: dict[int, tuple] = {}  # a KV-owning layer -> its new k, v rows of this forward
        eps, N, nh = c.rms_norm_eps, x.shape[0], c.num_heads
        for li, layer in enumerate(self.layers):
            kind = self.is_global[li]
            nkv, hd = self.geometry(li)
            h = rms_norm(x, layer.attn_norm, eps)
            qkv = _linear_by_spans(layer.qkv, h, spans)
            q = rms_norm(qkv[:, : nh * hd].reshape(N, nh, hd), layer.q_norm, eps)
            cos, sin = ropes[kind]
            source = g.kv_source[li]
            if source == li:
                k = qkv[:, nh * hd : (nh + nkv) * hd].reshape(N, nkv, hd)
                v = k if qkv.shape[1] == (nh + nkv) * hd else qkv[:, (nh + nkv) * hd :].reshape(N, nkv, hd)
                # v_norm: an RMS norm without weight (ones: the same values, through the same row kernel)
                v = rms_norm(v, torch.ones(hd), eps)
                qk = apply_rope(torch.cat([q, rms_norm(k, layer.k_norm, eps)], dim=1), cos, sin)
                q, k = qk[:, :nh], qk[:, nh:]
                kv_rows[li] = k, v
            else:
                q = apply_rope(q, cos, sin)
                k, v = kv_rows[source]  # rewritten into the source's slot rows: the same values
            window = c.window(li)
            attn = self.kinds[kind]._attend_segments(cache.part(kind), self.cache_index[source], window, segments,
                                                     starts, spans, positions, key_lists, q, k, v)
            x = x + rms_norm(_linear_by_spans(layer.o, attn.reshape(N, nh * hd), spans), layer.attn_out_norm, eps)
            h = rms_norm(x, layer.mlp_norm, eps)
            gate, up = _linear_by_spans(layer.gate_up, h, spans).chunk(2, dim=-1)
            out = _linear_by_spans(layer.down, mlp_act(gate, up, c.mlp_act, layer.mlp_norm), spans)
            x = x + rms_norm(out, layer.mlp_out_norm, eps)
            if ple is not None:
                gate = _linear_by_spans(layer.ple_gate, x, spans)
                mixed = mlp_act(gate, ple[:, li].contiguous(), c.mlp_act, layer.ple_norm)
                x = x + rms_norm(_linear_by_spans(layer.ple_proj, mixed, spans), layer.ple_norm, eps)
            x = x * layer.scalar
            if li + 1 in hidden_layers:
                hidden[li + 1] = x
        for seg, start, (rows, _) in zip(segments, starts, spans):
            cache.lengths[seg.slot] = start + rows.stop - rows.start
        return self._outputs(x, segments, spans, hidden)

    def kv_of(self, cache: Gemma4Cache, layer: int, slot: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values (nkv, length, hd) float32 layer `layer` attends over in `slot` (its source's rows):
        what the assistant drafter (drafters/gemma4_assistant.py) reads."""
        source = self.config.gemma4.kv_source[layer]
        part, i = cache.part(self.is_global[source]), self.cache_index[source]
        return part.k[i, slot, :, :length].float(), part.v[i, slot, :, :length].float()


def _row_bytes(table) -> int:
    """Bytes of one row of a table: a tensor's, or a GGUF file's blocks (BlockRows)."""
    return table.row_bytes() if hasattr(table, "row_bytes") else table.shape[1] * table.element_size()
