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

from typing import Sequence

import torch
from torch import nn

from specdec.drafters.base import Draft, DrafterBase
from specdec.drafters.tree import grow_tree
from specdec.model.layers import DecoderLayer, MaskedAttention, extend_rope, rope_rows, rope_tables
from specdec.sampling import SamplingParams, process_logits, sample_token


class HeadCache:
    """KV entries of one draft layer for one sequence: (nkv, max_len, hd), written by slot."""

    def __init__(self, kv_heads: int, head_dim: int, max_len: int, dtype=torch.float32):
        self.k = torch.zeros(kv_heads, max_len, head_dim, dtype=dtype)
        self.v = torch.zeros(kv_heads, max_len, head_dim, dtype=dtype)
        self.length = 0
        self.max_len = max_len


class HiddenHead(nn.Module):
    """What a hidden-state head provides; MTP and EAGLE-3 heads subclass it.

    hidden_layers: the target layers it reads (transformers' hidden_states indices).
    num_modules: how many distinct modules it has (the pair at draft depth d uses module d % n).
    """

    hidden_layers: tuple[int, ...] = ()
    num_modules: int = 1

    def init_rope(self, head_dim: int, theta: float, max_len: int, freq_factors=None) -> None:
        """RoPE rows for positions below max_len; run_layer adds rows when a position goes past them."""
        self.rope_args = (head_dim, theta, freq_factors)
        cos, sin = rope_tables(head_dim, theta, max_len, freq_factors)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def cover_rope(self, n: int) -> None:
        """Make the rows of positions below n ready (layers.extend_rope), in the buffers' device and dtype."""
        self.rope_cos, self.rope_sin = extend_rope(self.rope_cos, self.rope_sin, n, *self.rope_args)

    def run_layer(self, layer: DecoderLayer, attn_in: torch.Tensor, x: torch.Tensor, positions: torch.Tensor,
                  past_k, past_v, mask) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The head's decoder layer on new rows over its cache.

        attn_in: (B, T, A) normed attention input; x: (B, T, H) residual stream; positions: (B, T);
        past_k/v: (B, nkv, P, hd) or None; mask: (B or 1, T, P + T) bool, True = may attend, or an Attend that
        holds the past itself (train/ttt.py's ChainAttention). Returns (out (B, T, H), k, v (B, nkv, T, hd) of
        the new rows)."""
        B, T, H = x.shape
        if positions.numel():
            self.cover_rope(int(positions.max()) + 1)
        cos, sin = rope_rows(self.rope_cos, self.rope_sin, positions)
        attend = mask if callable(mask) else MaskedAttention(B, past_k, past_v, mask)
        out = layer(x.reshape(B * T, H), attend, cos, sin, attn_in.reshape(B * T, -1))
        return out.reshape(B, T, H), attend.k, attend.v

    def feature(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        """Target hidden rows {layer: (..., n, H)} -> features (..., n, F) for module 0."""
        raise NotImplementedError

    def module_layer(self, module: int) -> DecoderLayer:
        raise NotImplementedError

    def step(self, module: int, feats: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             past_k, past_v, mask, last_only: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """feats (B, T, F), tokens (B, T), positions (B, T) -> (logits (B, T, V_target), new feats (B, T, H), k, v).
        last_only: the logits of the last row only, (B, 1, V_target) (a catch-up over a prompt needs no more)."""
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
        self.begin([])

    # -- engine hooks --------------------------------------------------------------------------
    def begin(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(),
              generator: torch.Generator | None = None) -> None:
        self.sampling, self.generator = sampling, generator or torch.Generator()
        self.fed: list[int] = []  # tokens whose target hidden rows arrived, x_0..x_{m-1}
        self.pending: list[torch.Tensor] = []  # features of fed positions not yet in the head cache
        self._root: tuple[int, torch.Tensor, torch.Tensor] | None = None  # (m, logits, feature) of the last root
        for c in self.caches:
            c.length = 0

    @torch.inference_mode()
    def on_target_hidden(self, hidden: dict[int, torch.Tensor], tokens: Sequence[int]) -> None:
        """hidden: {layer: (n, H)} rows of the n tokens just committed to the target's cache."""
        self.pending.append(self.head.feature({k: v.float() for k, v in hidden.items()}))
        self.fed.extend(int(t) for t in tokens)

    # -- drafting --------------------------------------------------------------------------------
    @torch.inference_mode()
    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        m = len(self.fed)
        # head cache slots past m, what the draft is cut to near the end of the context: a chain places
        # draft_length - 1 nodes; a greedy tree runs up to topk nodes a depth through the head before it
        # prunes them to the budget
        free = self.max_len - m - 2
        draft_length = min(draft_length, free, free // max(self.topk, 1) + 1)
        budget = min(self.budget, free)
        if draft_length <= 0 or budget <= 0 or m == 0 or len(context) != m + 1:
            return Draft()
        logits, feat = self._catch_up(context)  # (V,), (H,) for the root pair at position m-1
        if self.topk <= 1:
            draft = self._chain(logits, feat, m, draft_length)
        else:
            draft = grow_tree(logits, feat, self._placer(m), max_depth=draft_length, topk=self.topk,
                              budget=budget, sampling=self.sampling, generator=self.generator,
                              process=self._probs, p_min=self.p_min)
        for c in self.caches:
            c.length = min(c.length, m) if c is self.caches[0] else 0
        return draft

    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed draft distribution (..., V) with the request's sampling settings."""
        return process_logits(logits, self.sampling)

    def _catch_up(self, context: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Run module 0 over committed pairs not yet cached; return the root's logits and feature."""
        cache = self.caches[0]
        start, m = cache.length, len(self.fed)
        if not self.pending and start == m and self._root is not None and self._root[0] == m:
            # asked again with nothing committed since (a step that failed after planning is planned again)
            return self._root[1], self._root[2]
        feats = torch.cat(self.pending, dim=0) if self.pending else None
        self.pending = []
        assert feats is not None and feats.shape[0] == m - start, "hidden rows and committed tokens out of step"
        tokens = torch.tensor([list(context[start + 1 : m + 1])])  # (1, T): x_{j+1}
        positions = torch.arange(start, m)[None]
        mask = torch.ones(1, m - start, m, dtype=torch.bool).tril(diagonal=start)  # causal over cache + new
        # only the root's logits: the output head over every row of a long prompt costs more than the layer
        logits, out = self._run(0, feats[None], tokens, positions, torch.arange(start, m), mask, last_only=True)
        self._root = (m, logits[0, -1], out[0, -1])
        return self._root[1], self._root[2]

    def _run(self, module: int, feats, tokens, positions, slots: torch.Tensor, mask, last_only: bool = False):
        """Run `module` on new rows and write their K/V at `slots`; mask (1, T, slots_end) over the cache.
        last_only: logits of the last row only."""
        cache = self.caches[module]
        end = mask.shape[-1] - feats.shape[1]
        past_k = cache.k[None, :, :end]
        past_v = cache.v[None, :, :end]
        # new rows attend cache[:end] then themselves; `mask` covers both
        logits, out, k, v = self.head.step(module, feats, tokens, positions, past_k, past_v, mask, last_only)
        cache.k[:, slots] = k[0].to(cache.k.dtype)
        cache.v[:, slots] = v[0].to(cache.v.dtype)
        cache.length = max(cache.length, int(slots.max()) + 1)
        return logits[..., : self.target_vocab], out

    def _chain(self, logits: torch.Tensor, feat: torch.Tensor, m: int, draft_length: int) -> Draft:
        tokens, probs = [], []
        place = self._placer(m)
        node_slots: list[tuple[int, int]] = []
        for i in range(draft_length):
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
            if i + 1 == draft_length:
                break
            out_logits, out = place([i], [token], list(range(-1, i)), feat[None], i + 1, node_slots)
            logits, feat = out_logits[0], out[0]
        return Draft.chain(tokens, torch.stack(probs) if probs else None)

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
