"""The prefix cache (engine/prefix_cache.py, cache/prefix.py) on tiny models: which slot a prompt takes, that
a warm answer is the answer the same cache state gives (speculative or plain), that mode "exact" makes it
the cold answer bitwise, and that a conversation's later turn prefills only what is new (a count of rows)."""

from __future__ import annotations

import pytest

from specdec.cache.prefix import Choice, PrefixIndex, common_prefix
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.engine.prefix_cache import PrefixCache
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

SYSTEM = list(range(5, 60))  # a shared "system prompt" of 55 tokens
LOOP = SpecConfig(drafters=("ngram-simple",))  # the tiny model's answers loop: ngram-simple's drafts are accepted


@pytest.fixture(scope="module")
def int8_model(tiny_hf_dir):
    """int8 weights: their prefill rows depend on how many rows a forward multiplies, so where a prompt is cut
    changes bits (fp32's tiny rows do not), which is what mode "exact" exists for."""
    return load_model(str(tiny_hf_dir), "int8", progress=False)


def run(engine: Engine, prompt: list[int], max_tokens: int = 12, spec=None, logprobs: int | None = 2):
    """(request, prefilled rows): the request run to its end, and how many prompt rows its forwards computed."""
    forward, rows = engine.model.transformer.forward_batch, []

    def counting(segments, cache, **kw):
        rows.extend(len(s.tokens) for s in segments if s.last_only)  # prefill segments (decode steps are not)
        return forward(segments, cache, **kw)

    engine.model.transformer.forward_batch = counting
    try:
        req = engine.admit(prompt, SamplingParams(), max_tokens, spec=spec, logprobs=logprobs)
        while not req.finished:
            engine.step_batch([req])  # the whole prompt (what the cache lacks of it) in one forward
        engine.finish(req)
    finally:
        del engine.model.transformer.forward_batch
    return req, sum(rows)


# -- the slot index ----------------------------------------------------------------------------------------
def test_common_prefix_counts_leading_equal_tokens_across_blocks():
    a = list(range(1000))
    assert common_prefix(a, a[:700] + [-1]) == 700 and common_prefix(a, [5]) == 0 and common_prefix(a, a) == 1000


def test_a_slot_holding_a_prefix_of_the_prompt_is_taken_as_it_is():
    index = PrefixIndex(3)
    index.remember(0, [1, 2, 3])
    index.remember(1, [9, 9])
    assert index.choose([1, 2, 3, 4, 5], [0, 1, 2], {}, limit=4) == Choice(0, 3)


def test_a_match_inside_a_longer_content_is_copied_and_the_content_kept():
    index = PrefixIndex(3)
    index.remember(0, [1, 2, 3, 7, 7])  # another conversation's branch: it stays for whoever continues it
    index.remember(1, [9])
    assert index.choose([1, 2, 3, 4], [0, 1, 2], {}, limit=3) == Choice(2, 3, source=0)  # the empty slot
    assert index.choose([1, 2, 3, 4], [0], {}, limit=3) == Choice(0, 3)  # the only free slot: overwritten


def test_the_limit_keeps_the_last_prompt_token_to_compute():
    index = PrefixIndex(1)
    index.remember(0, [1, 2, 3])
    assert index.choose([1, 2, 3], [0], {}, limit=2) == Choice(0, 2)


def test_eviction_takes_the_least_recently_ended_slot():
    index = PrefixIndex(3)
    for slot, tokens in ((2, [1]), (0, [2]), (1, [3])):
        index.remember(slot, tokens)
    assert index.choose([8, 8], [0, 1, 2], {}, limit=1) == Choice(2)
    index.forget(2)
    assert index.choose([8, 8], [0, 1, 2], {}, limit=1) == Choice(2)  # an empty slot before any content
    assert index.held() == 2


def test_a_running_sequence_shares_its_rows():
    index = PrefixIndex(2)
    assert index.choose([1, 2, 3, 4], [1], {0: [1, 2, 3]}, limit=3) == Choice(1, 3, source=0)


def test_a_bad_mode_is_refused(tiny_model):
    engine = Engine(tiny_model, max_len=64)
    with pytest.raises(ValueError, match="prefix cache mode must be one of off, on, exact, got 'sometimes'"):
        PrefixCache("sometimes", engine.cache)


# -- answers -----------------------------------------------------------------------------------------------
def test_warm_speculative_equals_warm_plain_with_the_same_cache_state(int8_model):
    """Under "on" a warm answer is fixed by the cache state: the same requests in the same order give it, and
    speculation on the warm request changes nothing (logprobs compared bitwise too)."""
    first, second = SYSTEM + [70, 71], SYSTEM + list(range(100, 130))
    answers = []
    for spec in (SpecConfig(), LOOP):
        engine = Engine(int8_model, max_len=256, max_sequences=2, prefix_cache="on")
        run(engine, first)
        req, prefilled = run(engine, second, max_tokens=30, spec=spec)  # the answer loops from token ~20
        assert req.cached_tokens == len(SYSTEM) and prefilled == len(second) - len(SYSTEM)
        answers.append((req.output, req.logprobs))
    assert answers[0] == answers[1]
    assert req.stats.accepted > 0  # the speculative run did accept drafts


def test_exact_mode_makes_a_warm_answer_the_cold_one_bitwise(int8_model):
    """Mode "exact" prefills with decode's numerics: the rows another request left, cut elsewhere, are the ones
    this request would compute, so its logprobs are the cold run's to the bit. (Under "on" they are not here:
    int8 prefill rows depend on the cut; the control below checks the test can tell.)"""
    prompt = SYSTEM + list(range(100, 130))
    got = {}
    for mode in ("on", "exact"):
        cold, _ = run(Engine(int8_model, max_len=256, max_sequences=2, prefix_cache=mode), prompt)
        engine = Engine(int8_model, max_len=256, max_sequences=2, prefix_cache=mode)
        run(engine, SYSTEM + [70, 71, 72])
        warm, _ = run(engine, prompt)
        assert warm.cached_tokens == len(SYSTEM) and cold.cached_tokens == 0
        got[mode] = (warm.output, warm.logprobs) == (cold.output, cold.logprobs)
    assert got == {"on": False, "exact": True}


def test_requests_running_together_share_a_prefix_exactly(int8_model):
    """The second request copies the system prompt's rows out of the first one's slot while it runs."""
    prompts = [SYSTEM + [70, 71, 72], SYSTEM + list(range(100, 120))]
    alone = [run(Engine(int8_model, max_len=256, prefix_cache="exact"), p)[0].output for p in prompts]
    engine = Engine(int8_model, max_len=256, max_sequences=2, prefix_cache="exact")
    a = engine.admit(prompts[0], SamplingParams(), 12, spec=LOOP)
    engine.step_batch([a])  # a's prompt is in its slot now
    b = engine.admit(prompts[1], SamplingParams(), 12)
    assert b.cached_tokens == len(SYSTEM) and b.slot != a.slot
    while not (a.finished and b.finished):
        engine.step_batch([a, b])
    assert [a.output, b.output] == alone


def test_an_agent_continuing_its_transcript_reuses_it_in_place(int8_model):
    """The next prompt is the last prompt, its answer and more: the slot is taken as it is, holding every row
    but the answer's last token's (never computed), and the answer is the cold one (mode "exact")."""
    engine = Engine(int8_model, max_len=256, max_sequences=2, prefix_cache="exact")
    first, _ = run(engine, SYSTEM + list(range(100, 130)), max_tokens=30, spec=LOOP)
    assert first.stats.accepted > 0 and first.finish_reason == "length"
    held = first.prompt + first.output[:-1]
    assert held in engine.prefix.index.tokens
    prompt = first.prompt + first.output + [70, 71]
    warm, prefilled = run(engine, prompt, spec=LOOP)
    cold, _ = run(Engine(int8_model, max_len=256, prefix_cache="exact"), prompt, spec=LOOP)
    assert warm.cached_tokens == len(held) and prefilled == 3
    assert (warm.output, warm.logprobs) == (cold.output, cold.logprobs)


def test_a_later_turn_of_a_five_turn_chat_prefills_only_what_is_new(tiny_model):
    """Each turn's prompt is the conversation so far: turn t reuses turn t-1's prompt and answer rows."""
    tok = tiny_model.tokenizer
    engine = Engine(tiny_model, max_len=512, max_sequences=2, prefix_cache="on")
    messages = [{"role": "system", "content": "You are a terse assistant for the build tool."}]
    for turn in range(5):
        messages.append({"role": "user", "content": f"Step {turn}: what next?"})
        prompt = tok.encode(tok.apply_chat_template(messages), add_bos=False)
        req, prefilled = run(engine, prompt, max_tokens=8, logprobs=None)
        cold, cold_prefilled = run(Engine(tiny_model, max_len=512), prompt, max_tokens=8, logprobs=None)
        assert req.output == cold.output and cold_prefilled == len(prompt)  # fp32 tiny: cuts change no bits
        if turn:
            assert prefilled == len(prompt) - req.cached_tokens < cold_prefilled
            assert req.cached_tokens >= len(previous)  # the whole previous prompt, and some of its answer
        messages.append({"role": "assistant", "content": tok.decode(req.output, True)})
        previous = prompt
    assert prefilled < len(prompt) // 2


def test_a_drafter_reading_hidden_states_starts_cold(tiny_model):
    class Hidden:  # what the engine reads of a drafter before it runs
        hidden_layers = (1,)

    engine = Engine(tiny_model, max_len=128, prefix_cache="on")
    run(engine, SYSTEM + [70])
    engine._pool.first = lambda spec: [Hidden()]  # as an MTP or EAGLE-3 drafter set would answer
    req, prefilled = run(engine, SYSTEM + [80], max_tokens=2)
    assert req.cached_tokens == 0 and prefilled == len(SYSTEM) + 1


def test_staggered_requests_in_chunked_prefill_give_their_cold_answers(int8_model):
    """Continuous batching as the server runs it: prompts prefilled 8 tokens a step, a request joining while
    others are still prefilling copies what their slots hold so far; every answer is its cold one ("exact")."""
    prompts = [SYSTEM + [70 + i] * (i + 1) + list(range(100 + i, 110)) for i in range(4)]
    cold = [run(Engine(int8_model, max_len=256, prefix_cache="exact"), p, max_tokens=8, logprobs=None)[0].output
            for p in prompts]
    engine = Engine(int8_model, max_len=256, max_sequences=3, prefix_cache="exact")
    waiting, running, answers, cached = list(enumerate(prompts)), [], {}, {}
    while waiting or running:
        if waiting and len(running) < 3:  # one joins per step, between the others' chunks
            i, prompt = waiting.pop(0)
            req = engine.admit(prompt, SamplingParams(), 8, spec=LOOP)
            running.append((i, req))
            cached[i] = req.cached_tokens
        engine.step_batch([r for _, r in running], prefill_chunk=8)
        for i, req in [x for x in running if x[1].finished]:
            engine.finish(req)
            answers[i] = req.output
            running.remove((i, req))
    assert [answers[i] for i in range(4)] == cold
    assert 0 < cached[1] < len(SYSTEM) and all(cached[i] >= 8 for i in (1, 2, 3))  # copied mid-prefill
