"""Did speculation pay on a request, and if not, why: one verdict, written here once, that the CLI
(generate --json), the server (`spec.verdict`), the chat page and the bench all show.

    v = judge(stats)          # stats: a finished request's SpecStats (or several merged)
    v.speedup                 # estimated plain seconds / measured decode seconds
    v.reason, v.explain       # None when it paid; else a code and one sentence

The estimate: every token after the first costs plain decoding one step, priced by what a plain step
costs here (engine/step_clock.py: this request's own undrafted steps, else recent ones, else the measured
1-token forward). The time split: drafting (proposing), verifying (the target's forward and the accept
rule, undrafted steps' forwards included) and rolling back (the cache's rows of rejected drafts dropped,
drafters told what was kept: a length pointer for chains, a row copy for trees).

The reasons, checked in this order when the speed-up is under PAYS:
    not_configured    speculation was off for this request (whatever the ratio says: it measures noise).
    unmeasured        no plain step was measured yet, so there is nothing to compare with.
    paused            the steps that drafted paid for their tokens (or none drafted), and the adaptive
                      policy decided more of the others than the drafters did: drafting was paused.
    nothing_to_match  the same, but the drafters came back empty more often than the policy paused them.
    rejected_early    the drafted steps lost, and fewer than half of them kept their first drafted token.
    drafting_costly   the drafted steps lost, but would have paid without the time spent proposing.
    verify_costly     the drafted steps lost though their drafts were kept and cheap: verifying k + 1
                      tokens costs more on this machine than the tokens it yields.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

PAYS = 1.05  # a speed-up this large or more paid; below it (about 1 included) the verdict names a reason

REASONS = {
    "not_configured": "speculation was off for this request",
    "unmeasured": "no plain decode step has been measured yet to compare with",
    "paused": "the adaptive policy paused drafting in most steps: no draft length pays at this acceptance",
    "nothing_to_match": "the drafters found nothing to propose in most steps",
    "rejected_early": "most drafts were rejected at their first token",
    "drafting_costly": "proposing the drafts took the time that accepting them saved",
    "verify_costly": "verifying the drafts costs more on this machine than the tokens they gave",
}


@dataclass(frozen=True)
class Verdict:
    decode_s: float  # the request's decode (every step after the first token's)
    draft_s: float
    verify_s: float
    rollback_s: float
    plain_estimate_s: float | None  # what plain decoding would have taken for the same tokens
    plain_step_s: float | None  # one plain step, as priced
    estimate_from: str | None  # own_plain_steps, recent_plain_steps or forward_cost (step_clock.py)
    speedup: float | None  # plain_estimate_s / decode_s
    pays: bool  # speedup >= PAYS
    reason: str | None  # None when it paid, else a key of REASONS
    explain: str | None  # REASONS[reason]

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """One line for people: 'verdict: 1.42x plain (...)' or the reason it did not pay."""
        if self.reason in ("not_configured", "unmeasured"):
            return f"verdict: {self.explain}"
        est = f"plain estimated {self.plain_estimate_s:.2f}s from {self.estimate_from}"
        if self.pays:
            return f"verdict: {self.speedup:.2f}x plain decoding ({est})"
        return f"verdict: {self.speedup:.2f}x plain decoding, did not pay: {self.reason}, {self.explain} ({est})"


def judge(stats) -> Verdict:  # stats: engine/stats.SpecStats, which imports this module
    """The verdict of a finished request's stats (decode_s and plain_estimate_s set by StepClock.settle)."""
    est, n = stats.plain_estimate_s, stats.decode_tokens
    speedup = est / stats.decode_s if est is not None and n > 0 and stats.decode_s > 0 else None
    step = est / n if est is not None and n > 0 else None
    if not stats.configured:
        reason = "not_configured"
    elif speedup is None:
        reason = "unmeasured"
    elif speedup >= PAYS:
        reason = None
    else:
        drafted_tokens = stats.steps + stats.accepted  # what the drafted steps gave (one of the target's each)
        if stats.steps == 0 or stats.drafted_step_s <= step * drafted_tokens:
            reason = "paused" if stats.paused_steps > stats.empty_steps else "nothing_to_match"
        elif 2 * stats.accepted_at[0] < stats.steps:
            reason = "rejected_early"
        elif stats.drafted_step_s - stats.draft_s <= step * drafted_tokens:
            reason = "drafting_costly"
        else:
            reason = "verify_costly"
    return Verdict(stats.decode_s, stats.draft_s, stats.verify_s, stats.rollback_s, est, step, stats.estimate_from,
                   speedup, speedup is not None and speedup >= PAYS and stats.configured, reason,
                   REASONS.get(reason))
