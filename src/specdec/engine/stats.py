"""SpecStats: the one counters object shared by CLI, server and bench (docs/design.md, Metrics).

Rates are derived here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    draft_s: float = 0.0
    verify_s: float = 0.0
    lossy: bool = False  # True when any step used relaxed (typical) acceptance
    by_drafter: dict[str, DrafterCounts] = field(default_factory=dict)

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
        for name in ("drafted", "accepted", "steps", "decode_steps", "emitted"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.draft_s += other.draft_s
        self.verify_s += other.verify_s
        self.lossy |= other.lossy
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
            "by_drafter": {k: vars(v) for k, v in self.by_drafter.items()},
        }

    def summary(self) -> str:
        """One line for people."""
        if not self.configured:
            return "speculation: off"
        if not self.engaged:
            return f"speculation: {self.method} configured but NOT ENGAGED (drafted 0 tokens)"
        pos = " ".join(f"{r:.2f}" for r in self.per_position_acceptance)
        lossy = " LOSSY (typical acceptance)" if self.lossy else ""
        return (f"speculation: {self.method}{lossy} drafted {self.drafted} accepted {self.accepted} "
                f"(rate {self.acceptance_rate:.2f}, mean acceptance length {self.mean_acceptance_length:.2f}, "
                f"per position {pos}); draft {self.draft_s:.2f}s verify {self.verify_s:.2f}s")
