"""Fast checks of the server's parts, on the tiny random model: API keys, overrides, text deltas,
the scheduler's batching, queue limit, timeout and cancel flag, and the `specdec serve` wiring."""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import openai
import pytest

from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams
from specdec.server.app import MAX_BODY_BYTES
from specdec.server.overrides import resolve_spec
from specdec.server.schemas import APIError, SpeculativeOverride
from specdec.server.scheduler import QueueFull, Scheduler
from specdec.model.text_stream import TextStream
from specdec.server.jobs import Delta, Done, Failed, Job

CHAT = [{"role": "user", "content": "Hi"}]


def assert_401(response):
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_api_key"


def alone(model, ids, max_tokens):
    """The greedy answer a second Engine on the server's model gives these ids (call it while the server idles)."""
    return Engine(model, max_len=256).generate(ids, SamplingParams(), max_tokens)


def chat_ids(model, messages):
    tok = model.tokenizer
    return tok.encode(tok.apply_chat_template(messages), add_bos=False)


# -- API key -----------------------------------------------------------------------------------
def test_api_key_wrong_or_missing_is_401_then_served(tiny_server):
    from openai import OpenAI

    key = tiny_server.api_key
    wrong = OpenAI(base_url=tiny_server.base_url + "/v1", api_key="wrong-key", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as err:
        wrong.completions.create(model="tiny", prompt="hello", max_tokens=2)
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    resp = tiny_server.client().completions.create(model="tiny", prompt="hello", max_tokens=2, temperature=0)
    assert resp.usage.completion_tokens >= 1
    with tiny_server.http() as http:
        assert_401(http.get("/v1/models"))
        assert_401(http.post("/v1/chat/completions", json={"messages": CHAT}))
        assert_401(http.get("/v1/models", headers={"Authorization": f"Bearer {key}x"}))
        assert_401(http.get("/v1/models", headers={"Authorization": key}))  # no "Bearer "
        # the key is checked before the body is read
        assert_401(http.post("/v1/completions", content=b"{bad", headers={"content-type": "application/json"}))
        assert http.get("/v1/models", headers={"Authorization": f"Bearer {key}"}).status_code == 200
        for header in ({"Authorization": f"bearer {key}"}, {"Authorization": f"BEARER  {key}"}, {"X-Api-Key": key}):
            assert http.get("/v1/models", headers=header).status_code == 200, header  # RFC 7235; llama.cpp's
        assert_401(http.get("/v1/models", headers={"X-Api-Key": key + "x"}))
        assert_401(http.get("/v1/models", headers={"Authorization": f"Basic {key}", "X-Api-Key": key}))
        assert http.get("/v1/models").headers["www-authenticate"] == "Bearer"
        assert http.get("/health").status_code == 200  # /health and /metrics need no key
        assert http.get("/metrics").status_code == 200
    resp = tiny_server.client().chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, temperature=0)
    ref = alone(tiny_server.engine.model, chat_ids(tiny_server.engine.model, CHAT), 2)
    assert (resp.choices[0].message.content, resp.choices[0].finish_reason, resp.usage.completion_tokens) == \
        (ref.text, ref.finish_reason, ref.completion_tokens)


def test_protocol_edges_are_openai_shaped(tiny_server):
    """HEAD on the GET routes; a stream carries usage only when include_usage asks (once); stream_options
    without a stream is a 400; a lone surrogate quoted in an error message, and a body that is not UTF-8,
    are 4xx errors in OpenAI's shape, not 500s."""
    auth = {"Authorization": f"Bearer {tiny_server.api_key}"}
    body = {"prompt": "hello", "max_tokens": 3, "temperature": 0, "stream": True}

    def stream_chunks(http, extra):
        response = http.post("/v1/completions", json={**body, **extra}, headers=auth)
        assert response.status_code == 200, response.text
        lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        return [json.loads(line) for line in lines[:-1]]

    with tiny_server.http() as http:
        for path in ("/health", "/v1/models", "/v1/models/tiny"):
            response = http.head(path, headers=auth)
            assert response.status_code == 200 and response.content == b"", path
        plain = stream_chunks(http, {})
        assert all("usage" not in c for c in plain) and "spec" in plain[-1]
        counted = stream_chunks(http, {"stream_options": {"include_usage": True}})
        with_usage = [c for c in counted if c.get("usage")]
        assert len(with_usage) == 1 and with_usage[0]["choices"] == [] and with_usage[0] is counted[-1]
        assert with_usage[0]["usage"]["completion_tokens"] == 3
        error = http.post("/v1/completions", json={"prompt": "hi", "stream_options": {"include_usage": True}},
                          headers=auth)
        assert error.status_code == 400 and error.json()["error"]["param"] == "stream_options"
        error = http.post("/v1/completions", content=b'{"model": "x\\ud800", "prompt": "hi"}',
                          headers={**auth, "content-type": "application/json"})
        assert error.status_code == 404 and error.json()["error"]["code"] == "model_not_found"
        assert "\\ud800" in error.text  # escaped, so the body is valid UTF-8
        error = http.post("/v1/completions", content=b'{"prompt": "caf\xe9"}',
                          headers={**auth, "content-type": "application/json"})
        assert error.status_code == 400 and error.json()["error"]["code"] == "invalid_json"
        error = http.post("/v1/completions", content=b"", headers={**auth, "content-type": "application/json"})
        assert error.status_code == 400 and error.json()["error"]["code"] == "invalid_type"
        error = http.post("/v1/completions", content=b'{"prompt": "' + b"a" * MAX_BODY_BYTES + b'"}',
                          headers={**auth, "content-type": "application/json"})
        assert error.status_code == 413 and error.json()["error"]["code"] == "request_too_large"
        chunked = iter([b'{"prompt": "'] + [b"a" * 2**20] * (MAX_BODY_BYTES // 2**20 + 1) + [b'"}'])
        error = http.post("/v1/completions", content=chunked, headers={**auth, "content-type": "application/json"})
        assert error.status_code == 413 and error.json()["error"]["code"] == "request_too_large"
        assert http.get("/health").json()["status"] == "ok"  # and the server goes on


# -- speculative overrides -----------------------------------------------------------------------
NGRAM = SpecConfig(drafters=("ngram-simple",))


def test_overrides_resolve_into_spec_configs():
    assert resolve_spec(NGRAM, None) is NGRAM
    assert resolve_spec(NGRAM, SpeculativeOverride()) == NGRAM
    assert resolve_spec(NGRAM, SpeculativeOverride(enabled=False)).types == ()
    assert resolve_spec(NGRAM, SpeculativeOverride(enabled=True)) == NGRAM
    assert resolve_spec(NGRAM, SpeculativeOverride(num_speculative_tokens=5)) == NGRAM.with_overrides(draft_n_max=5)
    assert resolve_spec(NGRAM, SpeculativeOverride(method="suffix", num_speculative_tokens=2)) == \
        SpecConfig(drafters=("suffix",), draft_n_max=2)
    assert resolve_spec(SpecConfig(), SpeculativeOverride(spec_type="ngram-simple,suffix")).types == \
        ("ngram-simple", "suffix")
    served_draft = SpecConfig(drafters=("draft-simple",), draft_model="small")
    assert resolve_spec(served_draft, SpeculativeOverride(method="draft_model")) == served_draft
    assert resolve_spec(served_draft, SpeculativeOverride(method="ngram")).types == ("ngram-simple",)
    served_mtp = SpecConfig(drafters=("draft-mtp",))  # a model drafter the server runs may be tuned per request
    assert resolve_spec(served_mtp, SpeculativeOverride(num_speculative_tokens=1)).draft_n_max == 1
    assert resolve_spec(served_mtp, SpeculativeOverride(method="mtp")).types == ("draft-mtp",)
    served_head = SpecConfig(drafters=("suffix", "draft-eagle3"), draft_model="/heads/e3")  # started with -md
    for override in (SpeculativeOverride(method="eagle3"), SpeculativeOverride(spec_type="draft-eagle3"),
                     SpeculativeOverride(num_speculative_tokens=2)):
        assert resolve_spec(served_head, override).draft_model == "/heads/e3"  # was None: the default head


@pytest.mark.parametrize("base, override", [
    (NGRAM, SpeculativeOverride(method="draft_model", model="other")),  # a draft model that is not loaded
    (NGRAM, SpeculativeOverride(method="draft_model")),  # no draft model loaded at all
    (SpecConfig(drafters=("draft-simple",), draft_model="small"), SpeculativeOverride(model="other")),
    (NGRAM, SpeculativeOverride(method="mtp")),
    (SpecConfig(drafters=("draft-mtp",)), SpeculativeOverride(method="eagle3")),
    (NGRAM, SpeculativeOverride(spec_type="draft-eagle3")),
    (NGRAM, SpeculativeOverride(method="nope")),
    (NGRAM, SpeculativeOverride(num_speculative_tokens=0)),
    (NGRAM, SpeculativeOverride(draft_n_min=5)),  # larger than the draft length 3
    (NGRAM, SpeculativeOverride(enabled=False, method="ngram")),
    (SpecConfig(), SpeculativeOverride(num_speculative_tokens=4)),  # nothing to tune: name a method
    (SpecConfig(), SpeculativeOverride(enabled=True)),
    (NGRAM, SpeculativeOverride(spec_type="none", num_speculative_tokens=5)),  # was 200, the 5 dropped
    (NGRAM, SpeculativeOverride(method="ngram", draft_p_min=0.5)),  # n-gram drafts have no confidence
    (NGRAM, SpeculativeOverride(draft_p_min=0.5)),
    (NGRAM, SpeculativeOverride(spec_type="auto")),
])
def test_overrides_the_server_cannot_honour_are_400(base, override):
    with pytest.raises(APIError) as err:
        resolve_spec(base, override)
    assert err.value.status == 400 and err.value.param == "speculative"


# -- text deltas ----------------------------------------------------------------------------------
class CharTokenizer:
    """Token i is chr(i)."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)

    def token_text(self, token_id):
        return None


class ByteTokenizer:
    """Token i is byte i, decoded as UTF-8 with U+FFFD for what is not a whole character."""

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")

    def token_text(self, token_id):
        return None


def test_text_stream_never_takes_back_what_it_sent():
    tok = CharTokenizer()
    ids = [ord(c) for c in "abc STOP def"]
    stream = TextStream(tok, ("STOP",))
    sent = "".join(stream.advance(ids[:n]) for n in range(1, 5))  # "abc " so far; "STOP" may still start
    assert sent == "a"  # 3 characters (len("STOP") - 1) held back
    assert sent + stream.finish("abc ") == "abc "
    plain = TextStream(ByteTokenizer(), ())
    e_acute = list("é".encode())
    assert plain.advance([ord("w")]) == "w"
    assert plain.advance([ord("w"), ord("x"), e_acute[0]]) == ""  # the step's text waits for its last character
    assert plain.advance([ord("w"), ord("x"), *e_acute, ord("y")]) == "xéy"
    assert plain.finish("wxéyz") == "z"


# -- the scheduler --------------------------------------------------------------------------------
def run_jobs(scheduler, jobs_spec, cancel=(), spec=SpecConfig()):
    """Submit jobs at once; returns [(job index, Done, streamed text)] in the order they finished."""

    async def main():
        loop = asyncio.get_running_loop()
        jobs = [Job(prompt, SamplingParams(), n, (), spec, stream=True, endpoint="completions", loop=loop)
                for prompt, n in jobs_spec]
        for i in cancel:
            jobs[i].cancel()
        for job in jobs:
            scheduler.submit(job)
        finished = []

        async def drain(i, job):
            deltas = []
            while True:
                event = await asyncio.wait_for(job.events.get(), 60)
                if isinstance(event, Done):
                    finished.append((i, event, "".join(deltas)))
                    return
                assert isinstance(event, Delta)
                deltas.append(event.text)

        await asyncio.gather(*(drain(i, j) for i, j in enumerate(jobs)))
        return finished

    return asyncio.run(main())


@pytest.mark.parametrize("spec", [SpecConfig(), SpecConfig(drafters=("suffix",))], ids=["plain", "suffix"])
def test_batched_jobs_give_their_solo_answers_and_a_cancelled_one_is_skipped(tiny_model, spec):
    """Five jobs through a batch of 3 (so they join as others finish), prompts longer than the
    prefill chunk: each streams exactly what it gives alone; the cancelled one runs no step."""
    engine = Engine(tiny_model, spec, max_len=128, max_sequences=3)
    scheduler = Scheduler(engine, prefill_chunk=4)
    work = [([5, 6, 7, 8, 9, 10, 11], 6), ([8, 9], 3), ([10], 4), ([11, 12, 13, 14, 15], 9), ([3, 4, 5], 12)]
    try:
        finished = run_jobs(scheduler, work, cancel=[2], spec=spec)
    finally:
        scheduler.stop()
    by_index = {i: (done, text) for i, done, text in finished}
    assert by_index[2][0].finish_reason == "cancelled" and by_index[2][0].completion_tokens == 0
    for i, (prompt, n) in enumerate(work):
        if i == 2:
            continue
        done, streamed = by_index[i]
        expected = Engine(tiny_model, spec, max_len=128).generate(prompt, SamplingParams(), n)
        assert streamed + done.text == expected.text
        assert done.completion_tokens == len(expected.token_ids)
    assert sorted(engine.cache.free_slots) == [0, 1, 2]  # every slot released


def test_scheduler_stops_a_cancelled_job_between_steps(tiny_model):
    engine = Engine(tiny_model, max_len=256, max_sequences=2)
    scheduler = Scheduler(engine)

    async def main():
        job = Job([5, 6, 7], SamplingParams(), 200, (), SpecConfig(), stream=True, endpoint="completions",
                  loop=asyncio.get_running_loop())
        scheduler.submit(job)
        first = await asyncio.wait_for(job.events.get(), 60)
        assert isinstance(first, Delta)
        job.cancel()
        while True:
            event = await asyncio.wait_for(job.events.get(), 60)
            if isinstance(event, Done):
                return event

    try:
        done = asyncio.run(main())
    finally:
        scheduler.stop()
    assert done.finish_reason == "cancelled" and done.completion_tokens < 200
    assert sorted(engine.cache.free_slots) == [0, 1]


def test_a_full_queue_refuses_and_loses_nothing(tiny_model):
    """max_batch 1 + max_queue 1: a third request is refused at once; the two taken are answered."""
    engine = Engine(tiny_model, max_len=256)
    scheduler = Scheduler(engine, max_batch=1, max_queue=1)

    async def main():
        loop = asyncio.get_running_loop()
        jobs = [Job([5, 6, 7], SamplingParams(), n, (), SpecConfig(), stream=False, endpoint="completions",
                    loop=loop) for n in (40, 3, 3)]
        scheduler.submit(jobs[0])
        scheduler.submit(jobs[1])
        with pytest.raises(QueueFull, match="busy"):
            scheduler.submit(jobs[2])
        return [await asyncio.wait_for(_last_event(j), 60) for j in jobs[:2]]

    try:
        done = asyncio.run(main())
    finally:
        scheduler.stop()
    assert [d.finish_reason for d in done] == ["length", "length"]
    assert scheduler.metrics.rejected._value.get() == 1


def test_a_client_that_gives_up_while_queued_frees_its_place_at_once(tiny_model):
    """max_batch 1 + max_queue 1, the running job held inside its step: a queued job whose client went
    away is answered "cancelled" and leaves the queue when the next request comes, which is taken (it was
    a 503 until the running job ended), and /health's count drops with it."""
    import threading

    engine = Engine(tiny_model, max_len=256)
    scheduler = Scheduler(engine, max_batch=1, max_queue=1)
    gate, stepping, real_step = threading.Event(), threading.Event(), engine.step_batch

    def held_step(*args, **kwargs):
        stepping.set()
        gate.wait(60)
        return real_step(*args, **kwargs)

    engine.step_batch = held_step

    async def main():
        loop = asyncio.get_running_loop()
        running, gone, late = (Job([5, 6, 7], SamplingParams(), 3, (), SpecConfig(), stream=False,
                                   endpoint="completions", loop=loop) for _ in range(3))
        scheduler.submit(running)
        assert await asyncio.to_thread(stepping.wait, 60)
        scheduler.submit(gone)
        assert (scheduler.running, scheduler.waiting) == (1, 1)
        gone.cancel()
        scheduler.submit(late)  # QueueFull before
        assert scheduler.waiting == 1 and scheduler.metrics.queued._value.get() == 1
        gone_done = await asyncio.wait_for(_last_event(gone), 60)
        gate.set()
        return gone_done, [await asyncio.wait_for(_last_event(j), 60) for j in (running, late)]

    try:
        gone_done, done = asyncio.run(main())
    finally:
        gate.set()
        scheduler.stop()
    assert gone_done.finish_reason == "cancelled" and gone_done.completion_tokens == 0
    assert [d.finish_reason for d in done] == ["length", "length"]
    assert scheduler.metrics.rejected._value.get() == 0


def test_shutdown_answers_every_request_in_flight(tiny_model):
    """SIGINT/SIGTERM (should_exit) with a stream and a plain request running and one queued: the queued one
    gets a 503 at once, the running ones a 503 in OpenAI's shape (the stream: an error event, then [DONE])
    when the grace period runs out. uvicorn had cancelled them: a plain-text 500 and a stream cut mid-body."""
    import threading

    import httpx

    from conftest import ServerThread
    from specdec.server.app import create_app

    engine = Engine(tiny_model, max_len=256, max_sequences=2)
    real_step = engine.step_batch

    def slow_step(*args, **kwargs):  # 20 tokens a second: the 200 asked for outlast the grace period
        time.sleep(0.05)
        return real_step(*args, **kwargs)

    engine.step_batch = slow_step
    app = create_app(engine, "tiny", max_batch=2)
    server = ServerThread(app, grace=2.0)
    base = server.start()
    answers = {}

    def ask(name, stream):
        body = {"prompt": "hello", "max_tokens": 200, "temperature": 0, "stream": stream}
        with httpx.Client(base_url=base, timeout=30) as http:
            answers[name] = http.post("/v1/completions", json=body)

    threads = [threading.Thread(target=ask, args=a) for a in (("stream", True), ("plain", False))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while app.state.worker.running < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    queued = threading.Thread(target=ask, args=("queued", False))
    queued.start()
    while app.state.worker.waiting < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    server.server.should_exit = True
    for t in threads + [queued]:
        t.join(30)
    server.thread.join(30)
    server.sock.close()
    for name in ("queued", "plain"):
        assert answers[name].status_code == 503, (name, answers[name].text)
        assert answers[name].json()["error"]["code"] in ("cancelled", "server_stopping")
    assert answers["queued"].json()["error"]["code"] == "cancelled"  # at once, not after the grace period
    lines = [line for line in answers["stream"].text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["error"]["code"] == "server_stopping"
    assert len(lines) > 3  # it streamed before the end


def test_a_request_past_the_timeout_fails_and_frees_its_slot(tiny_model):
    engine = Engine(tiny_model, max_len=256)
    scheduler = Scheduler(engine, request_timeout=1e-6)

    async def main():
        job = Job([5, 6, 7], SamplingParams(), 100, (), SpecConfig(), stream=False, endpoint="completions",
                  loop=asyncio.get_running_loop())
        scheduler.submit(job)
        return await asyncio.wait_for(_last_event(job), 60)

    try:
        event = asyncio.run(main())
    finally:
        scheduler.stop()
    assert isinstance(event, Failed) and isinstance(event.error, TimeoutError)
    assert engine.cache.free_slots == [0]


def test_a_failed_step_is_a_server_error_not_a_bad_request(tiny_model, monkeypatch):
    """An exception inside a batched step fails the requests that ran in it with a 500 naming the cause
    (a ValueError from deep in a step used to become a 400 blaming the client), frees their slots, and
    the server goes on serving the next request."""
    from specdec.server.errors import as_api_error

    engine = Engine(tiny_model, max_len=256)
    scheduler = Scheduler(engine)
    real_step = engine.step_batch
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("shapes do not match")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(engine, "step_batch", failing_once)

    async def main():
        events = []
        for _ in range(2):
            job = Job([5, 6, 7], SamplingParams(), 4, (), SpecConfig(), stream=False, endpoint="completions",
                      loop=asyncio.get_running_loop())
            scheduler.submit(job)
            events.append(await asyncio.wait_for(_last_event(job), 60))
        return events

    try:
        failed, served = asyncio.run(main())
    finally:
        scheduler.stop()
    assert isinstance(failed, Failed)
    error = as_api_error(failed.error)
    assert error.status == 500 and error.code == "internal_error"
    assert "ValueError: shapes do not match" in str(error.message)
    assert isinstance(served, Done) and served.completion_tokens == 4
    assert engine.cache.free_slots == [0]


def test_one_request_s_text_failing_fails_it_alone(tiny_model, monkeypatch):
    """A request whose text could not be decoded after a step (StreamDecoder's RuntimeError) failed every
    request of the batch; now it alone gets the error and the others finish as they would."""
    import specdec.server.scheduler as sched
    from specdec.model.text_stream import TextStream

    class Failing(TextStream):
        def advance(self, output):
            if self.hold == len("boom") - 1:  # the request with stop=("boom",)
                raise RuntimeError("the tokenizer's decoding of this output changed text already settled")
            return super().advance(output)

    monkeypatch.setattr(sched, "TextStream", Failing)
    engine = Engine(tiny_model, max_len=256, max_sequences=2)
    scheduler = Scheduler(engine)
    expected = Engine(tiny_model, max_len=256).generate([5, 6, 7], SamplingParams(), 8)

    async def main():
        loop = asyncio.get_running_loop()
        bad = Job([5, 6, 7], SamplingParams(), 8, ("boom",), SpecConfig(), stream=True, endpoint="completions",
                  loop=loop)
        good = Job([5, 6, 7], SamplingParams(), 8, (), SpecConfig(), stream=True, endpoint="completions", loop=loop)
        scheduler.submit(bad)
        scheduler.submit(good)
        return await asyncio.wait_for(asyncio.gather(_last_event(bad), _last_event(good)), 60)

    try:
        failed, done = asyncio.run(main())
    finally:
        scheduler.stop()
    assert isinstance(failed, Failed) and "changed text already settled" in str(failed.error)
    assert isinstance(done, Done) and done.completion_tokens == expected.completion_tokens
    assert sorted(engine.cache.free_slots) == [0, 1]


async def _last_event(job):
    while True:
        event = await job.events.get()
        if isinstance(event, (Done, Failed)):
            return event


def test_draft_budget_shrinks_drafts_when_rows_cost_more_than_they_return(tiny_model):
    """With a flat forward cost every row pays and each sequence keeps its draft length; with a
    cost growing faster than acceptance returns, drafts go first to the sequences that accept more."""
    engine = Engine(tiny_model, SpecConfig(drafters=("suffix",), draft_n_max=4), max_len=64, max_sequences=2)
    scheduler = Scheduler(engine)
    a, b = engine.admit([1, 2, 3]), engine.admit([4, 5, 6])
    a.prefilled, b.prefilled = 3, 3  # as if prefilled: the budget only reads the counters
    a.draft_policy.acceptance, b.draft_policy.acceptance = 0.9, 0.3
    engine._forward_cost = [0.0] + [1.0] * 12  # flat
    assert scheduler.draft_caps([a, b]) == [4, 4]
    engine._forward_cost = [0.0] + [1.0 + 0.5 * t for t in range(12)]  # each row costs half a forward
    caps = scheduler.draft_caps([a, b])
    assert caps[0] > caps[1] and sum(caps) < 8
    engine.finish(a), engine.finish(b)


def test_skip_special_tokens_false_keeps_their_text(tiny_server):
    """vLLM's skip_special_tokens: false was refused; the text now holds the special tokens' text, streamed
    or not, where the default leaves it out."""
    client = tiny_server.client()
    for seed in range(40):  # a sampled answer with a special token in it (the tiny model is random)
        kept = client.completions.create(model="tiny", prompt="hello", max_tokens=30, temperature=1.5, seed=seed,
                                         extra_body={"skip_special_tokens": False})
        if "<|" in kept.choices[0].text:
            break
    else:
        raise AssertionError("no seed gave a special token")
    plain = client.completions.create(model="tiny", prompt="hello", max_tokens=30, temperature=1.5, seed=seed)
    assert "<|" not in plain.choices[0].text and plain.choices[0].text != kept.choices[0].text
    streamed = client.completions.create(model="tiny", prompt="hello", max_tokens=30, temperature=1.5, seed=seed,
                                         stream=True, extra_body={"skip_special_tokens": False})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == kept.choices[0].text


def test_prompt_and_completion_may_fill_the_context(tiny_server):
    """As vLLM's max_model_len: prompt + max_tokens up to the context is served (one token short was a 400
    that blamed the client), one more is refused."""
    client = tiny_server.client()
    prompt = list(range(5, 5 + 200))  # token ids; the context is 256
    resp = client.completions.create(model="tiny", prompt=prompt, max_tokens=56, temperature=0,
                                     extra_body={"speculative": {"enabled": False}})
    ref = alone(tiny_server.engine.model, prompt, 56)
    assert resp.usage.prompt_tokens == 200
    assert (resp.choices[0].text, resp.choices[0].finish_reason, resp.usage.completion_tokens) == \
        (ref.text, ref.finish_reason, ref.completion_tokens)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt=prompt, max_tokens=57, temperature=0)
    assert err.value.code == "context_length_exceeded" and "you requested 257 tokens" in err.value.message


def test_a_prompt_past_the_context_is_refused_while_others_stream(tiny_server):
    """A too-long prompt sent while a stream runs gets its 400; the running stream is not disturbed."""
    client = tiny_server.client()
    stream = client.completions.create(model="tiny", prompt="hello", max_tokens=200, temperature=0, stream=True)
    chunks = iter(stream)
    first = next(chunks)  # the stream is running
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="hello " * 400, max_tokens=4, temperature=0)
    assert err.value.code == "context_length_exceeded"
    rest = list(chunks)
    text = first.choices[0].text + "".join(c.choices[0].text for c in rest if c.choices)
    answer = client.completions.create(model="tiny", prompt="hello", max_tokens=200, temperature=0)
    model = tiny_server.engine.model
    ref = alone(model, model.tokenizer.encode("hello"), 200)
    assert text == answer.choices[0].text == ref.text and answer.choices[0].finish_reason == ref.finish_reason


# -- specdec serve --------------------------------------------------------------------------------
def test_serve_subcommand_is_wired(capsys):
    from specdec.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--api-key", "--spec-type", "--speculative-config", "--model"):
        assert flag in out


def test_cmd_serve_builds_the_app_and_binds_localhost(tiny_hf_dir, monkeypatch):
    import uvicorn

    from specdec.cli import serve as server_cli

    calls = {}
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: calls.update(config=self.config,
                                                                                         sockets=sockets))
    parser = argparse.ArgumentParser()
    server_cli.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", str(tiny_hf_dir), "--weights", "fp32", "--spec-type",
                              "ngram-simple", "--spec-draft-n-max", "4", "--ctx-size", "128", "--api-key", "k",
                              "--port", "0"])
    assert args.func is server_cli.cmd_serve
    assert args.func(args) == 0
    (sock,) = calls["sockets"]  # bound before the model loaded
    host, port = sock.getsockname()
    sock.close()
    assert host == "127.0.0.1" and port > 0 and calls["config"].port == port
    engine = calls["config"].app.state.engine
    assert engine.spec == SpecConfig(drafters=("ngram-simple",), draft_n_max=4) and engine.cache.max_len == 128
    calls["config"].app.state.worker.stop()


def test_serve_on_a_busy_port_or_a_bad_host_fails_before_the_model_loads(capsys):
    import socket

    from specdec.cli import main

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        assert main(["serve", "--model", "/nonexistent/model.gguf", "--port", str(port)]) == 2
        err = capsys.readouterr().err
        assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in err and "nonexistent" not in err
    finally:
        busy.close()
    assert main(["serve", "--model", "/nonexistent/model.gguf", "--host", "no-such-host.invalid"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: --host no-such-host.invalid: ") and "nonexistent" not in err


def test_scheduler_stop_is_prompt(tiny_model):
    scheduler = Scheduler(Engine(tiny_model, max_len=64))
    scheduler.start()
    t0 = time.perf_counter()
    scheduler.stop()
    assert time.perf_counter() - t0 < 5


def test_a_message_name_reaches_the_chat_template(tiny_model):
    """A message's "name" was dropped before the template saw it (templates that show names lost them)."""
    import copy

    from specdec.server.schemas import ChatMessage

    named = ChatMessage(role="developer", content=[{"type": "text", "text": "be brief"}], name="ops")
    assert named.as_template_dict() == {"role": "system", "content": "be brief", "name": "ops"}
    assert ChatMessage(role="user", content="hi").as_template_dict() == {"role": "user", "content": "hi"}
    template = "{% for m in messages %}{{ m.get('name', m['role']) }}: {{ m['content'] }}\n{% endfor %}"
    tok = copy.copy(tiny_model.tokenizer)
    tok.chat_template = template
    assert tok.apply_chat_template([named.as_template_dict()]) == "ops: be brief\n"


# -- fields of other servers and of OpenAI's API ---------------------------------------------------
def test_null_is_the_default_as_in_openai_s_api(tiny_server):
    """Clients that send every field send the unset ones as null; "temperature": null was a 400."""
    auth = {"Authorization": f"Bearer {tiny_server.api_key}"}
    nulls = {"top_p": None, "top_k": None, "min_p": None, "n": None, "stream": None, "presence_penalty": None,
             "frequency_penalty": None, "stop": None, "seed": None}
    with tiny_server.http(headers=auth) as http:
        plain = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4, "temperature": 0})
        nulled = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 4, "temperature": 0,
                                                    "echo": None, "logprobs": None, **nulls})
        assert plain.status_code == nulled.status_code == 200, nulled.text
        assert nulled.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
        sampled = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2, "temperature": None})
        assert sampled.status_code == 200, sampled.text  # the default temperature, 1.0
        chat = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2, "temperature": 0,
                                                       "logprobs": None, **nulls})
        assert chat.status_code == 200, chat.text
        missing = http.post("/v1/completions", json={"prompt": None, "max_tokens": 2})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"


@pytest.mark.parametrize("path, body, param", [
    ("/v1/completions", {"prompt": "x", "top_n_sigma": 1.0}, "top_n_sigma"),  # llama-server
    ("/v1/completions", {"prompt": "x", "min_new_tokens": 3}, "min_new_tokens"),  # SGLang
    ("/v1/completions", {"prompt": "x", "no_stop_trim": True}, "no_stop_trim"),
    ("/v1/chat/completions", {"messages": CHAT + [{"role": "assistant", "content": "The", "prefix": True}]},
     "messages.1.prefix"),  # DeepSeek's assistant prefill
    ("/v1/chat/completions", {"messages": CHAT + [{"role": "assistant", "content": "The", "partial": True}]},
     "messages.1.partial"),  # Mistral's / Kimi's
])
def test_fields_that_would_change_the_answer_are_refused(tiny_server, path, body, param):
    """They were served as if not sent."""
    with tiny_server.http(headers={"Authorization": f"Bearer {tiny_server.api_key}"}) as http:
        response = http.post(path, json={**body, "max_tokens": 2})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param and response.json()["error"]["code"] == "unsupported"
        neutral = {**body, "max_tokens": 2}
        if path.endswith("chat/completions"):
            neutral["messages"] = [dict(m, **({param.split(".")[-1]: False} if m["role"] == "assistant" else {}))
                                   for m in body["messages"]]
        else:
            neutral[param] = {"top_n_sigma": -1, "min_new_tokens": 0, "no_stop_trim": False}[param]
        assert http.post(path, json=neutral).status_code == 200


def test_text_parts_are_joined_by_newlines_and_a_null_include_usage_is_false(tiny_server):
    """["hi", "there"] as parts was the prompt "hithere" (vLLM joins them with newlines); stream_options with
    include_usage: null was a 400 (vLLM reads it as false)."""
    from specdec.server.schemas import ChatMessage

    parts = ChatMessage(role="user", content=[{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}])
    assert parts.as_template_dict() == {"role": "user", "content": "hi\nthere"}
    with tiny_server.http(headers={"Authorization": f"Bearer {tiny_server.api_key}"}) as http:
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": "abc", "max_tokens": 3, "stream": True,
                                               "stream_options": {"include_usage": None}})
        assert r.status_code == 200, r.text
        assert '"usage"' not in r.text and r.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize("path, body, param, message", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url",
                                                                         "image_url": {"url": "x"}}]}]},
     "messages.0.content.0.type", "Input should be 'text'. specdec serves text models: a message's content parts "
                                  "must be text parts."),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages.0.content",
     "Invalid type for 'messages.0.content'"),
    ("/v1/completions", {"prompt": [1, "a"]}, "prompt.1", "Invalid type for 'prompt.1': Input should be a valid "
                                                          "integer"),
])
def test_a_union_field_s_error_names_the_parameter_and_what_is_wrong(tiny_server, path, body, param, message):
    """param named pydantic's union branch ("messages.0.content.str") and the message said an image part had to be
    a string."""
    with tiny_server.http(headers={"Authorization": f"Bearer {tiny_server.api_key}"}) as http:
        response = http.post(path, json={**body, "max_tokens": 2})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and message in error["message"], error


def test_an_error_in_the_middle_of_a_stream_is_counted_by_code(tiny_model):
    """A timeout (or a failed step) after a stream had started reached the client as an error event but not
    specdec_request_errors_total, which counted the same timeout on a plain request."""
    import httpx

    from conftest import ServerThread
    from specdec.server.app import create_app

    engine = Engine(tiny_model, max_len=256)
    real_step = engine.step_batch

    def slow_step(*args, **kwargs):  # 20 steps a second: 200 tokens outlast the 1 s timeout
        time.sleep(0.05)
        return real_step(*args, **kwargs)

    engine.step_batch = slow_step
    app = create_app(engine, "tiny", request_timeout=1.0)
    server = ServerThread(app)
    base = server.start()
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            answer = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 200, "temperature": 0,
                                                        "stream": True})
            metrics = http.get("/metrics").text
    finally:
        server.stop()
    lines = [line for line in answer.text.splitlines() if line.startswith("data: ")]
    assert len(lines) > 3 and json.loads(lines[-2][6:])["error"]["code"] == "timeout"  # it streamed, then failed
    assert 'specdec_request_errors_total{code="timeout",status="504"} 1.0' in metrics


def test_stopping_the_scheduler_counts_the_waiting_requests_it_cancels(tiny_model):
    """stop() answered the queued requests "cancelled" without counting them in specdec_requests_total (drain()
    and a client that went away are counted)."""
    engine = Engine(tiny_model, max_len=256)
    real_step = engine.step_batch

    def slow_step(*args, **kwargs):
        time.sleep(0.05)
        return real_step(*args, **kwargs)

    engine.step_batch = slow_step
    scheduler = Scheduler(engine, max_batch=1)

    async def main():
        loop = asyncio.get_running_loop()
        jobs = [Job([5, 6, 7], SamplingParams(), 200, (), SpecConfig(), stream=False, endpoint="completions",
                    loop=loop) for _ in range(3)]
        for job in jobs:
            scheduler.submit(job)
        deadline = time.monotonic() + 30
        while scheduler.running < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await loop.run_in_executor(None, scheduler.stop)
        return [await asyncio.wait_for(_last_event(job), 30) for job in jobs]

    done = asyncio.run(main())
    assert [d.finish_reason for d in done] == ["cancelled"] * 3
    assert scheduler.metrics.requests.labels("completions", "cancelled")._value.get() == 3
