"""The prefix cache and logprobs through the API (tiny model, ngram-simple speculation, prefix cache "exact"):
usage.prompt_tokens_details.cached_tokens and /metrics count the reused rows, a warm answer is the cold one,
and logprobs on both endpoints are the plain engine's (no speculation) to the bit."""

from __future__ import annotations

import pytest
from conftest import _serve, scrape_metrics

from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams

HIT = "specdec_prefix_cache_hit_tokens_total"


@pytest.fixture(scope="module")
def served(tiny_model):
    engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",)), max_len=1024, max_sequences=2,
                    prefix_cache="exact")
    thread, served = _serve(engine, "tiny", None)
    yield served
    thread.stop()


@pytest.fixture(scope="module")
def plain(tiny_model):
    """The reference: no speculation, no reuse (a cold engine each time), exact prefill numerics."""
    def answer(ids: list[int], max_tokens: int, top: int | None = None):
        engine = Engine(tiny_model, max_len=1024, prefix_cache="exact")
        req = engine.admit(ids, SamplingParams(), max_tokens, logprobs=top)
        while not req.finished:
            engine.step_batch([req])
        engine.finish(req)
        return engine.result(req)
    return answer


def chat_ids(model, messages):
    tok = model.tokenizer
    return tok.encode(tok.apply_chat_template(messages), add_bos=False)


def test_a_later_turn_reuses_the_conversation_and_says_how_much(served, plain):
    client = served.client()
    messages = [{"role": "system", "content": "Answer briefly."},
                {"role": "user", "content": "What day is it?"}]
    for turn in range(3):
        before = scrape_metrics(served).get_value(HIT)
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
        cached = reply.usage.prompt_tokens_details.cached_tokens
        assert scrape_metrics(served).get_value(HIT) - before == cached
        ids = chat_ids(served.engine.model, messages)
        assert reply.usage.prompt_tokens == len(ids)
        assert (cached == 0) if turn == 0 else (previous <= cached < len(ids))  # the last prompt at least
        assert reply.choices[0].message.content == plain(ids, 8).text  # warm answer == cold answer
        previous = len(ids)
        messages += [{"role": "assistant", "content": reply.choices[0].message.content},
                     {"role": "user", "content": f"More {turn}?"}]


def test_chat_logprobs_are_the_plain_engines(served, plain):
    messages = [{"role": "user", "content": "Say hi"}]  # the tiny model's answer loops: drafts are accepted
    reply = served.client().chat.completions.create(model="tiny", messages=messages, max_tokens=40, temperature=0,
                                                     logprobs=True, top_logprobs=2)
    assert reply.spec["accepted"] > 0  # speculation ran on the server's side
    want = plain(chat_ids(served.engine.model, messages), 40, top=2)
    content = reply.choices[0].logprobs.content
    tok = served.engine.model.tokenizer
    assert [c.logprob for c in content] == [e.logprob for e in want.logprobs]
    assert [c.token for c in content] == [tok.decode([t]) for t in want.token_ids]
    assert [[(t.token, t.logprob) for t in c.top_logprobs] for c in content] == \
        [[(tok.decode([t]), lp) for t, lp in e.top] for e in want.logprobs]
    assert content[0].bytes == list(content[0].token.encode("utf-8"))


def test_completion_logprobs_are_the_plain_engines(served, plain):
    with served.http() as http:
        body = http.post("/v1/completions", json={"prompt": "Say hi", "max_tokens": 12, "temperature": 0,
                                                  "logprobs": 1}).json()
    tok = served.engine.model.tokenizer
    want = plain(tok.encode("Say hi"), 12, top=1)
    got = body["choices"][0]["logprobs"]
    assert got["token_logprobs"] == [e.logprob for e in want.logprobs]
    assert got["tokens"] == [tok.decode([t]) for t in want.token_ids]
    assert got["top_logprobs"] == [{tok.decode([e.top[0][0]]): e.top[0][1]} for e in want.logprobs]
    assert got["text_offset"] == [sum(len(t) for t in got["tokens"][:i]) for i in range(len(got["tokens"]))]


def test_no_logprobs_unless_asked(served):
    with served.http() as http:
        body = http.post("/v1/completions", json={"prompt": "Say hi", "max_tokens": 2}).json()
    assert body["choices"][0]["logprobs"] is None
