"""A request's verdict (engine/verdict.py), its plain-step yardstick (engine/step_clock.py) and where each
emitted token came from (Request.sources), on the tiny model and on hand-made counts."""

from __future__ import annotations

import pytest

from specdec.drafters.base import Draft, DrafterBase
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.engine.stats import SpecStats
from specdec.engine.step_clock import OWN_MIN, StepClock
from specdec.engine.verdict import PAYS, REASONS, judge
from specdec.sampling import SamplingParams

PROMPT = [5, 6, 7, 8]
N = 20


class Scripted(DrafterBase):
    """Drafts plain decoding's next tokens when `mine(done)` says so (done: tokens emitted so far), else
    nothing; `width` of them at most."""

    def __init__(self, name, plain, mine, width):
        self.name, self.plain, self.mine, self.width = name, plain, mine, width

    def propose(self, context, draft_length):
        done = len(context) - len(PROMPT)
        if not self.mine(done):
            return Draft()
        return Draft.chain(self.plain[done : done + min(self.width, draft_length)])


def expected_sources(plain_len: int, n_max: int) -> list[int]:
    """What the two Scripted drafters below make: drafter 1 (every third position) drafts 2 tokens, all kept
    and followed by the target's bonus; drafter 2 elsewhere drafts 1, kept, then the bonus; the first token is
    the prefill's (the target's); drafts are cut to the room left before N."""
    sources, done = [0], 1
    while done < plain_len:
        k = min(n_max, N - done - 1)
        step = [0] if k == 0 else [1] * min(2, k) + [0] if done % 3 == 0 else [2] + [0]
        sources += step
        done += len(step)
    return sources[:plain_len]


@pytest.fixture(scope="module")
def plain(tiny_model):
    out = Engine(tiny_model, max_len=64).generate(PROMPT, SamplingParams(), max_tokens=N)
    assert len(out.token_ids) == N  # no EOS: every step below runs
    return out


def test_sources_name_the_drafter_of_each_accepted_token_and_the_target_for_the_rest(tiny_model, plain):
    ids = plain.token_ids
    first = Scripted("first", ids, lambda done: done % 3 == 0, 2)
    second = Scripted("second", ids, lambda done: done % 3 != 0, 1)
    made = iter([first, second])
    engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple", "suffix"), draft_n_max=3), max_len=64,
                    drafter_factory=lambda d, spec: next(made))
    out = engine.generate(PROMPT, SamplingParams(), max_tokens=N)
    assert out.token_ids == ids
    assert out.source_names == ("target", "first", "second")
    assert out.sources == expected_sources(len(ids), 3)
    assert sum(s != 0 for s in out.sources) == out.stats.accepted  # every accepted draft was emitted here


def test_a_rejected_draft_leaves_only_the_target_s_tokens(tiny_model, plain):
    wrong = [(t + 1) % 100 for t in plain.token_ids]
    engine = Engine(tiny_model, SpecConfig(drafters=("suffix",)), max_len=64,
                    drafter_factory=lambda d, spec: Scripted("wrong", wrong, lambda done: True, 3))
    out = engine.generate(PROMPT, SamplingParams(), max_tokens=N)
    assert out.token_ids == plain.token_ids and out.stats.drafted > 0 and out.stats.accepted == 0
    assert out.sources == [0] * N
    assert out.stats.empty_steps == out.stats.paused_steps == 0  # it drafted at every step
    verdict = out.stats.verdict()
    assert verdict.reason in (None, "rejected_early")  # noise may make a lost step look paid, never another reason
    if not verdict.pays:
        assert verdict.reason == "rejected_early"


def test_a_plain_request_is_priced_by_its_own_steps_so_its_ratio_is_one(tiny_model):
    engine = Engine(tiny_model, max_len=64)
    out = engine.generate(PROMPT, SamplingParams(), max_tokens=N)
    stats = out.stats
    assert stats.plain_steps == stats.decode_steps == stats.decode_tokens == N - 1
    assert stats.estimate_from == "own_plain_steps"
    assert stats.plain_estimate_s == pytest.approx(out.decode_s, rel=1e-9)
    verdict = stats.verdict()
    assert verdict.speedup == pytest.approx(1.0, rel=1e-9)
    assert verdict.reason == "not_configured" and not verdict.pays
    assert len(engine.clock.recent) == N - 1  # and the engine remembers them for other requests


def test_nothing_to_match_is_counted_per_step(tiny_model):
    engine = Engine(tiny_model, SpecConfig(drafters=("suffix",)), max_len=64,
                    drafter_factory=lambda d, spec: Scripted("never", [], lambda done: False, 3))
    out = engine.generate(PROMPT, SamplingParams(), max_tokens=N)
    assert out.stats.empty_steps == out.stats.decode_steps - 1  # the last step has no room for a draft
    assert out.stats.verdict().reason in (None, "nothing_to_match")


def test_the_to_dict_carries_the_verdict_and_the_rollback():
    d = SpecStats(method="suffix").to_dict()
    assert set(d["verdict"]) == {"decode_s", "draft_s", "verify_s", "rollback_s", "plain_estimate_s", "plain_step_s",
                                 "estimate_from", "speedup", "pays", "reason", "explain"}
    assert d["rollback_s"] == 0.0 and d["verdict"]["reason"] == "unmeasured"


# -- the rules, on hand-made counts: 100 decode tokens, a plain step of 10 ms ------------------------
def counts(decode_s, **fields) -> SpecStats:
    stats = SpecStats(method="suffix", decode_s=decode_s, decode_tokens=100, plain_estimate_s=1.0,
                      estimate_from="own_plain_steps", decode_steps=100)
    for name, value in fields.items():
        setattr(stats, name, value)
    return stats


RULES = [  # (why, counts, reason)
    ("paid", counts(0.5, steps=40, accepted=60, accepted_at=[40], drafted_step_s=0.4), None),
    ("nothing drafted, mostly paused", counts(1.0, paused_steps=60, empty_steps=30), "paused"),
    ("nothing drafted, mostly empty", counts(1.0, paused_steps=10, empty_steps=80), "nothing_to_match"),
    ("the few drafted steps paid", counts(1.02, steps=5, accepted=10, accepted_at=[5], drafted_step_s=0.1,
                                          empty_steps=80), "nothing_to_match"),
    ("first tokens rejected", counts(1.1, steps=40, accepted=12, accepted_at=[10], drafted_step_s=0.8),
     "rejected_early"),
    ("slow proposals", counts(1.3, steps=40, accepted=60, accepted_at=[35], drafted_step_s=1.3, draft_s=0.5),
     "drafting_costly"),
    ("slow verification", counts(1.3, steps=40, accepted=60, accepted_at=[35], drafted_step_s=1.3, draft_s=0.1),
     "verify_costly"),
    ("no plain step measured", counts(1.0, plain_estimate_s=None, estimate_from=None), "unmeasured"),
]


@pytest.mark.parametrize("why, stats, reason", RULES, ids=[r[0] for r in RULES])
def test_each_reason_has_one_rule(why, stats, reason):
    verdict = judge(stats)
    assert verdict.reason == reason
    assert verdict.explain == REASONS.get(reason)
    assert verdict.pays == (reason is None)
    if verdict.speedup is not None:
        assert verdict.speedup == pytest.approx(1.0 / stats.decode_s)
        assert (verdict.speedup >= PAYS) == verdict.pays
        assert verdict.plain_step_s == pytest.approx(0.01)


def test_speculation_off_is_not_configured_whatever_the_ratio():
    stats = counts(0.5)
    stats.method = "none"
    assert judge(stats).reason == "not_configured" and not judge(stats).pays


def test_merged_counts_add_their_estimates_while_every_request_has_one():
    total = SpecStats(method="suffix")
    total.merge(counts(0.5))
    total.merge(counts(0.7))
    assert total.plain_estimate_s == pytest.approx(2.0) and total.decode_tokens == 200
    assert judge(total).speedup == pytest.approx(2.0 / 1.2)
    short = SpecStats(method="suffix")  # a request that decoded nothing adds 0, estimated or not
    total.merge(short)
    assert total.plain_estimate_s == pytest.approx(2.0) and total.estimate_from == "own_plain_steps"
    other = counts(1.0, estimate_from="recent_plain_steps")
    total.merge(other)
    assert total.estimate_from == "mixed"
    total.merge(counts(1.0, plain_estimate_s=None, estimate_from=None))
    assert total.plain_estimate_s is None and judge(total).reason == "unmeasured"


def test_the_clock_prices_own_steps_then_recent_ones_near_the_context_then_the_forward():
    clock = StepClock()
    stats = SpecStats(method="suffix")
    assert clock.plain_step(stats, 100, None) is None
    assert clock.plain_step(stats, 100, [0.0, 0.004]) == (0.004, "forward_cost")
    for _ in range(OWN_MIN):
        clock.step(SpecStats(), 0, 0.010, 0.0, 1000, alone=True)  # another request's, far from context 100
    assert clock.plain_step(stats, 100, [0.0, 0.004]) == (0.010, "recent_plain_steps")  # any recent beats none
    for _ in range(OWN_MIN):
        clock.step(SpecStats(), 0, 0.006, 0.0, 120, alone=True)
    assert clock.plain_step(stats, 100, None) == (0.006, "recent_plain_steps")  # those near its context
    clock.step(stats, 0, 0.009, 0.001, 100, alone=True)
    assert clock.plain_step(stats, 100, None) == (0.006, "recent_plain_steps")  # one own step is not enough
    for _ in range(OWN_MIN - 1):
        clock.step(stats, 0, 0.009, 0.001, 100, alone=True)
    assert clock.plain_step(stats, 100, None) == (pytest.approx(0.008), "own_plain_steps")
    clock.step(stats, 3, 0.050, 0.001, 100, alone=True)  # a drafted step is no plain step
    clock.step(stats, 0, 0.050, 0.001, 100, alone=False)  # nor is a batched one
    assert stats.plain_steps == OWN_MIN and stats.drafted_step_s == pytest.approx(0.050)
    clock.settle(stats, 0.2, 50, 100)
    assert stats.plain_estimate_s == pytest.approx(0.4) and stats.decode_s == 0.2


def test_the_forward_is_measured_only_when_no_plain_step_prices_a_request():
    calls = []

    def measure():
        calls.append(1)
        return [0.0, 0.004]

    clock = StepClock()
    stats = SpecStats(method="suffix")
    clock.settle(stats, 0.1, 0, 100, measure)  # nothing decoded: nothing to price
    clock.settle(SpecStats(method="none"), 0.1, 10, 100, measure)  # plain: its own steps or nothing
    assert not calls and stats.plain_estimate_s is None
    clock.settle(stats, 0.1, 10, 100, measure)
    assert calls == [1] and stats.plain_estimate_s == pytest.approx(0.04) and stats.estimate_from == "forward_cost"
    clock.step(SpecStats(), 0, 0.006, 0.0, 100, alone=True)
    clock.settle(stats, 0.1, 10, 100, measure)
    assert calls == [1] and stats.estimate_from == "recent_plain_steps"  # a measured plain step beats the forward


def test_a_request_that_drafted_at_every_step_is_priced_by_the_measured_forward(tiny_model, plain):
    ids = plain.token_ids
    stop = tiny_model.tokenizer.decode(ids[:3])  # found once the third token is out: in the first, drafted, step
    engine = Engine(tiny_model, SpecConfig(drafters=("suffix",)), max_len=64,
                    drafter_factory=lambda d, spec: Scripted("right", ids, lambda done: True, 3))
    out = engine.generate(PROMPT, SamplingParams(), max_tokens=N, stop=[stop])
    assert out.finish_reason == "stop" and out.stats.decode_steps == out.stats.steps == 1
    assert out.stats.plain_steps == 0 and out.stats.estimate_from == "forward_cost"
    assert out.stats.plain_estimate_s == pytest.approx(out.stats.decode_tokens * engine.forward_cost(1)[1])
    assert out.stats.verdict().reason != "unmeasured"
