"""Drafters that read the target's hidden states (MTP, EAGLE-3): the shared machinery.

A head is a small torch module that, for a pair (feature f_j, token x_{j+1}) at
position j, returns the logits of x_{j+2} and a new feature (its own hidden state),
which the next draft step feeds back in. f_j is built from the target's hidden
states at position j (MTP: the last layer; EAGLE-3: three tapped layers fused).

    target:   x_0 x_1 ... x_{m-1}            (hidden rows known, from prefill / verify)
    context:  x_0 x_1 ... x_{m-1} x_m        (x_m was just emitted, not yet in the target)
    head:     pairs (f_j, x_{j+1}), j < m; the pair at j = m-1 is the root of the draft

The head keeps its own KV cache: entries 0..m-1 for committed pairs (slot = position),
then one entry per drafted node, dropped after each proposal. The engine feeds the
target's hidden rows through `on_target_hidden` after every commit.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specdec.drafters.base import Draft, DrafterBase
from specdec.model.transformer import rope_tables
from specdec.sampling import SamplingParams, process_logits, sample_token


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (B, nh, T, hd); cos/sin: (B, 1, T, hd), rotate-half layout as in transformers
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class DraftLayer(nn.Module):
    """One Llama/Qwen decoder layer whose attention reads `attn_in` features (H, or 2H for EAGLE-3).

    Parameter names follow transformers (self_attn.q_proj, mlp.gate_proj, ...), so state
    dicts map one to one onto checkpoint tensors. The caller applies the pre-attention
    norm(s): forward takes the normed attention input and the residual stream.
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, intermediate: int, eps: float,
                 attn_in: int | None = None, qkv_bias: bool = False, qk_norm: bool = False):
        super().__init__()
        attn_in = attn_in or hidden
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(attn_in, heads * head_dim, bias=qkv_bias)
        self.self_attn.k_proj = nn.Linear(attn_in, kv_heads * head_dim, bias=qkv_bias)
        self.self_attn.v_proj = nn.Linear(attn_in, kv_heads * head_dim, bias=qkv_bias)
        self.self_attn.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        if qk_norm:
            self.self_attn.q_norm = RMSNorm(head_dim, eps)
            self.self_attn.k_norm = RMSNorm(head_dim, eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.mlp.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.mlp.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def forward(self, attn_in: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                past_k: torch.Tensor | None, past_v: torch.Tensor | None, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """attn_in: (B, T, A) normed; residual: (B, T, H); past_k/v: (B, nkv, P, hd) or None;
        mask: (B or 1, T, P + T) bool, True = may attend. Returns (out (B, T, H), k, v (B, nkv, T, hd))."""
        B, T, _ = attn_in.shape
        a = self.self_attn
        q = a.q_proj(attn_in).view(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, nh, T, hd)
        k = a.k_proj(attn_in).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # (B, nkv, T, hd)
        v = a.v_proj(attn_in).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(a, "q_norm"):
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        keys = k if past_k is None else torch.cat([past_k, k], dim=2)
        values = v if past_v is None else torch.cat([past_v, v], dim=2)
        group = self.heads // self.kv_heads
        if group > 1:
            keys_r, values_r = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        else:
            keys_r, values_r = keys, values
        out = F.scaled_dot_product_attention(q, keys_r, values_r, attn_mask=mask[:, None],
                                             scale=1.0 / math.sqrt(self.head_dim))  # (B, nh, T, hd)
        x = residual + a.o_proj(out.transpose(1, 2).reshape(B, T, -1))
        h = self.post_attention_layernorm(x)
        x = x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))
        return x, k, v


class HeadCache:
    """KV entries of one draft layer for one sequence: (nkv, max_len, hd), written by slot."""

    def __init__(self, kv_heads: int, head_dim: int, max_len: int, dtype=torch.float32):
        self.k = torch.zeros(kv_heads, max_len, head_dim, dtype=dtype)
        self.v = torch.zeros(kv_heads, max_len, head_dim, dtype=dtype)
        self.length = 0
        self.max_len = max_len


def rope_rows(cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor):
    """positions: (B, T) -> cos, sin (B, 1, T, hd)."""
    positions = positions.clamp(max=cos_table.shape[0] - 1)
    return cos_table[positions][:, None], sin_table[positions][:, None]


class HiddenHead(nn.Module):
    """What a hidden-state head provides; MTP and EAGLE-3 heads subclass it.

    hidden_layers: the target layers it reads (transformers' hidden_states indices).
    num_modules: how many distinct modules it has (the pair at draft depth d uses module d % n).
    """

    hidden_layers: tuple[int, ...] = ()
    num_modules: int = 1

    def init_rope(self, head_dim: int, theta: float, max_len: int) -> None:
        cos, sin = rope_tables(head_dim, theta, max_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def feature(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """Target hidden rows {layer: (..., n, H)} -> features (..., n, F) for module 0."""
        raise NotImplementedError

    def module_layer(self, module: int) -> DraftLayer:
        raise NotImplementedError

    def step(self, module: int, feats: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             past_k, past_v, mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """feats (B, T, F), tokens (B, T), positions (B, T) -> (logits (B, T, V_target), new feats (B, T, H), k, v)."""
        raise NotImplementedError


class HiddenStateDrafter(DrafterBase):
    """A Drafter around a HiddenHead: chain drafts (topk == 1) or EAGLE-2 style trees.

    target_vocab: ids the target knows (draft ids beyond it are never proposed).
    topk: children per expanded node (1 = a chain); budget: most tree nodes per draft.
    """

    def __init__(self, head: HiddenHead, name: str, target_vocab: int, topk: int = 1, budget: int = 16,
                 p_min: float = 0.0, max_len: int = 4096):
        self.name = name
        self.head = head.eval()
        self.hidden_layers = tuple(head.hidden_layers)
        self.target_vocab = target_vocab
        self.topk, self.budget, self.p_min = topk, budget, p_min
        self.max_len = max_len
        layer0 = head.module_layer(0)
        self.caches = [HeadCache(layer0.kv_heads, layer0.head_dim, max_len) for _ in range(head.num_modules)]
        self.sampling = SamplingParams()
        self.generator = torch.Generator()
        self.begin([])

    def set_sampling(self, sampling: SamplingParams, generator: torch.Generator) -> None:
        self.sampling, self.generator = sampling, generator

    # -- engine hooks --------------------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        self.fed: list[int] = []  # tokens whose target hidden rows arrived, x_0..x_{m-1}
        self.pending: list[torch.Tensor] = []  # features of fed positions not yet in the head cache
        for c in self.caches:
            c.length = 0

    @torch.inference_mode()
    def on_target_hidden(self, hidden: dict[int, torch.Tensor], tokens: Sequence[int]) -> None:
        """hidden: {layer: (n, H)} rows of the n tokens just committed to the target's cache."""
        self.pending.append(self.head.feature({k: v.float() for k, v in hidden.items()}))
        self.fed.extend(int(t) for t in tokens)

    # -- drafting --------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, context: Sequence[int], max_tokens: int) -> Draft:
        m = len(self.fed)
        if max_tokens <= 0 or m == 0 or len(context) != m + 1 or m + 1 + max(self.budget, max_tokens) >= self.max_len:
            return Draft(source=self.name)
        logits, feat = self._catch_up(context)  # (V,), (H,) for the root pair at position m-1
        if self.topk <= 1:
            draft = self._chain(logits, feat, m, max_tokens)
        else:
            from specdec.drafters.tree import grow_tree

            draft = grow_tree(logits, feat, self._placer(m), max_depth=max_tokens, topk=self.topk,
                              budget=self.budget, sampling=self.sampling, generator=self.generator,
                              process=self._probs, source=self.name)
        for c in self.caches:
            c.length = min(c.length, m) if c is self.caches[0] else 0
        return draft

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed draft distribution (..., V) with the request's sampling settings."""
        return process_logits(logits, self.sampling)

    def _catch_up(self, context: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run module 0 over committed pairs not yet cached; return the root's logits and feature."""
        cache = self.caches[0]
        feats = torch.cat(self.pending, dim=0) if self.pending else None
        self.pending = []
        start, m = cache.length, len(self.fed)
        assert feats is not None and feats.shape[0] == m - start, "hidden rows and committed tokens out of step"
        tokens = torch.tensor([list(context[start + 1 : m + 1])])  # (1, T): x_{j+1}
        positions = torch.arange(start, m)[None]
        mask = torch.ones(1, m - start, m, dtype=torch.bool).tril(diagonal=start)  # causal over cache + new
        logits, out = self._run(0, feats[None], tokens, positions, torch.arange(start, m), mask)
        return logits[0, -1], out[0, -1]

    def _run(self, module: int, feats, tokens, positions, slots: torch.Tensor, mask):
        """Run `module` on new rows and write their K/V at `slots`; mask (1, T, slots_end) over the cache."""
        cache = self.caches[module]
        end = mask.shape[-1] - feats.shape[1]
        past_k = cache.k[None, :, :end]
        past_v = cache.v[None, :, :end]
        # new rows attend cache[:end] then themselves; `mask` covers both
        logits, out, k, v = self.head.step(module, feats, tokens, positions, past_k, past_v, mask)
        cache.k[:, slots] = k[0].to(cache.k.dtype)
        cache.v[:, slots] = v[0].to(cache.v.dtype)
        cache.length = max(cache.length, int(slots.max()) + 1)
        return logits[..., : self.target_vocab], out

    def _chain(self, logits: torch.Tensor, feat: torch.Tensor, m: int, max_tokens: int) -> Draft:
        tokens, probs = [], []
        place = self._placer(m)
        node_slots: list[tuple[int, int]] = []
        for i in range(max_tokens):
            if self.sampling.greedy:
                if self.p_min > 0 and float(torch.softmax(logits, -1).max()) < self.p_min:
                    break
                token = int(logits.argmax())
            else:
                row = self._probs(logits)
                if self.p_min > 0 and float(row.max()) < self.p_min:
                    break
                token = sample_token(row, self.generator)
                probs.append(row)
            tokens.append(token)
            if i + 1 == max_tokens:
                break
            out_logits, out = place([i], [token], list(range(-1, i)), feat[None], i + 1, node_slots)
            logits, feat = out_logits[0], out[0]
        return Draft(tuple(tokens), torch.stack(probs) if probs else None, source=self.name)

    def _placer(self, m: int):
        """A function running draft nodes through the head, each attending the committed pairs
        (module 0 only; later modules see only the drafted path) and its own ancestors.

        run(nodes, tokens, parents, parent_feats (n, H), depth, node_slots) -> (logits (n, V), feats (n, H));
        parents is the whole parent array so far (-1 = root); node_slots maps node -> (module, slot).
        """
        used = {}

        def run(nodes, tokens, parents, parent_feats, depth, node_slots):
            module = depth % self.head.num_modules  # the root pair (depth 0) ran module 0
            first = used.get(module, m if module == 0 else 0)
            n = len(nodes)
            used[module] = first + n
            mask = torch.zeros(1, n, first + n, dtype=torch.bool)
            if module == 0:
                mask[0, :, :m] = True
            for i, node in enumerate(nodes):
                a = parents[node]
                while a >= 0:
                    if a < len(node_slots) and node_slots[a][0] == module:
                        mask[0, i, node_slots[a][1]] = True
                    a = parents[a]
                mask[0, i, first + i] = True
                while len(node_slots) <= node:
                    node_slots.append((-1, -1))
                node_slots[node] = (module, first + i)
            logits, out = self._run(module, parent_feats[None], torch.tensor([list(tokens)]),
                                    torch.full((1, n), m - 1 + depth), torch.arange(first, first + n), mask)
            return logits[0], out[0]

        return run
