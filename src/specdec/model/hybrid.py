"""The hybrid decoder (Qwen3.5 / Qwen3.6, dense or MoE): Gated DeltaNet layers (model/deltanet.py) between gated
full-attention layers (model/gated_attention.py), each followed by the SwiGLU MLP or (Qwen3.5-MoE) a mixture of
experts (model/moe.py, its rows routed as a single step would route them), run for speculation.

    x = embed(tokens)
    for each layer:  x = x + mixer(rms_norm(x))    mixer: Gated DeltaNet, or gated attention over the KV cache
                     x = x + mlp(rms_norm(x))
    logits = lm_head(rms_norm(x))

The forward is Transformer's (model/transformer.py): several sequences' new tokens with explicit positions,
logits and the hidden states drafters ask for, every exact row computed as a one-token step would compute it.
The full-attention layers attend over cache/recurrent.py's KV part exactly as Transformer's layers do; the
linear layers read and write its ring of recurrent states, one row at a time, so a verify of k drafted tokens
is bitwise k single steps, state included, and rolling back a rejected draft moves a length pointer.
Chains only: a tree's siblings would need a state each (HybridCache.keep refuses them). CPU only.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from specdec.cache.recurrent import HybridCache
from specdec.model.config import ModelConfig
from specdec.model.deltanet import DeltaNetWeights, deltanet_mix
from specdec.model.gated_attention import gated_attention, mlp_block
from specdec.model.layers import RopeTable, rms_norm
from specdec.model.linear import QLinear
from specdec.model.moe import MoE
from specdec.model.segments import ForwardOutput, Segment, segment_layout
from specdec.model.transformer import Transformer, _linear_by_spans


@dataclass
class HybridLayer:
    """One layer's weights as the runtime holds them: a Gated DeltaNet mixer or a gated attention one."""

    attn_norm: torch.Tensor  # (H,) input_layernorm, as a multiplier
    mlp_norm: torch.Tensor  # (H,) post_attention_layernorm
    gate_up: QLinear | None  # (2 * I, H); None where moe is the MLP
    down: QLinear | None  # (H, I)
    qkv: QLinear | None = None  # gated attention: (2 * nh * hd + 2 * nkv * hd, H), q|gate per head, k, v
    o: QLinear | None = None  # (H, nh * hd)
    q_norm: torch.Tensor | None = None  # (hd,)
    k_norm: torch.Tensor | None = None
    deltanet: DeltaNetWeights | None = None  # a linear-attention layer's mixer
    moe: MoE | None = None  # Qwen3.5-MoE: the layer's MLP, in place of gate_up and down


class _SpanWeights:
    """A HybridLayer as gated_attention / mlp_block use it for one forward's rows (transformer._QuantWeights's
    counterpart): each matmul over the rows of every sequence as that sequence alone would compute it."""

    def __init__(self, layer: HybridLayer, config: ModelConfig, spans: list[tuple[slice, bool]]):
        self.layer, self.spans = layer, spans
        self.heads, self.kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        self.eps, self.act = config.rms_norm_eps, config.mlp_act
        self.attn_norm, self.mlp_norm, self.q_norm, self.k_norm = layer.attn_norm, layer.mlp_norm, layer.q_norm, \
            layer.k_norm
        self.moe = None if layer.moe is None else partial(layer.moe, spans=spans)

    def qkv(self, h):
        return _linear_by_spans(self.layer.qkv, h, self.spans)

    def o(self, attn):
        return _linear_by_spans(self.layer.o, attn, self.spans)

    def gate_up(self, h):
        return _linear_by_spans(self.layer.gate_up, h, self.spans).chunk(2, dim=-1)

    def down(self, a):
        return _linear_by_spans(self.layer.down, a, self.spans)


class HybridTransformer(Transformer):
    exact_trees = False  # one recurrent state per sequence: chains only
    step_kernel = False  # step.c runs Transformer's layers, not these
    chains_only = "a hybrid model (Gated DeltaNet layers) keeps one recurrent state per sequence"

    def __init__(self, config: ModelConfig, embed: torch.Tensor, layers: list[HybridLayer], norm: torch.Tensor,
                 lm_head: QLinear, weights_format: str):
        super().__init__(config, embed, layers, norm, lm_head, weights_format)
        la = config.linear_attention
        self.linear_index = {li: i for i, li in enumerate(la.layers)}  # model layer -> its ring in the cache
        self.full_index = {li: i for i, li in enumerate(li for li in range(config.num_layers)
                                                        if li not in self.linear_index)}
        # RoPE rotates the first rope dims of each head only: rows of that width
        self.rope = RopeTable(config.rotary_dims, config.rope_theta, self.max_positions, config.rope_freq_factors)

    def weight_bytes_per_token(self) -> int:
        row = self.embed.row_bytes() if hasattr(self.embed, "row_bytes") else self.embed.shape[1] * self.embed.element_size()
        total = self.lm_head.nbytes() + row
        for layer in self.layers:
            mats = [layer.gate_up, layer.down] if layer.moe is None else []
            mats += [layer.deltanet.in_proj, layer.deltanet.out_proj] if layer.deltanet else [layer.qkv, layer.o]
            total += sum(m.nbytes() for m in mats) + (layer.moe.active_bytes() if layer.moe is not None else 0)
        return total

    def new_cache(self, max_len: int | None = None, num_slots: int = 1) -> HybridCache:
        c, la = self.config, self.config.linear_attention
        max_len = min(max_len or c.context_length, self.max_positions)
        return HybridCache(len(self.full_index), c.num_kv_heads, c.head_dim, max_len, num_slots, dtype=self.kv_dtype,
                           linear_layers=len(self.linear_index), conv_shape=(la.conv_kernel - 1, la.conv_dim),
                           state_shape=(la.value_heads, la.key_dim, la.value_dim))

    @torch.inference_mode()
    def forward_batch(self, segments: list[Segment], cache: HybridCache,
                      hidden_layers: tuple[int, ...] = ()) -> list[ForwardOutput]:
        """As Transformer.forward_batch: one forward over several sequences' new tokens (chains; a tree mask is
        refused), each sequence's outputs bitwise what it alone would give."""
        c = self.config
        if not segments:
            return []
        if not isinstance(cache, HybridCache):
            raise TypeError("a hybrid model runs on its own cache: make it with model.new_cache()")
        if any(seg.tree_mask is not None for seg in segments):
            raise ValueError(f"{self.chains_only}: it verifies chains of drafts, not trees")
        starts, positions = segment_layout(segments, cache, self.max_positions)
        spans, row, state_rows = [], 0, []
        for seg, start in zip(segments, starts):
            size = len(seg.tokens)
            spans.append((slice(row, row + size), seg.exact))
            row += size
        for seg, start, (rows, exact) in zip(segments, starts, spans):  # after the checks: claims ring places
            state_rows += cache.rows(seg.slot, start, rows.stop - rows.start, exact)
        positions = torch.cat(positions)
        cos, sin = self.rope.rows(positions)  # (N, 1, rope dims)
        tokens = torch.cat([torch.as_tensor(seg.tokens).reshape(-1) for seg in segments])
        x = self.embed_rows(tokens)  # (N, H)
        hidden = {0: x} if 0 in hidden_layers else {}
        key_lists: dict[int, tuple] = {}  # attend.c's key lists, shared by the full-attention layers
        for li, layer in enumerate(self.layers):
            w = _SpanWeights(layer, c, spans)
            h = rms_norm(x, layer.attn_norm, c.rms_norm_eps)
            if layer.deltanet is not None:
                d, i = layer.deltanet, self.linear_index[li]
                mixed = deltanet_mix(c.linear_attention, d, _linear_by_spans(d.in_proj, h, spans), c.rms_norm_eps,
                                     cache.conv[i], cache.ssm[i], state_rows)
                out = _linear_by_spans(d.out_proj, mixed, spans)
            else:
                attend = partial(self._attend_segments, cache, self.full_index[li], 0, segments, starts, spans,
                                 positions, key_lists)
                out = gated_attention(h, w, attend, cos, sin)
            x = mlp_block(x + out, w)
            if li + 1 in hidden_layers:
                hidden[li + 1] = x
        for seg, start, (rows, _) in zip(segments, starts, spans):
            cache.lengths[seg.slot] = start + rows.stop - rows.start

        return self._outputs(x, segments, spans, hidden)
