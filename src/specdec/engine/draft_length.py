"""How many tokens a request drafts each step: one DraftLengthPolicy per request (Request.draft_policy).

    policy = DraftLengthPolicy(n_max=5, adaptive=True, forward_cost=engine.forward_cost)
    policy.reset()                                   # at admission: the first length, from the prior acceptance
    k = policy.next_length()                         # each decode step: the most tokens to draft now
    policy.update(drafted, accepted, draft_s, depth, stats)   # after the step's verify

Every request tracks its recent acceptance and tree width (the server's batch budget reads them). In
adaptive mode (SpecConfig.adaptive) the policy also picks, after each drafted step, the length with the
most expected tokens per second (cost.best_draft_length) from that acceptance, the measured cost of
verifying k tokens and what drafting has cost this request. At 0 (no length pays) drafting pauses,
with a probe of the shortest verified draft every `probe_every` steps, so that drafting comes back
when the text turns predictable; the wait doubles after each rejected probe, up to MAX_PROBE_EVERY.
"""

from __future__ import annotations

from typing import Callable

from specdec.engine.cost import best_draft_length, verify_rows
from specdec.engine.stats import SpecStats

PRIOR_ACCEPTANCE = 0.6  # the acceptance estimate before a request's first draft
PROBE_EVERY = 8  # while drafting is paused, a probe after this many steps,
MAX_PROBE_EVERY = 64  # the wait doubling after each probe that was not accepted, up to this

ForwardCost = Callable[[int], list[float]]  # forward_cost(t)[i]: seconds of one exact forward of i tokens, i <= t


class DraftLengthPolicy:
    """The draft length of one request.

    n_max, n_min: --spec-draft-n-max / --spec-draft-n-min (a length below n_min is never chosen; probes
    are max(1, n_min) long). adaptive: choose lengths from measurements (else every step may draft n_max).
    forward_cost: the engine's measured verify cost (read only in adaptive mode). cost_per_pass: every
    drafter of the request costs one pass per proposal, however long (block drafters), so drafting is
    priced per step, not per position.

    State: length (the chosen length; 0 = paused), acceptance (recent accepted positions per drafted
    position, an exponential average), tree_width (recent drafted nodes per position: 1 for chains; a
    draft k deep verifies about k x tree_width rows), paused_steps / probe_every (the probe clock while
    paused), draft_cost_s / _tokens / _steps (drafting seconds, positions and steps of the steps that
    drafted at a chosen length: what a draft is priced from. Not probes: a probe's time includes
    catching a draft model up on every token committed while paused).
    """

    def __init__(self, n_max: int, n_min: int = 0, adaptive: bool = False, forward_cost: ForwardCost | None = None,
                 cost_per_pass: bool = False):
        self.n_max = n_max
        self.n_min = n_min
        self.adaptive = adaptive
        self.forward_cost = forward_cost
        self.cost_per_pass = cost_per_pass
        self._forget()

    def _forget(self) -> None:
        self.length = self.n_max
        self.acceptance = PRIOR_ACCEPTANCE
        self.tree_width = 1.0
        self.paused_steps = 0
        self.probe_every = PROBE_EVERY
        self.draft_cost_s = 0.0
        self.draft_cost_tokens = 0
        self.draft_cost_steps = 0

    def reset(self) -> None:
        """Forget every measurement; in adaptive mode the first length is what PRIOR_ACCEPTANCE pays for
        (this measures the forward cost on the engine's first adaptive request)."""
        self._forget()
        if self.adaptive:
            self.length = best_draft_length(PRIOR_ACCEPTANCE, self.forward_cost(self.n_max + 1), 0.0, self.n_max,
                                            n_min=self.n_min)

    def next_length(self) -> int:
        """The most tokens this step may draft: `length`, except while adaptive mode has paused drafting:
        then 0, and a probe of max(1, n_min) tokens once every `probe_every` calls."""
        if self.length > 0 or not self.adaptive:
            return self.length
        self.paused_steps += 1
        if self.paused_steps < self.probe_every:
            return 0
        self.paused_steps = 0
        return max(1, self.n_min)

    def update(self, drafted: int, accepted: int, draft_s: float, depth: int, stats: SpecStats) -> None:
        """Learn from one verified step: `drafted` nodes over `depth` positions (0: a chain, depth = drafted),
        `accepted` positions kept, `draft_s` seconds spent drafting; stats: the request's counters, this step
        included (the price of a draft before any step at a chosen length). A step that drafted nothing
        teaches nothing.

        Acceptance is per position: a tree's accepted path over its depth, not over its nodes (a tree with
        wrong siblings would otherwise look badly accepted though every position was)."""
        if drafted == 0:
            return
        depth = depth or drafted
        self.acceptance = 0.7 * self.acceptance + 0.3 * (accepted / depth)
        self.tree_width = 0.7 * self.tree_width + 0.3 * (drafted / depth)
        if not self.adaptive:
            return
        if self.length == 0:  # a probe: probe sooner after an accepted one, later after a rejected one
            self.probe_every = PROBE_EVERY if accepted else min(2 * self.probe_every, MAX_PROBE_EVERY)
        else:
            self.draft_cost_s += draft_s
            self.draft_cost_tokens += depth
            self.draft_cost_steps += 1
        # before any step at a chosen length (probes only), every drafting step's time
        spent, tokens, steps = ((self.draft_cost_s, self.draft_cost_tokens, self.draft_cost_steps)
                                if self.draft_cost_steps else (stats.draft_s, sum(stats.drafted_at), stats.steps))
        per_token = per_pass = 0.0
        if self.cost_per_pass:
            per_pass = spent / max(steps, 1)  # a block costs one pass, however long
        else:
            per_token = spent / max(tokens, 1)  # per position: a tree drafts a depth's nodes in one pass
        rows = verify_rows(self.n_max, self.tree_width)
        self.length = best_draft_length(self.acceptance, self.forward_cost(rows), per_token, self.n_max, per_pass,
                                        n_min=self.n_min, width=self.tree_width)
