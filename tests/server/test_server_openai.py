"""The server through the official `openai` client on smollm2-135m: greedy text through HTTP equals
Engine.generate with the same prompt ids and settings, with speculation on (ngram-simple) and off,
streamed and not, for completions and chat."""

from __future__ import annotations

import pytest

from specdec.engine.config import SpecConfig
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.slow

NGRAM = SpecConfig(drafters=("ngram-simple",))  # what the test server runs
# repetitive text, so ngram-simple drafts (and its drafts get accepted) within a few tokens
PROMPT = "List the days of the week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Again: Monday,"
MESSAGES = [{"role": "user", "content": "Repeat exactly: red, green, blue, red, green, blue, red, green, blue"}]
N = 12


def test_completion_greedy_equals_engine_with_and_without_speculation(smollm_server, reference):
    client = smollm_server.client()
    on = client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0)
    off = client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0,
                                    extra_body={"speculative": {"enabled": False}})
    ids = reference.prompt_ids(PROMPT)
    expected_on = reference.generate(ids, N, spec=NGRAM)
    expected_off = reference.generate(ids, N)
    assert on.choices[0].text == expected_on.text
    assert off.choices[0].text == expected_off.text
    assert on.choices[0].text == off.choices[0].text  # greedy speculation is lossless
    assert on.choices[0].finish_reason == expected_on.finish_reason
    assert on.object == "text_completion" and on.model == "smollm2-135m"

    spec_on, spec_off = on.model_extra["spec"], off.model_extra["spec"]
    timed = ("draft_s", "verify_s", "rollback_s", "verdict")  # seconds, and the verdict judged from them
    counts = {k: v for k, v in expected_on.stats.to_dict().items() if k not in timed}
    assert {k: v for k, v in spec_on.items() if k not in timed} == counts
    assert set(spec_on["verdict"]) == set(expected_on.stats.verdict().to_dict())
    assert spec_on["method"] == "ngram-simple" and spec_on["engaged"] and spec_on["drafted"] > 0
    assert spec_on["accepted"] > 0 and spec_on["acceptance_rate"] == spec_on["accepted"] / spec_on["drafted"]
    assert spec_off["method"] == "none" and not spec_off["configured"] and not spec_off["engaged"]
    assert spec_off["drafted"] == 0

    for resp, expected in ((on, expected_on), (off, expected_off)):
        assert resp.usage.prompt_tokens == len(ids)
        assert resp.usage.completion_tokens == len(expected.token_ids)
        assert resp.usage.total_tokens == len(ids) + len(expected.token_ids)


def test_chat_greedy_equals_engine(smollm_server, reference):
    client = smollm_server.client()
    resp = client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=N, temperature=0)
    ids = reference.chat_ids(MESSAGES)
    expected = reference.generate(ids, N, spec=NGRAM)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == expected.text
    assert resp.choices[0].finish_reason == expected.finish_reason
    assert resp.usage.prompt_tokens == len(ids) and resp.usage.completion_tokens == len(expected.token_ids)
    assert resp.model_extra["spec"]["drafted"] == expected.stats.drafted
    assert resp.model_extra["spec"]["accepted"] == expected.stats.accepted


def test_completion_stream_equals_engine_and_ends_with_stats(smollm_server, reference):
    client = smollm_server.client()
    chunks = list(client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0,
                                            stream=True))
    expected = reference.generate(reference.prompt_ids(PROMPT), N, spec=NGRAM)
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    assert len([c for c in chunks if c.choices[0].text]) > 1  # really streamed, not one piece at the end
    last = chunks[-1]
    assert last.choices[0].finish_reason == expected.finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert last.model_extra["spec"]["drafted"] == expected.stats.drafted > 0
    assert all(c.usage is None for c in chunks)  # usage only when include_usage asks, as OpenAI does


def test_chat_stream_speculation_off_equals_engine_with_include_usage(smollm_server, reference):
    client = smollm_server.client()
    stream = client.chat.completions.create(model="smollm2-135m", messages=MESSAGES, max_tokens=N, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"speculative": {"enabled": False}})
    chunks = list(stream)
    expected = reference.generate(reference.chat_ids(MESSAGES), N)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == expected.finish_reason
    usage_only = chunks[-1]  # OpenAI's include_usage chunk: no choices, usage set
    assert usage_only.choices == [] and usage_only.usage.completion_tokens == len(expected.token_ids)
    assert usage_only.usage.prompt_tokens == expected.prompt_tokens
    assert usage_only.model_extra["spec"]["configured"] is False
    assert finish[0].usage is None  # once: a client summing usage over chunks counts it once


def test_usage_counts_the_eos_that_ended_the_answer(smollm_server, reference):
    """As vLLM and llama-server count it: completion_tokens is every token the model generated, the EOS
    that ended the answer included, though the text and token_ids leave it out."""
    client = smollm_server.client()
    messages = [{"role": "user", "content": "What is 2+2?"}]
    expected = reference.generate(reference.chat_ids(messages), 32, spec=NGRAM)
    assert expected.finish_reason == "stop" and expected.ended_on_eos  # an EOS, not max_tokens, ended it
    assert expected.completion_tokens == len(expected.token_ids) + 1
    resp = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=32, temperature=0)
    assert resp.choices[0].message.content == expected.text and resp.choices[0].finish_reason == "stop"
    assert resp.usage.completion_tokens == len(expected.token_ids) + 1
    assert resp.usage.total_tokens == expected.prompt_tokens + len(expected.token_ids) + 1
    chunks = list(client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=32,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids) + 1


def test_override_draft_length_and_method(smollm_server, reference):
    client = smollm_server.client()
    resp = client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0,
                                     extra_body={"speculative": {"method": "ngram", "num_speculative_tokens": 5}})
    spec5 = SpecConfig(drafters=("ngram-simple",), draft_n_max=5)
    expected = reference.generate(reference.prompt_ids(PROMPT), N, spec=spec5)
    assert resp.choices[0].text == expected.text
    stats = resp.model_extra["spec"]
    assert stats["method"] == "ngram-simple"
    assert stats["drafted"] == expected.stats.drafted > 0
    assert len(stats["per_position_acceptance"]) > 3  # drafts longer than the server's default 3


def test_stop_string_streamed_and_not(smollm_server, reference):
    client = smollm_server.client()
    stop = [" Friday"]
    full = client.completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0, stop=stop)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="smollm2-135m", prompt=PROMPT, max_tokens=N, temperature=0, stop=stop, stream=True))
    expected = reference.generate(reference.prompt_ids(PROMPT), N, spec=NGRAM, stop=stop)
    assert expected.finish_reason == "stop" and "Friday" not in expected.text  # the stop string was hit
    assert full.choices[0].text == streamed == expected.text
    assert full.choices[0].finish_reason == "stop"


def test_seeded_sampling_is_reproducible_and_equals_engine(smollm_server, reference):
    client = smollm_server.client()
    kwargs = dict(model="smollm2-135m", prompt="Once upon a time", max_tokens=8, temperature=0.9, top_p=0.95,
                  seed=1234, extra_body={"top_k": 50, "min_p": 0.01})
    a = client.completions.create(**kwargs)
    b = client.completions.create(**kwargs)
    sampling = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, min_p=0.01, seed=1234)
    expected = reference.generate(reference.prompt_ids("Once upon a time"), 8, spec=NGRAM, sampling=sampling)
    plain = reference.generate(reference.prompt_ids("Once upon a time"), 8, sampling=sampling)
    assert a.choices[0].text == b.choices[0].text == expected.text == plain.text  # one-hot drafts: plain's draws


def test_prompt_as_token_ids(smollm_server, reference):
    ids = reference.prompt_ids(PROMPT)
    resp = smollm_server.client().completions.create(model="smollm2-135m", prompt=ids, max_tokens=4, temperature=0)
    assert resp.choices[0].text == reference.generate(ids, 4, spec=NGRAM).text


def test_models_and_health(smollm_server):
    client = smollm_server.client()
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2-135m"]
    assert client.models.retrieve("smollm2-135m").id == "smollm2-135m"
    with smollm_server.http() as http:
        health = http.get("/health")
        assert health.status_code == 200 and health.json()["status"] == "ok"
