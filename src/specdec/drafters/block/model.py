"""The block drafter's network: a few decoder layers that propose a whole block in one forward.

    context  c_j = hidden_norm(fc([h_l1(x_j); ...; h_lk(x_j)]))   target hidden rows of each committed x_j
    block    [x_m, MASK, ..., MASK]: B rows at positions m .. m+B-1, embedded with the TARGET's embedding
    layers   Qwen3 decoder layers (q_norm / k_norm). Attention keys and values: every context row
             (k_norm(k_proj(c_j)), v_proj(c_j) at position j; no input norm, the same c_j in every layer),
             then the whole block, with no causal mask: each block row sees the context and the block
    logits   the TARGET's lm_head(norm(x)) (no embedding or output head of the drafter's own)

Layer ids: target_layer_ids count decoder layers from 0 ("the output of layer i"); both published
implementations read transformers' hidden_states[i + 1] (DSpark allows -1: the embeddings). specdec's
hidden_layers use transformers' indices, so hidden_layers = ids + 1. transformers' entry N (the last
layer) is the final-NORMED state while the engine hands over the pre-norm one, so the target's final
norm is applied here for index N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from specdec.drafters.block.config import BlockConfig
from specdec.model.layers import (DecoderLayer, MaskedAttention, RMSNorm, apply_rope, rms_norm, rope_rows, rope_tables,
                                  softcap)


@dataclass(frozen=True)
class TargetParts:
    """What the drafter borrows from its target.

    embed: (V, H) embedding; lm_head(x (N, H) float32) -> (N, V) logits (a QLinear at inference, any
    differentiable function while training); norm: (H,) final norm weight (for hidden index N); eps.
    """

    embed: torch.Tensor
    lm_head: Callable[[torch.Tensor], torch.Tensor]
    norm: torch.Tensor
    eps: float
    num_layers: int

    @staticmethod
    def of(model) -> "TargetParts":
        tr = model.transformer
        return TargetParts(tr.embed, tr.lm_head, tr.norm, model.config.rms_norm_eps, model.config.num_layers)


class MarkovHead(nn.Module):
    """DSpark's bias on the logits of block row i from the previous token (anchor, then the drafted ones).

    vanilla: markov_w2(markov_w1[prev]); gated: markov_w2(sigmoid(gate_proj([h; w1[prev]])) * w1[prev]);
    rnn: a GRU-like state over the block: joint_proj([s; w1[prev]; h]) -> gate, candidate, output.
    """

    def __init__(self, kind: str, vocab: int, rank: int, hidden: int):
        super().__init__()
        self.kind, self.rank = kind, rank
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, vocab, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def step(self, prev: torch.Tensor, h: torch.Tensor, state: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """prev (n,) ids, h (n, H) block rows -> (bias (n, V), the rnn state (n, r) or None)."""
        e = self.markov_w1(prev)  # (n, r)
        if self.kind == "vanilla":
            return self.markov_w2(e), state
        if self.kind == "gated":
            return self.markov_w2(torch.sigmoid(self.gate_proj(torch.cat([h, e], -1))) * e), state
        state = torch.zeros_like(e) if state is None else state
        gate, candidate, output = self.joint_proj(torch.cat([state, e, h], -1)).chunk(3, dim=-1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1 - gate) * torch.tanh(candidate)
        return self.markov_w2(torch.tanh(output)), state


class ConfidenceHead(nn.Module):
    """DSpark's acceptance predictor: a logit per block row (sigmoid = P(the row's draft is accepted))."""

    def __init__(self, width: int):
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)


class BlockDraftModel(nn.Module):
    """The drafter's own weights (state dict = the published tensor names) over borrowed target parts."""

    def __init__(self, cfg: BlockConfig, target: TargetParts, max_positions: int = 4096):
        super().__init__()
        self.cfg = cfg
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layers = nn.ModuleList(DecoderLayer(H, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                                 cfg.intermediate_size, eps, qk_norm=True)
                                    for _ in range(cfg.num_layers))
        self.norm = RMSNorm(H, eps)
        self.fc = nn.Linear(len(cfg.target_layer_ids) * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, eps)
        if cfg.markov_rank:
            self.markov_head = MarkovHead(cfg.markov_head_type, cfg.vocab_size, cfg.markov_rank, H)
        if cfg.confidence_head:
            self.confidence_head = ConfidenceHead(H + (cfg.markov_rank if cfg.confidence_with_markov else 0))
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, max_positions, cfg.rope_factors())
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self._target = (target,)  # a tuple: not a submodule, not in the state dict

    @property
    def target(self) -> TargetParts:
        return self._target[0]

    def context(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """Target hidden rows {hidden index: (..., n, H)} -> context rows (..., n, H)."""
        t = self.target
        rows = [rms_norm(hidden[i].float(), t.norm.float(), t.eps) if i == t.num_layers else hidden[i].float()
                for i in self.cfg.hidden_layers]
        return self.hidden_norm(self.fc(torch.cat(rows, dim=-1)))

    def context_kv(self, layer: DecoderLayer, ctx: torch.Tensor, positions: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """Context rows (B, n, H) at positions (B, n) -> one layer's keys, values (B, nkv, n, hd)."""
        B, n, _ = ctx.shape
        nkv, hd = layer.kv_heads, layer.head_dim
        k = rms_norm(layer.self_attn.k_proj(ctx).reshape(B * n, nkv, hd), layer.k_norm, layer.eps)
        cos, sin = rope_rows(self.rope_cos, self.rope_sin, positions)
        k = apply_rope(k, cos, sin)
        v = layer.self_attn.v_proj(ctx).reshape(B * n, nkv, hd)
        return k.view(B, n, nkv, hd).transpose(1, 2), v.view(B, n, nkv, hd).transpose(1, 2)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, H) float32 block rows."""
        return self.target.embed[tokens].float() * self.cfg.input_embedding_scale

    def blocks(self, x: torch.Tensor, positions: torch.Tensor, past: Sequence[tuple[torch.Tensor, torch.Tensor]],
               mask: torch.Tensor) -> torch.Tensor:
        """Block rows x (B, T, H) at positions (B, T) through every layer -> normed (B, T, H).

        past: per layer (keys, values) (B, nkv, P, hd) of the context rows; mask (B or 1, T, P + T), True = may
        attend (inference: all True; training: context strictly before the anchor, the own block)."""
        B, T, H = x.shape
        cos, sin = rope_rows(self.rope_cos, self.rope_sin, positions)
        h = x.reshape(B * T, H)
        for layer, (pk, pv) in zip(self.layers, past):
            h = layer(h, MaskedAttention(B, pk, pv, mask), cos, sin)
        return self.norm(h).view(B, T, H)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Block outputs (N, H) -> target-vocabulary logits (N, V) float32, before any Markov bias."""
        return softcap(self.target.lm_head(h.float()) * self.cfg.output_multiplier, self.cfg.final_logit_softcapping)

    def confidence(self, h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """(n, H) rows and (n,) previous tokens -> (n,) acceptance logits."""
        features = h
        if self.cfg.confidence_with_markov:
            features = torch.cat([h, self.markov_head.markov_w1(prev).to(h.dtype)], dim=-1)
        return self.confidence_head(features)
