"""The engine's drafter bookkeeping on a tiny model: which drafters a SpecConfig gets, in which
order they are tried, and who hears the feedback."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "drafters"))

from helpers.tiny import make_hf_model, tiny_config  # noqa: E402
from mtp_helpers import deepseek_layout, mtp_block  # noqa: E402

from specdec.drafters.registry import DrafterSpec  # noqa: E402
from specdec.engine.config import SpecConfig  # noqa: E402
from specdec.engine.engine import MAX_CACHED_CONFIGS, Engine  # noqa: E402
from specdec.model.load import load_model  # noqa: E402
from specdec.sampling import SamplingParams  # noqa: E402


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    tensors = deepseek_layout([mtp_block(tiny_config(), seed=1)], 2)
    folder = make_hf_model(tmp_path_factory.mktemp("mtp") / "ds", extra_config={"num_nextn_predict_layers": 1},
                           extra_tensors=tensors)
    return load_model(str(folder), "fp32", progress=False)


def test_each_distinct_config_gets_drafters_built_with_its_own_settings(mtp_model):
    """The drafter cache was keyed by (type, draft model, p-min, cross-tokenizer): a second config
    with another tree shape or draft length got the drafter built for the first."""
    engine = Engine(mtp_model, max_len=128)
    chain = SpecConfig(drafters=("draft-mtp",), draft_n_max=2)
    tree = chain.with_overrides(tree_topk=2)
    longer = tree.with_overrides(draft_n_max=4)
    (a,), (b,), (c,) = engine.drafters_for(chain), engine.drafters_for(tree), engine.drafters_for(longer)
    assert (a.topk, a.budget) == (1, 2) and (b.topk, b.budget) == (2, 4) and (c.topk, c.budget) == (2, 8)
    assert engine.drafters_for(SpecConfig(drafters=("draft-mtp",), draft_n_max=2)) == [a]  # equal settings: reused
    prompt = list(range(5, 30))
    out = engine.generate(prompt, SamplingParams(), max_tokens=12, spec=tree)
    assert out.stats.drafted > out.stats.steps  # tree drafts: more nodes than steps at depth <= 2
    assert out.token_ids == engine.generate(prompt, SamplingParams(), max_tokens=12).token_ids


def test_options_are_part_of_the_drafter_settings(tiny_model):
    engine = Engine(tiny_model, max_len=64)
    (plain,) = engine.drafters_for(SpecConfig(drafters=("ngram-map-k",)))
    (strict,) = engine.drafters_for(SpecConfig(drafters=(DrafterSpec.of("ngram-map-k", min_hits=7),)))
    assert (plain.min_hits, strict.min_hits) == (1, 7)


def test_the_cache_of_drafter_sets_is_bounded(tiny_model):
    engine = Engine(tiny_model, max_len=64)
    first = engine.drafters_for(SpecConfig(drafters=("suffix",), draft_n_max=1))
    for k in range(2, MAX_CACHED_CONFIGS + 3):
        engine.drafters_for(SpecConfig(drafters=("suffix",), draft_n_max=k))
    assert len(engine._pool) == MAX_CACHED_CONFIGS
    assert engine.drafters_for(SpecConfig(drafters=("suffix",), draft_n_max=1)) is not first  # evicted, rebuilt


def test_ngram_kinds_are_tried_before_the_model_drafter(tiny_model, tiny_hf_dir):
    """--spec-type draft-simple,ngram-simple ran the draft model first, which always drafts, so
    the n-gram drafter was never asked."""
    engine = Engine(tiny_model, max_len=256)
    spec = SpecConfig(drafters=("draft-simple", "ngram-simple"), draft_model=str(tiny_hf_dir))
    prompt = [7, 8, 9, 10, 11, 12] * 6
    out = engine.generate(prompt, SamplingParams(), max_tokens=60, spec=spec)  # the output falls into a loop
    assert out.stats.by_drafter["ngram-simple"].drafted > 0
    assert out.token_ids == engine.generate(prompt, SamplingParams(), max_tokens=60).token_ids


def test_feedback_reaches_the_drafter_that_proposed(tiny_model):
    """on_accept goes to the drafter object that made the draft, not to every drafter of that name."""
    from specdec.drafters.base import Draft, DrafterBase

    class Recorder(DrafterBase):
        def __init__(self, name, tokens):
            self.name, self.tokens, self.heard = name, tokens, []

        def propose(self, context, max_tokens):
            return Draft.chain(self.tokens[:max_tokens])

        def on_accept(self, num_accepted):
            self.heard.append(num_accepted)

    silent, talker = Recorder("same-name", []), Recorder("same-name", [1, 2])
    drafters = iter([silent, talker])
    engine = Engine(tiny_model, max_len=64, drafter_factory=lambda d, spec: next(drafters))
    engine.generate([3, 4, 5], SamplingParams(), max_tokens=4, spec=SpecConfig(drafters=("suffix", "ngram-simple")))
    assert silent.heard == [] and len(talker.heard) >= 1


def test_sequences_running_together_get_their_own_drafter_sets(tiny_model):
    """A drafter keeps per-sequence state between begin() and end(): two sequences with the same
    settings that run at once must not share one; a finished sequence's set serves the next."""
    engine = Engine(tiny_model, SpecConfig(drafters=("suffix",)), max_len=64, max_sequences=3)
    a, b = engine.admit([1, 2, 3]), engine.admit([4, 5, 6])
    assert a.drafters[0] is not b.drafters[0]
    engine.finish(a)
    c = engine.admit([7, 8, 9])
    assert c.drafters[0] is a.drafters[0] and engine._pool.sets(engine.spec) == 2
    for k in range(2, MAX_CACHED_CONFIGS + 3):  # other configs come and go; the running one's stays
        engine.drafters_for(SpecConfig(drafters=("suffix",), draft_n_max=k))
    assert engine._pool.sets(engine.spec) == 2
    engine.finish(b), engine.finish(c)


def test_admit_refuses_when_every_slot_is_taken_and_loses_nothing(tiny_model):
    engine = Engine(tiny_model, max_len=64, max_sequences=1)
    a = engine.admit([1, 2, 3])
    with pytest.raises(RuntimeError, match="slots are in use"):
        engine.admit([4, 5])
    engine.finish(a)
    assert engine.generate([4, 5], max_tokens=3).token_ids


@pytest.mark.parametrize("call, error, message", [
    (lambda e: e.generate([1, 2, 3], None, 4), TypeError, "sampling must be a SamplingParams, got NoneType"),
    (lambda e: e.generate([1, 2, 3], {"temperature": 1}, 4), TypeError, "sampling must be a SamplingParams, got dict"),
    (lambda e: e.generate([1, 2, 3], SamplingParams(), 4, spec={}), TypeError, "spec must be a SpecConfig, got dict"),
    (lambda e: e.generate("hello", SamplingParams(), 4), TypeError, "prompt must be a sequence of token ids, got str"),
    (lambda e: e.generate([1, 2, 3], SamplingParams(), float("nan")), ValueError,
     "max_tokens must be a whole number of at least 1, got nan"),  # ran to the end of the context
    (lambda e: e.generate([1, 2, 3], SamplingParams(), 2.5), ValueError, "max_tokens must be a whole number"),
])
def test_a_bad_argument_is_refused_before_a_cache_slot_is_taken(tiny_model, call, error, message):
    """sampling=None took the only slot and kept it: every later request was 'all 1 KV cache slots in use'."""
    engine = Engine(tiny_model, max_len=64, max_sequences=1)
    with pytest.raises(error, match=message):
        call(engine)
    fresh = Engine(tiny_model, max_len=64).generate([4, 5], max_tokens=3).token_ids
    assert engine.generate([4, 5], max_tokens=3).token_ids == fresh


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_len=-1), "max_len must be a whole number of at least 0, got -1"),
    (dict(max_len=2.5), "max_len must be a whole number of at least 0, got 2.5"),
    (dict(max_sequences=0), "max_sequences must be a whole number of at least 1, got 0"),  # admitted nothing ever
])
def test_engine_sizes_are_checked(tiny_model, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Engine(tiny_model, **kwargs)


def test_stepping_a_request_given_back_is_refused_and_leaves_the_others_alone(tiny_model):
    """After finish(a), a.slot is -1: stepping a wrote into the last slot, another sequence's cache."""
    alone = Engine(tiny_model, max_len=64).generate([7, 8, 9, 7, 8, 9], max_tokens=8).token_ids
    engine = Engine(tiny_model, max_len=64, max_sequences=2)
    a = engine.admit([1, 2, 3, 4, 5], max_tokens=8)
    engine.step(a)
    b = engine.admit([7, 8, 9, 7, 8, 9], max_tokens=8)
    engine.step(b)
    engine.finish(a)
    with pytest.raises(ValueError, match="already given back with Engine.finish"):
        engine.step(a)
    while not b.finished:
        engine.step(b)
    assert b.output == alone


def _answer_with_a_special_token(engine, prompt):
    """A seeded sampled answer of the tiny model that holds a special token other than eos (its ids 0 and 1,
    <|endoftext|> and <|im_start|>, are 2 of 512: a few seeds find one)."""
    tok = engine.model.tokenizer
    special = {i for i, t in tok.backend.get_added_tokens_decoder().items() if t.special} - set(tok.eos_ids)
    for seed in range(300):
        sampling = SamplingParams(temperature=1.5, seed=seed)
        result = engine.generate(prompt, sampling, max_tokens=40)
        if special & set(result.token_ids):
            return sampling, result
    raise AssertionError("no seed gave a special token")


def test_an_answer_s_text_leaves_special_tokens_out(tiny_model):
    """As vLLM (skip_special_tokens) and llama-server do: the ids stay in token_ids, their text
    (<|im_start|>, <|endoftext|>) is not in the answer, streamed or whole, nor matched by a stop string."""
    from specdec.model.text_stream import TextStream

    engine = Engine(tiny_model, max_len=256)
    tok = tiny_model.tokenizer
    prompt = [5, 17, 33]
    sampling, result = _answer_with_a_special_token(engine, prompt)
    assert result.text == tok.decode(result.token_ids, skip_special=True) != tok.decode(result.token_ids)
    assert "<|endoftext|>" not in result.text and "<|im_start|>" not in result.text
    stream, streamed = TextStream(tok, (), skip_special=True), ""
    req = engine.start(prompt, sampling, 40)
    while not req.finished:
        engine.step(req)
        streamed += stream.advance(req.output)
    engine.finish(req)
    assert streamed + stream.finish(engine.result(req).text) == result.text
    for stop in ("<|endoftext|>", "<|im_start|>"):
        assert engine.generate(prompt, sampling, max_tokens=40, stop=[stop]).text == result.text
    # a request may keep them (vLLM's skip_special_tokens: false): whole text, and stop strings match them
    req = engine.admit(prompt, sampling, 40, skip_special=False)
    while not req.finished:
        engine.step_batch([req])
    engine.finish(req)
    assert engine.result(req).text == tok.decode(result.token_ids)
    special = next(t for t in ("<|endoftext|>", "<|im_start|>") if t in tok.decode(result.token_ids))
    req = engine.admit(prompt, sampling, 40, stop=[special], skip_special=False)
    while not req.finished:
        engine.step_batch([req])
    engine.finish(req)
    assert engine.result(req).text == tok.decode(result.token_ids).split(special)[0]


@pytest.mark.parametrize("drafters", [(), ("ngram-simple",), ("suffix",)])
def test_prompt_and_answer_fill_the_whole_context(tiny_model, drafters):
    """-c 20 with a 1-token prompt gave 18 tokens where 19 fit (vLLM's max_model_len counts prompt + output):
    every slot of the cache is used now, with speculation too, and the output is plain decoding's."""
    from specdec.engine.config import SpecConfig

    plain = Engine(tiny_model, max_len=20).generate([7], SamplingParams(), max_tokens=100)
    result = Engine(tiny_model, SpecConfig(drafters=drafters), max_len=20).generate([7], SamplingParams(),
                                                                                      max_tokens=100)
    assert result.token_ids == plain.token_ids
    assert plain.finish_reason == "stop" or (len(plain.token_ids) == 19 and plain.finish_reason == "length")


@pytest.mark.parametrize("good_spec", [None, "draft-mtp"])
def test_a_failed_step_leaves_the_other_requests_as_they_were(tiny_model, mtp_model, good_spec):
    """One request's commit raising (its drafter's on_accept) left the requests after it with the step's rows
    in their caches but not in their output: stepped on, they answered otherwise than plain decoding. A request
    drafting with MTP layers went on to an AssertionError (its head had drafted from rows it was not given
    again)."""
    from specdec.drafters.base import Draft, DrafterBase
    from specdec.engine.config import SpecConfig

    model = tiny_model if good_spec is None else mtp_model
    good_spec = None if good_spec is None else SpecConfig(drafters=(good_spec,), draft_n_max=3)

    class Exploding(DrafterBase):
        name = "exploding"

        def propose(self, context, draft_length):
            return Draft.chain([5] * draft_length)

        def on_accept(self, num_accepted):
            raise RuntimeError("a drafter failed")

    engine = Engine(model, SpecConfig(), max_len=64, max_sequences=2)
    engine.drafter_factory = lambda d, spec: Exploding() if d.kind == "ngram-simple" else engine.build_drafter(d, spec)
    prompt = [7, 8, 9, 10, 11, 12]
    plain = Engine(model, max_len=64).generate(prompt, SamplingParams(), max_tokens=12).token_ids
    bad = engine.admit([3, 4, 5], SamplingParams(), 12, spec=SpecConfig(drafters=("ngram-simple",), draft_n_max=3))
    good = engine.admit(prompt, SamplingParams(), 12, spec=good_spec)
    engine.step_batch([bad, good])  # both prefill
    with pytest.raises(RuntimeError, match="a drafter failed"):
        engine.step_batch([bad, good])
    assert engine.cache.lengths[good.slot] == len(prompt) + len(good.output) - 1  # its last token not in yet
    engine.finish(bad)
    while not good.finished:
        engine.step_batch([good])
    assert good.output == plain
    assert good_spec is None or good.stats.drafted > 0
    engine.finish(good)
    assert sorted(engine.cache.free_slots) == [0, 1]


@pytest.mark.parametrize("chunk", [-1, 0, 2.5])
def test_a_prefill_chunk_below_one_token_is_refused(tiny_model, chunk):
    """-1 prefilled all but the last prompt token silently (the answer continued another prompt)."""
    engine = Engine(tiny_model, max_len=64)
    req = engine.admit(list(range(5, 15)), SamplingParams(), 4)
    with pytest.raises(ValueError, match="prefill_chunk must be a whole number of at least 1"):
        engine.step_batch([req], prefill_chunk=chunk)
    assert req.prefilled == 0
    engine.finish(req)


def test_a_short_sampled_draft_is_verified_so_n_min_keeps_the_target_law(tiny_model, tiny_hf_dir, monkeypatch):
    """--spec-draft-n-min dropped sampled drafts cut short by --spec-draft-p-min: whether a draft was verified
    then depended on the token it drew, and the law of the output moved off the target's (by 0.003 here).
    Every random draw enumerated, the law with the draft model is the plain one."""
    from helpers.distribution import generate_law, law_gap

    sampling = dict(temperature=0.1, top_k=4)
    plain, _ = generate_law(monkeypatch, Engine(tiny_model, max_len=64), [9, 10, 11], max_tokens=4, **sampling)
    spec = SpecConfig(drafters=("draft-simple",), draft_model=str(tiny_hf_dir), draft_n_max=2, draft_n_min=2,
                      draft_p_min=0.6)
    law, accepted = generate_law(monkeypatch, Engine(tiny_model, spec, max_len=64), [9, 10, 11], spec=spec,
                                 max_tokens=4, **sampling)
    assert accepted > 0.5  # the draft model drafted, and was accepted
    assert law_gap(law, plain) < 1e-9


def _forked(prompt: list[int], plain: list[int]):
    """A drafter of 2-deep trees: a wrong first sibling, then plain decoding's next two tokens."""
    from specdec.drafters.base import Draft, DrafterBase
    from specdec.verify.token_tree import TokenTree

    class Forked(DrafterBase):
        name = "forked"

        def propose(self, context, draft_length):
            done = len(context) - len(prompt)
            nxt = plain[done : done + 2]
            if len(nxt) < 2 or draft_length < 2:
                return Draft()
            return Draft(TokenTree(((nxt[0] + 1) % 100, nxt[0], nxt[1]), (-1, -1, 1)))

    return Forked()


def test_per_position_acceptance_counts_a_tree_s_depths_not_its_nodes(tiny_model):
    """A tree 2 deep of 3 nodes was counted as 3 positions, the last never accepted (0.00 in every report)."""
    prompt = [5, 6, 7, 8]
    plain = Engine(tiny_model, max_len=64).generate(prompt, SamplingParams(), max_tokens=12).token_ids
    engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",), draft_n_max=2), max_len=64,
                    drafter_factory=lambda kind, spec: _forked(prompt, plain))
    out = engine.generate(prompt, SamplingParams(), max_tokens=12)
    assert out.token_ids == plain
    stats = out.stats
    assert stats.drafted == 3 * stats.steps and stats.accepted == 2 * stats.steps
    assert stats.drafted_at == [stats.steps, stats.steps] and stats.per_position_acceptance == [1.0, 1.0]


def test_n_min_counts_a_tree_s_depth_and_an_unfitting_tree_gets_no_feedback(tiny_model):
    """A 1-deep tree of 3 siblings passed --spec-draft-n-min 2 (nodes were counted); a tree dropped for not
    fitting the context left its drafter told that none of it was accepted."""
    from specdec.drafters.base import Draft, DrafterBase
    from specdec.verify.token_tree import TokenTree

    class Wide(DrafterBase):
        name = "wide"

        def __init__(self, depth):
            self.depth, self.heard = depth, []

        def propose(self, context, draft_length):
            if draft_length < self.depth:
                return Draft()
            return Draft(TokenTree(tuple(range(5, 5 + 3 * self.depth)), tuple(
                p for d in range(self.depth) for p in ([-1, -1, -1] if d == 0 else [3 * d - 3] * 3))))

        def on_accept(self, num_accepted):
            self.heard.append(num_accepted)

    prompt = [5, 6, 7, 8]
    plain = Engine(tiny_model, max_len=64).generate(prompt, SamplingParams(), max_tokens=8).token_ids
    wide = Wide(1)
    engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",), draft_n_max=3, draft_n_min=2), max_len=64,
                    drafter_factory=lambda kind, spec: wide)
    out = engine.generate(prompt, SamplingParams(), max_tokens=8)
    assert out.token_ids == plain and out.stats.drafted == 0 and wide.heard == []
    deep = Wide(2)  # 6 nodes, 2 deep: passes n_min 2 where the context has room for them
    engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",), draft_n_max=3, draft_n_min=2), max_len=64,
                    drafter_factory=lambda kind, spec: deep)
    out = engine.generate(prompt, SamplingParams(), max_tokens=8)
    assert out.token_ids == plain and out.stats.drafted > 0 and len(deep.heard) == out.stats.steps
    near_end = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",), draft_n_max=3), max_len=12,
                      drafter_factory=lambda kind, spec: Wide(2))
    req = near_end.admit(prompt, SamplingParams(), 8)
    while not req.finished:
        near_end.step_batch([req])
    drafter = near_end.drafters_for(req.spec)[0]
    assert req.output == Engine(tiny_model, max_len=12).generate(prompt, SamplingParams(), max_tokens=8).token_ids
    assert len(drafter.heard) == req.stats.steps  # told only of the drafts it verified
    near_end.finish(req)


def test_adaptive_mode_reads_a_tree_s_acceptance_per_position(tiny_model, monkeypatch):
    """Adaptive mode took a tree's accepted path over its node count as the acceptance: a tree whose right
    pair always came with a wrong sibling looked 2/3 accepted, and a wider tree worse still, though every
    position it drafted was accepted; and it priced the tree's verify as a chain of its depth."""
    prompt = [5, 6, 7, 8]
    plain = Engine(tiny_model, max_len=64).generate(prompt, SamplingParams(), max_tokens=16).token_ids
    spec = SpecConfig(drafters=("ngram-simple",), draft_n_max=2, adaptive=True)
    engine = Engine(tiny_model, spec, max_len=64, drafter_factory=lambda kind, s: _forked(prompt, plain))
    # a fixed cost where 2-deep drafts pay: the measured one, on a busy machine, could pause drafting at once
    monkeypatch.setattr(engine, "forward_cost", lambda t: [0, 1.0, 1.05, 1.1, 1.15, 1.2])
    req = engine.admit(prompt, SamplingParams(), 16)
    while not req.finished:
        engine.step_batch([req])
    assert req.output == plain and req.stats.drafted > 0
    assert req.draft_policy.acceptance > 0.9  # every drafted position was accepted (per node it read 2/3)
    assert 1.3 < req.draft_policy.tree_width <= 1.5  # 3 nodes over 2 positions
    engine.finish(req)
