"""/metrics parses as Prometheus text and its counters move with the requests served; a client that
goes away mid-request stops its generation and frees its cache slot."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

pytestmark = pytest.mark.slow

PROMPT = "List the days of the week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Again: Monday,"


def wait_for(condition, timeout_s: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def test_counters_move_as_requests_are_served(smollm_server, scrape):
    from prometheus_client.parser import text_string_to_metric_families

    with smollm_server.http() as http:
        response = http.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    families = {f.name: f.type for f in text_string_to_metric_families(response.text)}
    expected = {"specdec_requests": "counter", "specdec_prompt_tokens": "counter",
                "specdec_completion_tokens": "counter", "specdec_spec_drafted_tokens": "counter",
                "specdec_spec_accepted_tokens": "counter", "specdec_spec_position_drafted": "counter",
                "specdec_spec_position_accepted": "counter", "specdec_time_to_first_token_seconds": "histogram",
                "specdec_time_per_output_token_seconds": "histogram", "specdec_request_errors": "counter"}
    assert {name: families.get(name) for name in expected} == expected
    before = scrape(smollm_server)

    resp = smollm_server.client().completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=10,
                                                     temperature=0)
    after = scrape(smollm_server)

    def moved(name, **labels):
        return after.get_value(name, **labels) - before.get_value(name, **labels)

    spec = resp.model_extra["spec"]
    assert spec["drafted"] > 0  # this prompt makes ngram-simple draft
    assert moved("specdec_requests_total", endpoint="completions", finish_reason=resp.choices[0].finish_reason) == 1
    assert moved("specdec_prompt_tokens_total") == resp.usage.prompt_tokens
    assert moved("specdec_completion_tokens_total") == resp.usage.completion_tokens
    assert moved("specdec_spec_drafted_tokens_total") == spec["drafted"]
    assert moved("specdec_spec_accepted_tokens_total") == spec["accepted"]
    assert moved("specdec_spec_draft_steps_total") == spec["steps"]
    assert moved("specdec_time_to_first_token_seconds_count") == 1
    assert moved("specdec_time_per_output_token_seconds_count") == (1 if resp.usage.completion_tokens > 1 else 0)
    assert moved("specdec_request_latency_seconds_count") == 1
    # per position: drafted at position i = steps that drafted at least i+1 tokens; accepted likewise
    steps = spec["steps"]
    drafted_at_0 = moved("specdec_spec_position_drafted_total", position="0")
    assert drafted_at_0 == steps
    for i, rate in enumerate(spec["per_position_acceptance"]):
        drafted = moved("specdec_spec_position_drafted_total", position=str(i))
        accepted = moved("specdec_spec_position_accepted_total", position=str(i))
        assert drafted > 0 and accepted / drafted == pytest.approx(rate)

    with smollm_server.http() as http:  # an error is counted too
        http.post("/v1/completions", json={"prompt": "x", "max_tokens": -1})
    assert moved_errors(before, scrape(smollm_server), "400", "invalid_value") >= 1


def moved_errors(before, after, status, code):
    labels = {"status": status, "code": code}
    return after.get_value("specdec_request_errors_total", **labels) - \
        before.get_value("specdec_request_errors_total", **labels)


def cancelled(samples) -> float:
    return sum(samples.get_value("specdec_requests_total", endpoint=e, finish_reason="cancelled")
               for e in ("completions", "chat.completions"))


def test_disconnect_mid_stream_stops_generation_and_frees_the_slot(smollm_server, reference, scrape):
    engine = smollm_server.engine
    before = scrape(smollm_server)
    with httpx.Client(base_url=smollm_server.base_url, timeout=60) as http:
        body = {"model": "smollm2-135m", "prompt": PROMPT, "max_tokens": 400, "temperature": 0, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: ") and '"text": ""' not in line:
                    break  # the first real piece of text: now go away
        # leaving the block closes the unfinished response, which closes the connection

    wait_for(lambda: cancelled(scrape(smollm_server)) - cancelled(before) >= 1, what="the stream cancelled")

    # then a non-streamed request whose client goes away while it runs: sent on a raw socket, closed
    # once the scheduler holds it (a client-side timeout could fire before the server has read it)
    worker = smollm_server.app.state.worker
    wait_for(lambda: worker.running + worker.waiting == 0, what="the scheduler to go idle")
    body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 400,
                       "temperature": 0}).encode()
    host, port = httpx.URL(smollm_server.base_url).host, httpx.URL(smollm_server.base_url).port
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body))
        wait_for(lambda: worker.running + worker.waiting >= 1, what="the request to reach the scheduler")
    wait_for(lambda: cancelled(scrape(smollm_server)) - cancelled(before) >= 2, what="both requests cancelled")
    wait_for(lambda: smollm_server.app.state.worker.running == 0, what="the scheduler to go idle")
    after = scrape(smollm_server)
    generated = after.get_value("specdec_completion_tokens_total") - before.get_value("specdec_completion_tokens_total")
    assert generated < 400  # both stopped early (400 tokens for one of them alone would take far longer)
    assert sorted(engine.cache.free_slots) == list(range(engine.cache.num_slots))  # engine.finish released them
    # and the next request is served normally
    resp = smollm_server.client().completions.create(model="smollm2-135m", prompt=PROMPT, max_tokens=3,
                                                     temperature=0)
    assert resp.choices[0].text == reference.generate(reference.prompt_ids(PROMPT), 3, spec=engine.spec).text
