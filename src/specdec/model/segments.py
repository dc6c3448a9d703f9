"""What a batched forward takes and gives: a Segment per sequence (its new tokens, cache slot, positions,
tree mask, numerics), and a ForwardOutput per segment. Transformer and DeviceTransformer share them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.cache.kv import KVCache


@dataclass
class Segment:
    """One sequence's new tokens in a batched forward (Transformer.forward_batch).

    tokens:    (T,) ids, appended to cache slot `slot` from its current length.
    positions: (T,) RoPE positions; default start + arange(T). A tree passes start + depth - 1.
    tree_mask: (T, T) bool, [i, j] True when new token i attends new token j; default causal.
               Every row always attends the slot's whole committed prefix.
    exact:     decode-identical numerics (decode and verify); False: fused attention (prefill).
    last_only: logits for the last row only (prefill).
    """

    tokens: torch.Tensor
    slot: int
    positions: torch.Tensor | None = None
    tree_mask: torch.Tensor | None = None
    exact: bool = True
    last_only: bool = False


def segment_layout(segments: list[Segment], cache: KVCache, max_positions: int) -> tuple[list[int], list[torch.Tensor]]:
    """Each segment's cache length before the forward and its rows' positions (T_b,), after checking
    that the slots differ, every segment has a token, and cache and context have room for them."""
    slots = [seg.slot for seg in segments]
    if len(set(slots)) != len(slots):
        raise ValueError(f"a batched forward got the same cache slot twice: {slots}")
    starts, positions = [cache.lengths[s] for s in slots], []
    for seg, start in zip(segments, starts):
        size = len(seg.tokens)
        if size < 1:
            raise ValueError(f"slot {seg.slot}: a segment of a batched forward needs at least one token")
        if start + size > cache.max_len:
            raise ValueError(f"sequence in slot {seg.slot} would exceed the cache length {cache.max_len}")
        positions.append(start + torch.arange(size) if seg.positions is None else seg.positions.reshape(-1))
        top = int(positions[-1].max())
        if top >= max_positions:
            raise ValueError(f"position {top} is beyond the context length {max_positions}")
    return starts, positions


@dataclass
class ForwardOutput:
    logits: torch.Tensor  # (B, T, V) float32, or (B, 1, V) when only the last row was asked for
    hidden: dict[int, torch.Tensor]  # layer index -> (B, T, H); see Transformer.forward
