"""Choosing the draft length from measured costs, not a constant (docs/design.md, A step).

On a CPU a verify pass of 2 tokens costs about what 1 costs, but 6 cost ~2.5x (per-row attention
and the int8 kernel's per-row work), so the best length depends on the acceptance rate and is
worth computing rather than guessing. DraftLengthPolicy (engine/draft_length.py) calls these.
"""

from __future__ import annotations

import math
import time

import torch

from specdec.cache.kv import KVCache


def widest_forward(max_tokens: int, max_len: int) -> int:
    """max_tokens, cut to the widest forward a context of max_len verifies (at least 1): a context too
    short for longer drafts never runs them."""
    return max(1, min(max_tokens, max_len - 2))


def measure_forward_cost(transformer, cache, max_tokens: int, context: int = 128, repeats: int = 3) -> list[float]:
    """cost[t] = median seconds of one exact forward of t new tokens (t = 1..max_tokens) after `context` tokens.

    The widths take turns (1, 2, .., max_tokens, then again, `repeats` rounds), so that a slow spell of a
    shared machine lands on every width alike instead of on the one being measured then: the ratios
    between widths are what the draft length is chosen from. Uses a free slot of `cache` and gives it
    back; cost[0] = 0.
    """
    max_tokens = widest_forward(max_tokens, cache.max_len)
    ctx = max(1, min(context, cache.max_len - max_tokens - 1))
    if type(cache) is KVCache:  # keys and values only: zero rows cost what computed ones do, without a prefill
        slot = cache.allocate()
        cache.k[:, slot, :, :ctx].zero_()
        cache.v[:, slot, :, :ctx].zero_()
        cache.release(slot)
        slot = cache.allocate(slot, keep=ctx)  # (a 128-row prefill took 1.5 s of a 1.5B's first request)
    else:  # a recurrent state or more buffers besides (cache/recurrent.py, model/gemma4.py): computed
        slot = cache.allocate()
        transformer.forward(torch.zeros(1, ctx, dtype=torch.long), cache, [slot], exact=False, last_only=True)
    try:
        times: list[list[float]] = [[] for _ in range(max_tokens + 1)]
        for _ in range(repeats):
            for t in range(1, max_tokens + 1):
                t0 = time.perf_counter()
                transformer.forward(torch.zeros(1, t, dtype=torch.long), cache, [slot])
                times[t].append(time.perf_counter() - t0)
                cache.truncate(slot, ctx)
        return [0.0] + [sorted(ts)[len(ts) // 2] for ts in times[1:]]
    finally:
        cache.release(slot)


def expected_tokens(k: int, acceptance: float) -> float:
    """Tokens one verify step yields with k drafts and per-token acceptance a: (1 - a^(k+1)) / (1 - a)."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


# Drafting must promise this much more than plain decoding's tokens per second to be chosen: the
# acceptance estimate is an average of a few steps, the forward costs move by a few percent between
# measurements, and a step that drafts pays more than its forward (proposing, verifying, rolling back).
# So text that rarely repeats (acceptance 0.1-0.2) decodes plainly instead of 1-token drafts that lose.
DRAFT_MARGIN = 0.05


def verify_rows(k: int, width: float = 1.0) -> int:
    """Rows of the verify forward of a draft k positions deep with `width` nodes a position (1: a chain): its
    nodes and the last committed token."""
    return math.ceil(k * width - 1e-9) + 1


def best_draft_length(acceptance: float, forward_cost: list[float], draft_cost_per_token: float, n_max: int,
                      draft_cost_per_pass: float = 0.0, margin: float = DRAFT_MARGIN, n_min: int = 1,
                      width: float = 1.0) -> int:
    """The k in 0 and n_min..n_max (shorter drafts are not verified: --spec-draft-n-min) with the most
    expected tokens per second: a step of k drafts costs the
    verify forward of k + 1 tokens, k * draft_cost_per_token and draft_cost_per_pass; k = 0 is plain
    decoding (one token for forward_cost[1]), which a draft must beat by `margin` (a fraction), so 0
    means that no draft length pays at this acceptance. A token tree of depth k and `width` nodes a
    position costs the forward of ceil(k * width) + 1 rows (forward_cost's widest where it ends first);
    acceptance is then per position.

    >>> best_draft_length(0.9, [0, 1.0, 1.0, 1.2, 1.8, 2.4], 0.0, 5)  # 2.71 tokens / 1.2 s beats 3.44 / 1.8
    2
    >>> best_draft_length(0.1, [0, 1.0, 1.3, 1.6], 0.0, 2)  # 1.1 tokens / 1.3 s: plain's 1 / 1.0 is better
    0
    >>> best_draft_length(0.2, [0, 1.0, 1.15, 1.5], 0.0, 2)  # 1.2 / 1.15 s is 4% over plain: not enough
    0
    >>> best_draft_length(0.9, [0, 1.0, 1.0, 1.2, 1.8, 2.4], 0.0, 5, n_min=4)  # 4.1 / 2.4 s: 2 is not allowed
    4
    >>> best_draft_length(0.9, [0, 1.0, 1.0, 1.2, 1.8, 2.4, 3.0, 3.6], 0.0, 3, width=2)  # 1.9 / 1.2 s beats 2.71 / 2.4
    1
    """
    if width <= 1.0:
        n_max = min(n_max, len(forward_cost) - 2)
    best, best_rate = 0, (1.0 + margin) / forward_cost[1]
    for k in range(max(1, n_min), n_max + 1):
        rows = min(verify_rows(k, width), len(forward_cost) - 1)
        cost = forward_cost[rows] + k * draft_cost_per_token + draft_cost_per_pass
        rate = expected_tokens(k, acceptance) / cost
        if rate > best_rate:
            best, best_rate = k, rate
    return best
