"""What a plain decode step costs on this machine, measured as decoding goes: the yardstick of a
request's verdict (engine/verdict.py), which compares the time a request took with the time plain
decoding would have taken for the same tokens.

A decode step that carried no draft is exactly a plain step: [last token] through the same exact
forward, verified and emitted the same way (engine/engine.py). So a request's own undrafted steps,
and recent ones of other requests, price a plain step better than a forward timed apart from the
engine (cost.py's measure_forward_cost leaves out the step's sampling, planning and emitting: about
15% of a step of smollm2-135m on a CPU). Only steps that ran alone count: a batched step's seconds are
shared by every sequence in it.

    clock = StepClock()
    clock.step(req.stats, drafted=0, seconds=0.006, draft_s=0.0001, context=300, alone=True)   # each decode step
    clock.settle(req.stats, decode_s, decode_tokens, context, measure=lambda: engine.forward_cost(1))  # at the end
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable

from specdec.engine.stats import SpecStats

OWN_MIN = 4  # a request's own undrafted steps price its plain step once it has this many
RECENT = 64  # undrafted steps remembered across requests
NEAR = 2.0  # a remembered step prices a request whose context is within this factor of the step's


class StepClock:
    """Recent undrafted decode steps of one engine, each (context, seconds less drafting)."""

    def __init__(self, keep: int = RECENT):
        self.recent: deque[tuple[int, float]] = deque(maxlen=keep)

    def step(self, stats: SpecStats, drafted: int, seconds: float, draft_s: float, context: int,
             alone: bool) -> None:
        """One decode step of a request: `drafted` nodes verified (0: a plain step), `seconds` of the whole
        step, `draft_s` of them proposing, the cache holding `context` tokens before it; alone: the
        step's forward ran this request only."""
        if drafted:
            stats.drafted_step_s += seconds
        elif alone:
            stats.plain_steps += 1
            stats.plain_steps_s += seconds - draft_s  # asking the drafters costs nothing to plain decoding
            self.recent.append((context, seconds - draft_s))

    def plain_step(self, stats: SpecStats, context: int, forward_cost: list[float] | None) -> tuple[float, str] | None:
        """(seconds of one plain decode step at `context`, where that number comes from), or None when
        nothing was measured: the request's own undrafted steps (OWN_MIN or more), else recent steps at a
        context within NEAR of it, else whatever of the two there is, else the measured 1-token forward."""
        near = [s for c, s in self.recent if context / NEAR <= c <= context * NEAR]
        if stats.plain_steps >= OWN_MIN:
            return stats.plain_steps_s / stats.plain_steps, "own_plain_steps"
        if len(near) >= OWN_MIN:
            return statistics.median(near), "recent_plain_steps"
        if stats.plain_steps:
            return stats.plain_steps_s / stats.plain_steps, "own_plain_steps"
        if self.recent:
            return statistics.median(s for _, s in self.recent), "recent_plain_steps"
        if forward_cost is not None and len(forward_cost) > 1:
            return forward_cost[1], "forward_cost"
        return None

    def settle(self, stats: SpecStats, decode_s: float, decode_tokens: int, context: int,
               measure: Callable[[], list[float]] | None = None) -> None:
        """Write a finished request's decode time and its plain estimate into `stats`: decode_tokens
        (the tokens after the first, an EOS that ended it included: one plain step each) times a plain
        step at `context` (its mean context while decoding). measure() -> the forward cost (cost.py's):
        called only for a speculative request that decoded and that no plain step prices (every step of it
        drafted, on an engine that saw no plain step yet: an answer a stop string or EOS ended early)."""
        stats.decode_s = decode_s
        stats.decode_tokens = decode_tokens
        priced = self.plain_step(stats, context, None)
        if priced is None and measure is not None and decode_tokens > 0 and stats.configured:
            priced = self.plain_step(stats, context, measure())
        if priced is None:
            stats.plain_estimate_s, stats.estimate_from = None, None
        else:
            stats.plain_estimate_s, stats.estimate_from = decode_tokens * priced[0], priced[1]
