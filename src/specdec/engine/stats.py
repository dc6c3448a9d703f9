"""SpecStats: the one counters object shared by CLI, server and bench (docs/design.md, Metrics).

Rates are derived here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.engine.verdict import Verdict, judge


@dataclass
class DrafterCounts:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0


@dataclass
class SpecStats:
    method: str = "none"  # the configured speculative types, e.g. "ngram-simple,draft-simple"
    drafted: int = 0  # drafted tokens sent to verification
    accepted: int = 0  # drafted tokens kept
    steps: int = 0  # verify steps that carried at least one drafted token
    decode_steps: int = 0  # all target forward passes after prefill (with or without drafts)
    emitted: int = 0  # tokens produced after prefill
    accepted_at: list[int] = field(default_factory=list)  # accepted_at[i]: steps whose position i was accepted
    drafted_at: list[int] = field(default_factory=list)  # drafted_at[i]: steps that drafted >= i+1 positions
    draft_s: float = 0.0  # proposing, in every decode step (those that found nothing included)
    verify_s: float = 0.0  # the target's forward and the accept rule, in every decode step
    rollback_s: float = 0.0  # dropping rejected rows and telling the drafters what was kept
    lossy: bool = False  # True when any step used relaxed (typical) acceptance
    grammar_cut: int = 0  # drafted tokens the request's grammar forbade, cut before verification (subtrees too)
    by_drafter: dict[str, DrafterCounts] = field(default_factory=dict)
    # what the verdict reads (engine/verdict.py; the step clock fills them, engine/step_clock.py)
    paused_steps: int = 0  # decode steps that drafted nothing because the adaptive policy paused drafting
    empty_steps: int = 0  # decode steps whose drafters were asked and proposed nothing
    drafted_step_s: float = 0.0  # seconds of the decode steps that carried a draft
    plain_steps: int = 0  # decode steps without a draft that ran alone (not batched): plain steps,
    plain_steps_s: float = 0.0  # and their seconds less asking the drafters
    decode_s: float = 0.0  # set when the request finishes
    decode_tokens: int = 0  # tokens after the first (an EOS that ended it included): plain decoding's steps
    plain_estimate_s: float | None = None  # decode_tokens x one plain step's seconds; None: none measured
    estimate_from: str | None = None  # where the plain step's price came from (step_clock.py)

    def record(self, source: str, drafted: int, accepted: int, depth: int | None = None) -> None:
        """One verify step: `drafted` tokens proposed by `source`, the first `accepted` kept. depth: the
        positions they cover (a tree's depth; a chain's length, the default): per-position acceptance
        counts positions, not a tree's nodes (a tree 3 deep of 6 nodes drafted 3 positions)."""
        self.decode_steps += 1
        self.emitted += accepted + 1
        if drafted == 0:
            return
        depth = drafted if depth is None else depth
        self.drafted += drafted
        self.accepted += accepted
        self.steps += 1
        while len(self.drafted_at) < depth:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(depth):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1
        counts = self.by_drafter.setdefault(source or "unknown", DrafterCounts())
        counts.drafted += drafted
        counts.accepted += accepted
        counts.steps += 1

    def merge(self, other: "SpecStats") -> None:
        """Add another request's counts (the bench's per-category rows). The plain estimates add up while every
        request that decoded has one (a request with no decode tokens adds 0 whatever it holds)."""
        a, b = self._estimate_or_zero(), other._estimate_or_zero()
        self.plain_estimate_s = None if a is None or b is None else a + b
        sources = {s for s in (self.estimate_from, other.estimate_from) if s}
        self.estimate_from = sources.pop() if len(sources) == 1 else "mixed" if sources else None
        for name in ("drafted", "accepted", "steps", "decode_steps", "emitted", "paused_steps", "empty_steps",
                     "plain_steps", "decode_tokens", "draft_s", "verify_s", "rollback_s", "drafted_step_s",
                     "plain_steps_s", "decode_s"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.lossy |= other.lossy
        self.grammar_cut += other.grammar_cut
        for i in range(len(other.drafted_at)):
            if i >= len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[i] += other.drafted_at[i]
            self.accepted_at[i] += other.accepted_at[i]
        for name, c in other.by_drafter.items():
            mine = self.by_drafter.setdefault(name, DrafterCounts())
            mine.drafted += c.drafted
            mine.accepted += c.accepted
            mine.steps += c.steps

    def _estimate_or_zero(self) -> float | None:
        return 0.0 if self.decode_tokens == 0 and self.plain_estimate_s is None else self.plain_estimate_s

    # -- derived -----------------------------------------------------------------------------
    @property
    def configured(self) -> bool:
        return self.method not in ("", "none")

    @property
    def engaged(self) -> bool:
        return self.drafted > 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """Tokens per verify step that carried drafts: 1 + accepted / steps."""
        return 1.0 + self.accepted / self.steps if self.steps else None

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "configured": self.configured,
            "engaged": self.engaged,
            "lossy": self.lossy,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "steps": self.steps,
            "decode_steps": self.decode_steps,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_acceptance": self.per_position_acceptance,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "rollback_s": self.rollback_s,
            "grammar_cut": self.grammar_cut,
            "by_drafter": {k: vars(v) for k, v in self.by_drafter.items()},
            "verdict": self.verdict().to_dict(),
        }

    def verdict(self) -> Verdict:
        """Did speculation pay, and if not why (engine/verdict.py)."""
        return judge(self)

    def summary(self) -> str:
        """One line for people."""
        if not self.configured:
            return "speculation: off"
        if not self.engaged:
            return f"speculation: {self.method} configured but NOT ENGAGED (drafted 0 tokens); {self.verdict().line()}"
        pos = " ".join(f"{r:.2f}" for r in self.per_position_acceptance)
        lossy = " LOSSY (typical acceptance)" if self.lossy else ""
        return (f"speculation: {self.method}{lossy} drafted {self.drafted} accepted {self.accepted} "
                f"(rate {self.acceptance_rate:.2f}, mean acceptance length {self.mean_acceptance_length:.2f}, "
                f"per position {pos}); draft {self.draft_s:.2f}s verify {self.verify_s:.2f}s rollback "
                f"{self.rollback_s:.2f}s; {self.verdict().line()}")
