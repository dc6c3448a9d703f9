"""Attention over the per-slot KV cache, for the CPU runtime's forward (model/transformer.py).

Each sequence's new K/V are written into its cache slot, then every query row reduces over its
keys: an exact row over exactly the keys a one-token step at its position reduces over, in the
same order (the exact rows of a whole forward in one call of model/kernels/attend.c, else torch
row by row); a prefill row (exact=False) with fused attention.

Sliding-window layers (Gemma 3's local layers) keep every key in the cache, so rollback stays a
length pointer; a query at position p reduces over the keys at positions p - window + 1 .. p
only (a tree node's window counted by its position, and only among its ancestors). Row by row,
that is again exactly the key set, in the same order, that a one-token step at p reduces over.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.cache.kv import KVCache
from specdec.model import kernels
from specdec.model.errors import CacheOverflowError
from specdec.model.segments import Segment

# the dtypes whose cache the C kernels (rows.c, attend.c, step.c) write and read; another goes through torch
KERNEL_CACHE_DTYPES = (torch.float32, torch.float16)
F16_OVERFLOW = 65520.0  # the smallest magnitude a float16 cache stores as inf (rows.c checks the same)


def _window_start(position, window: int) -> int:
    """The oldest cache offset (= position) a row at `position` sees: 0, or position - window + 1."""
    return 0 if not window else max(0, int(position) - window + 1)


def tree_row_keys(tree_mask: torch.Tensor, t: int, start: int, positions: torch.Tensor, window: int) -> torch.Tensor:
    """Cache offsets tree row t reduces over, in order: the committed prefix (from its window's start),
    then its ancestors and itself among the new rows at start + node (in tree order, inside the window)."""
    nodes = tree_mask[t].nonzero().flatten()
    if window:
        nodes = nodes[positions[nodes] > positions[t] - window]
    return torch.cat([torch.arange(min(_window_start(positions[t], window), start), start), start + nodes])


class CacheAttention:
    """Transformer's attention over the per-slot KV cache, as a mixin: it reads the model's config,
    attn_scale and _attend_kernel (whether attend.c runs the exact rows)."""

    def _attend_segments(self, cache: KVCache, li: int, window: int, segments: list[Segment], starts: list[int],
                         spans: list[tuple[slice, bool]], positions: torch.Tensor, key_lists: dict,
                         q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Layer li's attention: q (N, nh, hd), k, v (N, nkv, hd) -> (N, nh, hd); positions (N,).

        Writes each sequence's new K/V into its cache slot, then attends: the exact rows of every
        sequence in one attend.c call where it loaded (each row over its own key list, in order),
        the others (prefill) sequence by sequence with fused attention."""
        store = cache.k.dtype in KERNEL_CACHE_DTYPES and kernels.rows() is not None
        over = 0
        for seg, start, (rows, _) in zip(segments, starts, spans):
            if store:  # one C call each instead of a strided torch copy
                over += kernels.store_rows(k[rows], cache.k[li], seg.slot, start)
                over += kernels.store_rows(v[rows], cache.v[li], seg.slot, start)
            else:
                size = rows.stop - rows.start
                if cache.k.dtype == torch.float16:
                    over += int((k[rows].abs() >= F16_OVERFLOW).sum() + (v[rows].abs() >= F16_OVERFLOW).sum())
                cache.k[li, seg.slot, :, start : start + size] = k[rows].transpose(0, 1)
                cache.v[li, seg.slot, :, start : start + size] = v[rows].transpose(0, 1)
        if over:
            raise CacheOverflowError(over, li)
        kernel = self._attend_kernel and cache.k.dtype in KERNEL_CACHE_DTYPES and any(exact for _, exact in spans)
        if kernel and window not in key_lists:
            key_lists[window] = self._exact_key_lists(segments, starts, spans, positions, window)
        parts = []
        for seg, start, (rows, exact) in zip(segments, starts, spans):
            if not (kernel and exact):
                parts.append(self._attend(q[rows], cache, li, seg.slot, start, seg.tree_mask, exact, window,
                                          positions[rows]))
        if not kernel:
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        picked, slot, offsets, keys = key_lists[window]
        exact_out = kernels.attend_rows(q if picked is None else q[picked], cache.k[li], cache.v[li], slot, offsets,
                                        keys, self.attn_scale)
        if picked is None:
            return exact_out
        out = torch.empty_like(q)
        out[picked] = exact_out
        rest = iter(parts)
        for rows, exact in spans:
            if not exact:
                out[rows] = next(rest)
        return out

    def _exact_key_lists(self, segments: list[Segment], starts: list[int], spans: list[tuple[slice, bool]],
                         positions: torch.Tensor, window: int) -> tuple:
        """(picked rows or None for all, slot (n,), offsets (n + 1,), keys) of the exact rows, for attend.c:
        each row's keys are the ones _attend's row-by-row path reduces over, in the same order."""
        picked, slot, lists = [], [], []
        for seg, start, (rows, exact) in zip(segments, starts, spans):
            if not exact:
                continue
            pos = positions[rows]
            for t in range(rows.stop - rows.start):
                if seg.tree_mask is None:
                    lists.append(torch.arange(_window_start(pos[t], window), start + t + 1))
                else:
                    lists.append(tree_row_keys(seg.tree_mask, t, start, pos, window))
                picked.append(rows.start + t)
                slot.append(seg.slot)
        offsets = torch.zeros(len(lists) + 1, dtype=torch.int64)
        offsets[1:] = torch.tensor([len(keys) for keys in lists]).cumsum(0)
        everything = len(picked) == int(positions.shape[0])
        return (None if everything else torch.tensor(picked), torch.tensor(slot, dtype=torch.int64), offsets,
                torch.cat(lists).to(torch.int64))

    def _attend(self, q: torch.Tensor, cache: KVCache, li: int, slot: int, start: int,
                tree_mask: torch.Tensor | None, exact: bool, window: int = 0,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """q: (T, nh, hd) for new tokens at cache offsets start..start+T-1 -> (T, nh, hd).

        window > 0 (a sliding-window layer): row t sees only keys at positions > positions[t] - window.
        The committed prefix's keys sit at their offsets; a chain's new keys at start + t (default
        positions); a tree's nodes at `positions` (T,)."""
        c = self.config
        T = q.shape[0]
        group = c.num_heads // c.num_kv_heads
        keys = cache.k[li, slot]  # (nkv, max_len, hd)
        values = cache.v[li, slot]
        scale = self.attn_scale
        if window and positions is None:
            positions = start + torch.arange(T)
        if not exact and tree_mask is None:
            end = start + T
            # 4-D, with the kv heads shared by enable_gqa: torch's fused (flash) CPU kernel. A 3-D call over
            # kv heads repeated per query head runs its math path: 2.3-5.1x the time
            qh = q.transpose(0, 1)[None]  # (1, nh, T, hd)
            k = keys[None, :, :end].float()  # a float16 cache's values widened
            v = values[None, :, :end].float()
            allowed = torch.arange(end)[None, :] <= (start + torch.arange(T))[:, None]  # (T, end)
            if window:
                allowed &= torch.arange(end)[None, :] > (positions - window)[:, None]
            out = F.scaled_dot_product_attention(qh, k, v, attn_mask=allowed, scale=scale, enable_gqa=group > 1)
            return out[0].transpose(0, 1)
        out = torch.empty_like(q)
        qg = q.reshape(T, c.num_kv_heads, group, c.head_dim)
        for t in range(T):
            if tree_mask is None:
                lo = _window_start(positions[t], window) if window else 0
                k, v = keys[:, lo : start + t + 1].float(), values[:, lo : start + t + 1].float()
            else:
                idx = tree_row_keys(tree_mask, t, start, positions, window)
                k, v = keys[:, idx].float(), values[:, idx].float()
            # one decode step's attention: (nkv, group, hd) x (nkv, L, hd) -> (nkv, group, hd)
            scores = torch.matmul(qg[t], k.transpose(1, 2)) * scale
            out[t] = torch.matmul(torch.softmax(scores, dim=-1), v).reshape(c.num_heads, c.head_dim)
        return out
