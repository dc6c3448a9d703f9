"""A bounded load test on 127.0.0.1: 64 streaming clients at once (16 run in the batch, the rest
queue), each answered completely and with the same text as when it comes alone, speculation on
and off side by side. Prints requests/s and latency percentiles; asserts nothing about speed
(`specdec bench --concurrency` measures that)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

CLIENTS = 64
MAX_TOKENS = 8
TIMEOUT_S = 240  # for the whole burst; every client also has its own HTTP timeout
PROMPTS = [
    "The capital of France is",
    "One, two, three, four, five, six,",
    "def fibonacci(n):",
    "The quick brown fox",
]


def stream_once(served, prompt: str, chat: bool, spec_on: bool = True, start: threading.Barrier | None = None) -> dict:
    """One streamed request; returns its text, finish reason, usage, spec and timings."""
    client = served.client()
    extra = {} if spec_on else {"extra_body": {"speculative": {"enabled": False}}}
    if start is not None:
        start.wait(timeout=60)
    t0 = time.perf_counter()
    first = None
    pieces, finish, usage, spec = [], None, None, None
    if chat:
        stream = client.chat.completions.create(model=served.model_name, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=MAX_TOKENS, temperature=0, stream=True,
                                                stream_options={"include_usage": True}, **extra)
    else:
        stream = client.completions.create(model=served.model_name, prompt=prompt, max_tokens=MAX_TOKENS,
                                           temperature=0, stream=True, stream_options={"include_usage": True},
                                           **extra)
    for chunk in stream:
        if chunk.choices:
            choice = chunk.choices[0]
            piece = (choice.delta.content if chat else choice.text) or ""
            if piece and first is None:
                first = time.perf_counter() - t0
            pieces.append(piece)
            finish = choice.finish_reason or finish
        if chunk.usage is not None:
            usage, spec = chunk.usage, chunk.model_extra.get("spec")
    return {"text": "".join(pieces), "finish": finish, "usage": usage, "spec": spec, "ttft": first,
            "latency": time.perf_counter() - t0}


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, int(round(p / 100 * len(ordered) + 0.5 - 1e-9)))
    return ordered[min(rank, len(ordered)) - 1]


def test_sixty_four_concurrent_streaming_clients(smollm_server, scrape, capsys):
    # each distinct request alone first: the expected answers, and the single-request latency;
    # completions and chat mixed, every third with speculation off
    work = [(PROMPTS[i % len(PROMPTS)], i % 2 == 1, i % 3 != 0) for i in range(CLIENTS)]
    alone = {key: stream_once(smollm_server, *key) for key in sorted(set(work))}
    before = scrape(smollm_server)

    barrier = threading.Barrier(CLIENTS)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
        futures = [pool.submit(stream_once, smollm_server, *key, barrier) for key in work]
        deadline = t0 + TIMEOUT_S
        results = [f.result(timeout=max(1.0, deadline - time.perf_counter())) for f in futures]
    wall = time.perf_counter() - t0
    after = scrape(smollm_server)

    for key, result in zip(work, results):
        expected = alone[key]
        assert result["text"] == expected["text"] and result["text"]
        assert result["finish"] == expected["finish"] in ("stop", "length")
        assert result["usage"] == expected["usage"]
        assert (result["spec"]["drafted"] > 0) <= key[2]  # speculation off drafts nothing
    served = sum(after.get_value("specdec_requests_total", endpoint=e, finish_reason=r)
                 - before.get_value("specdec_requests_total", endpoint=e, finish_reason=r)
                 for e in ("completions", "chat.completions") for r in ("stop", "length"))
    assert served == CLIENTS
    errors = sum(v for (name, _), v in after.items() if name == "specdec_request_errors_total") - \
        sum(v for (name, _), v in before.items() if name == "specdec_request_errors_total")
    assert errors == 0

    latencies = [r["latency"] for r in results]
    ttfts = [r["ttft"] for r in results]
    tokens = sum(r["usage"].completion_tokens for r in results)
    single = [r["latency"] for r in alone.values()]
    with capsys.disabled():
        print(f"\nload test: {CLIENTS} concurrent streaming clients, {MAX_TOKENS} max tokens each, batch "
              f"{smollm_server.app.state.worker.max_batch}")
        print(f"  {CLIENTS / wall:.2f} requests/s, {tokens / wall:.1f} completion tokens/s, wall {wall:.1f}s")
        print("  latency  p50 {:.2f}s  p90 {:.2f}s  p99 {:.2f}s  max {:.2f}s".format(
            *(percentile(latencies, p) for p in (50, 90, 99)), max(latencies)))
        print("  TTFT     p50 {:.2f}s  p90 {:.2f}s  p99 {:.2f}s".format(*(percentile(ttfts, p) for p in (50, 90, 99))))
        print(f"  a request alone: latency median {percentile(single, 50):.2f}s (of {len(single)})")
