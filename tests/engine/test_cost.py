"""Draft length from measured verify costs."""

import pytest

from specdec.engine.cost import best_draft_length, expected_tokens, measure_forward_cost


def test_expected_tokens():
    assert expected_tokens(3, 0.0) == 1.0
    assert expected_tokens(3, 1.0) == 4.0
    assert expected_tokens(1, 0.5) == pytest.approx(1.5)


def test_cheap_verification_favours_long_drafts_and_costly_short_ones():
    flat = [0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    steep = [0, 1.0, 1.3, 2.6, 3.9, 5.2, 6.5]
    assert best_draft_length(0.8, flat, 0.0, 5) == 5
    assert best_draft_length(0.8, steep, 0.0, 5) == 1
    assert best_draft_length(0.3, [0, 1.0, 1.0, 1.6, 2.2, 2.8], 0.0, 4) == 1
    # an expensive drafter shortens the draft
    assert best_draft_length(0.8, flat, 0.5, 5) < 5


def test_measured_cost_is_positive_and_frees_its_slot(tiny_model):
    cache = tiny_model.transformer.new_cache(256)
    cost = measure_forward_cost(tiny_model.transformer, cache, 4, context=16, repeats=1)
    assert len(cost) == 5 and cost[0] == 0.0 and all(c > 0 for c in cost[1:])
    assert cache.free_slots == [0] and cache.lengths == [0]


def test_measured_cost_grows_as_the_forwards_do(tiny_model, monkeypatch):
    """cost[t] is the median of the t-token forwards' seconds: read off a clock that each real forward of t
    tokens moves by 1 + t/4 seconds, plus 0.5 in the first round and 10 in the second (a slow spell)."""
    import types

    from specdec.engine import cost as cost_module

    transformer, real = tiny_model.transformer, tiny_model.transformer.forward
    clock, rounds = [0.0], {}

    def forward(tokens, *args, **kwargs):
        out = real(tokens, *args, **kwargs)
        if kwargs.get("exact", True):  # the timed forwards (the context's prefill is not timed)
            t = tokens.shape[1]
            rounds[t] = rounds.get(t, -1) + 1
            clock[0] += 1 + t / 4 + (0.5, 10.0, 0.0)[rounds[t]]
        return out

    monkeypatch.setattr(transformer, "forward", forward)
    monkeypatch.setattr(cost_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    cost = measure_forward_cost(transformer, transformer.new_cache(256), 4, context=16, repeats=3)
    assert cost == [0.0, 1.75, 2.0, 2.25, 2.5]


def test_the_widths_take_turns(tiny_model, monkeypatch):
    """Each round measures every width once, so a slow spell of the machine does not fall on one width."""
    transformer = tiny_model.transformer
    widths, real = [], transformer.forward

    def forward(tokens, *args, **kwargs):
        if kwargs.get("exact", True):
            widths.append(tokens.shape[1])
        return real(tokens, *args, **kwargs)

    monkeypatch.setattr(transformer, "forward", forward)
    cost = measure_forward_cost(transformer, transformer.new_cache(256), 3, context=16, repeats=2)
    assert widths == [1, 2, 3, 1, 2, 3] and len(cost) == 4


def test_a_drafter_that_costs_one_pass_is_not_charged_per_token():
    """A block drafter's time is one pass per proposal: charged per token it would cut the draft
    that the same seconds, charged once per step, let run to the end of the block."""
    costly = [0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5]
    assert 0 < best_draft_length(0.7, costly, 0.1, 5) < 5  # 0.1 s per drafted token
    assert best_draft_length(0.7, costly, 0.0, 5, draft_cost_per_pass=0.1 * 5) == 5  # the same seconds, once


def test_adaptive_mode_charges_block_drafters_per_pass(tiny_model, monkeypatch):
    from specdec.drafters.base import Draft, DrafterBase
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    class Slow(DrafterBase):
        name = "slow"

        def propose(self, context, draft_length):
            return Draft.chain([1] * draft_length)

    class SlowBlock(Slow):
        cost_per_pass = True

    lengths = {}
    for drafter in (Slow(), SlowBlock()):
        engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",), draft_n_max=5, adaptive=True), max_len=64,
                        drafter_factory=lambda kind, spec, d=drafter: d)
        monkeypatch.setattr(engine, "forward_cost", lambda t: [0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6])
        req = engine.start([5, 6, 7], SamplingParams(), 8)
        policy = req.draft_policy
        policy.acceptance = 0.7
        policy.length = 5
        policy.draft_cost_s, policy.draft_cost_tokens, policy.draft_cost_steps = 9 * 0.5, 9 * 5, 9
        policy.update(5, 3, 0.5, 0, req.stats)  # 0.5 s per 5-token proposal
        lengths[drafter.cost_per_pass] = policy.length
        engine.finish(req)
    assert lengths[True] > lengths[False]


def test_a_probe_s_catch_up_does_not_price_the_drafts(tiny_model, monkeypatch):
    """A probe after a pause pays for catching a draft model up on every token committed meanwhile; that
    time must not become the price of a drafted token, or drafting never resumes at any acceptance (the
    0.5B draft for the 1.5B priced at 31 ms a token against its 15 after five probes)."""
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",), draft_n_max=3, adaptive=True), max_len=64)
    monkeypatch.setattr(engine, "forward_cost", lambda t: [0, 1.0, 1.1, 1.2, 1.3])
    req = engine.start([5, 6, 7], SamplingParams(), 8)
    policy = req.draft_policy
    policy.length = 2
    for _ in range(2):  # two steps at the chosen length: 0.1 s a drafted token
        req.stats.draft_s, req.stats.drafted, req.stats.steps = req.stats.draft_s + 0.2, req.stats.drafted + 2, 1
        policy.update(2, 0, 0.2, 0, req.stats)
    policy.length, policy.acceptance = 0, 0.95  # paused (nothing was accepted); then the text turns easy
    req.stats.draft_s += 100.0  # a probe that caught the draft up on many tokens
    req.stats.drafted += 1
    policy.update(1, 1, 100.0, 0, req.stats)
    assert policy.length > 0  # priced at 0.1 s a token, drafting pays at 0.95
    engine.finish(req)


def test_no_draft_length_pays_at_low_acceptance():
    cost = [0, 1.0, 1.2, 1.4, 1.6]
    assert best_draft_length(0.1, cost, 0.0, 3) == 0  # 1.1 tokens for 1.2 s: plain's 1 for 1.0 is better
    assert best_draft_length(0.3, cost, 0.0, 3) >= 1  # 1.3 for 1.2 s pays
    assert best_draft_length(0.3, cost, 0.2, 3) == 0  # not once drafting costs 0.2 s a token
    # a draft must beat plain decoding by the margin: 1.24 tokens for 1.2 s is 3% over plain
    assert best_draft_length(0.24, cost, 0.0, 3) == 0
    assert best_draft_length(0.24, cost, 0.0, 3, margin=0.0) == 1


def test_adaptive_mode_pauses_a_drafter_that_never_pays_and_probes_it(tiny_model, monkeypatch):
    """A drafter whose tokens are always wrong stops being asked after a few steps, but for 1-token
    probes, each rejected one doubling the wait for the next; the output stays plain decoding's."""
    from specdec.drafters.base import Draft, DrafterBase
    from specdec.engine.config import SpecConfig
    from specdec.engine.draft_length import PRIOR_ACCEPTANCE, PROBE_EVERY
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    asked = []  # (context length, draft length) of every proposal asked for

    class Wrong(DrafterBase):
        name = "wrong"

        def propose(self, context, draft_length):
            asked.append((len(context), draft_length))
            return Draft.chain([(context[-1] + 1) % 7] * draft_length)  # never what the model says here

    engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",), draft_n_max=3, adaptive=True), max_len=160,
                    drafter_factory=lambda kind, spec: Wrong())
    cost = [0, 1.0, 1.2, 1.4, 1.6, 1.8]
    monkeypatch.setattr(engine, "forward_cost", lambda t: cost)
    prompt = [5, 6, 7, 8]
    plain = Engine(tiny_model, max_len=160).generate(prompt, SamplingParams(), max_tokens=100)
    out = engine.generate(prompt, SamplingParams(), max_tokens=100)
    assert out.token_ids == plain.token_ids
    assert out.stats.accepted == 0
    # the first draft as long as the prior acceptance pays for (1.96 tokens for 1.4 s: 2 of 3)
    assert asked[0][1] == best_draft_length(PRIOR_ACCEPTANCE, cost, 0.0, 3) == 2
    assert len(asked) <= 12  # 99 steps, but asked only while it might pay, then probed
    probes = [n for n, k in asked[-3:]]
    assert [k for _, k in asked[-3:]] == [1, 1, 1]
    assert probes[2] - probes[1] == 2 * (probes[1] - probes[0]) == 4 * PROBE_EVERY  # waits of 16, then 32 steps


def test_draft_length_respects_the_minimum():
    steep = [0, 1.0, 1.3, 2.6, 3.9, 5.2, 6.5]
    assert best_draft_length(0.8, steep, 0.0, 5) == 1
    assert best_draft_length(0.8, steep, 0.0, 5, n_min=2) == 0  # 2.44 tokens for 2.6 s: plain pays more
    assert best_draft_length(0.95, [0, 1.0, 1.0, 1.1, 1.5], 0.0, 3, n_min=3) == 3


def test_adaptive_mode_never_asks_for_drafts_shorter_than_the_minimum(tiny_model, monkeypatch):
    """With --spec-draft-n-min 2, adaptive mode picks 0 or 2..n_max and probes with 2-token drafts: a
    1-token length was thrown away unverified at every step, so drafting stopped for good."""
    from specdec.drafters.base import Draft, DrafterBase
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    prompt = [5, 6, 7, 8]
    plain = Engine(tiny_model, max_len=160).generate(prompt, SamplingParams(), max_tokens=100).token_ids
    asked = []  # draft lengths asked for

    class HalfRight(DrafterBase):
        """The model's next token, then a wrong one: accepts 1 of 2."""
        name = "half-right"

        def propose(self, context, draft_length):
            asked.append(draft_length)
            done = len(context) - len(prompt)
            return Draft.chain([plain[done], (plain[done + 1] + 1) % 7][:draft_length])

    spec = SpecConfig(drafters=("ngram-simple",), draft_n_max=3, draft_n_min=2, adaptive=True)
    engine = Engine(tiny_model, spec, max_len=160, drafter_factory=lambda kind, spec: HalfRight())
    monkeypatch.setattr(engine, "forward_cost", lambda t: [0, 1.0, 1.3, 1.6, 1.9, 2.2])  # 1 token pays best
    out = engine.generate(prompt, SamplingParams(), max_tokens=98)
    assert out.token_ids == plain[:98]
    assert asked and min(asked) >= 2
    assert out.stats.steps >= 4  # drafting went on (2 drafts for 1.6 s: 1.5 tokens at 0.5 acceptance pays)


@pytest.mark.parametrize("max_len", [2, 3, 5])
def test_adaptive_mode_in_a_context_too_short_to_draft(tiny_model, max_len):
    """A context with no room for a draft (--ctx-size 2 under auto) decodes plainly; its cost curve is
    measured once, not at every request (it was an IndexError, and a new measurement per request)."""
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    engine = Engine(tiny_model, SpecConfig(drafters=("suffix",), draft_n_max=5, adaptive=True), max_len=max_len)
    plain = Engine(tiny_model, max_len=max_len).generate([5], SamplingParams(), max_tokens=8)
    assert engine.generate([5], SamplingParams(), max_tokens=8).token_ids == plain.token_ids
    measured = engine._forward_cost
    engine.generate([6], SamplingParams(), max_tokens=8)
    assert engine._forward_cost is measured


def test_a_draft_below_n_min_lets_the_next_drafter_draft(tiny_model):
    """Drafters are tried in order; the first one's draft shorter than --spec-draft-n-min was dropped and
    the step went undrafted, though the next drafter had one (DESIGN: a model drafter runs when the n-gram
    kinds found nothing)."""
    from specdec.drafters.base import Draft, DrafterBase
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    prompt = [5, 6, 7, 8]
    plain = Engine(tiny_model, max_len=64).generate(prompt, SamplingParams(), max_tokens=20).token_ids

    class Right(DrafterBase):
        def __init__(self, name, length):
            self.name, self.length = name, length

        def propose(self, context, draft_length):
            done = len(context) - len(prompt)
            return Draft.chain(plain[done : done + min(self.length, draft_length)])

    spec = SpecConfig(drafters=("ngram-simple", "suffix"), draft_n_max=3, draft_n_min=2)
    drafters = iter([Right("short", 1), Right("long", 3)])
    engine = Engine(tiny_model, spec, max_len=64, drafter_factory=lambda kind, spec: next(drafters))
    out = engine.generate(prompt, SamplingParams(), max_tokens=20)
    assert out.token_ids == plain
    assert out.stats.drafted > 0 and out.stats.accepted == out.stats.drafted


def test_a_plain_cache_is_measured_without_a_prefill(tiny_model):
    """The context is zero rows put in place (a 128-token prefill was most of a 1.5B's first adaptive request):
    only the measured widths run, each after `context` rows, and the slot is given back empty."""
    transformer = tiny_model.transformer
    cache = transformer.new_cache(64)
    widths = []

    class Counting:
        def forward(self, tokens, cache_, slots, **kw):
            widths.append((tokens.shape[1], cache_.lengths[slots[0]]))
            return transformer.forward(tokens, cache_, slots, **kw)

    measure_forward_cost(Counting(), cache, 3, context=16, repeats=2)
    assert widths == [(1, 16), (2, 16), (3, 16)] * 2
    assert cache.free_slots == [0] and cache.lengths == [0]
