"""`specdec bench --concurrency`: percentile math by hand, and a real specdec server (tiny random model, a
subprocess on 127.0.0.1) driven at concurrency 1 and 4. Counts and outputs are asserted, never seconds."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from bench_helpers import short_prompts  # noqa: F401 (a fixture)
from specdec.bench.load import (LoadSettings, base_url, distribution, percentile, request_body, run_load,
                                summarize_level)
from specdec.bench import load as load_module
from specdec.bench.local_server import LocalServer, free_port
from specdec.bench.streaming import RequestResult, stream_request
from specdec.bench.prompts import Prompt, load_prompts
from specdec.bench.report import load_table, write_load
from specdec.cli import main

TIMEOUTS = {"request_timeout_s": 60.0, "level_timeout_s": 120.0}
SERVE = ["--weights", "fp32", "--ctx-size", "512", "--spec-type", "ngram-simple"]


# -- pure parts --------------------------------------------------------------------------------
def test_percentiles_by_hand():
    assert percentile([4, 1, 3, 2], 50) == 2.5  # sorted 1 2 3 4: rank 1.5
    xs = [10, 20, 30, 40, 50]
    assert percentile(xs, 0) == 10 and percentile(xs, 100) == 50 and percentile(xs, 50) == 30
    assert percentile(xs, 90) == pytest.approx(46.0)  # rank 3.6: 40 + 0.6 * 10
    assert percentile(xs, 99) == pytest.approx(49.6)  # rank 3.96
    assert percentile(xs, 25) == pytest.approx(20.0)  # rank 1.0 exactly
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None and percentile([None, None], 50) is None
    with pytest.raises(ValueError):
        percentile(xs, 101)
    d = distribution([0.3, None, 0.1, 0.2])
    assert d == {"p50": pytest.approx(0.2), "p90": pytest.approx(0.28), "p99": pytest.approx(0.298),
                 "mean": pytest.approx(0.2), "n": 3}


def test_summary_counts_tokens_tpot_errors_and_mismatches():
    a = RequestResult("p1", 0, ok=True, ttft_s=0.5, latency_s=1.5, chunk_times=[0.5, 0.7, 1.5], text="abc",
                      finish_reason="length", usage_tokens=5, spec={"drafted": 4, "accepted": 3})
    b = RequestResult("p2", 1, ok=True, ttft_s=1.0, latency_s=2.0, chunk_times=[1.0, 2.0], text="xy",
                      finish_reason="stop")  # no usage: counted by chunks
    c = RequestResult("p1", 2, error="http 503", message="busy")
    d = RequestResult("p1", 3, error="timeout", message="slow")
    row = summarize_level(4, 5, [a, b, c, d], wall_s=2.0, not_sent=1, references={"p1": "abc", "p2": "xz"})
    assert (row["requests"], row["sent"], row["completed"], row["not_sent"]) == (5, 4, 2, 1)
    assert row["errors"] == {"http 503": 1, "timeout": 1}
    assert row["error_examples"] == {"http 503": "busy", "timeout": "slow"}
    assert row["output_tokens"] == 5 + 2 and row["token_count_source"] == "mixed"
    assert row["output_tokens_per_s"] == pytest.approx(3.5) and row["requests_per_s"] == pytest.approx(1.0)
    assert a.tpot_s == pytest.approx((1.5 - 0.5) / 4) and b.tpot_s == pytest.approx(1.0)
    assert row["tpot_s"]["p50"] == pytest.approx((0.25 + 1.0) / 2)
    assert row["itl_s"]["n"] == 3  # gaps 0.2, 0.8 (a) and 1.0 (b)
    assert row["itl_s"]["p50"] == pytest.approx(0.8)
    assert row["ttft_s"]["p50"] == pytest.approx(0.75)
    assert row["greedy"]["compared"] == 2 and row["greedy"]["mismatches"] == 1
    assert row["greedy"]["mismatched"] == [{"prompt": "p2", "index": 1, "first_difference_at_char": 1}]
    assert row["spec"]["acceptance_rate"] == pytest.approx(0.75)
    assert len(row["runs"]) == 4 and row["runs"][2]["error"] == "http 503"
    table = "\n".join(load_table({"levels": [row]}))
    assert "| 4 | 2 / 4 | http 503 1, timeout 1 (+1 not sent: level timeout) |" in table
    assert "1 of 2" in table


def test_request_bodies_and_urls():
    text = Prompt("t", "code", text="def f():")
    chat = Prompt("c", "chat", messages=({"role": "user", "content": "Hi"},))
    s = LoadSettings(url="http://127.0.0.1:1/v1", model="m", max_tokens=7)
    path, body = request_body(text, s, 3)
    assert path == "/v1/completions" and body["prompt"] == "def f():" and body["model"] == "m"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 7 and body["temperature"] == 0.0 and "seed" not in body
    assert request_body(chat, s, 0)[1]["prompt"] == "User: Hi\nAssistant:"
    chat_s = LoadSettings(url="http://127.0.0.1:1", endpoint="chat", temperature=0.7, seed=10)
    path, body = request_body(text, chat_s, 3)
    assert path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "def f():"}]
    assert body["seed"] == 13 and "model" not in body
    assert base_url("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080"
    for bad in ("localhost:8000", "ftp://x/v1", "http://"):
        with pytest.raises(ValueError, match="not an http"):
            base_url(bad)
    with pytest.raises(ValueError, match="at least 1"):
        LoadSettings(url="http://127.0.0.1:1", levels=(0, 4))
    with pytest.raises(ValueError, match=r"--peer-url 'http://127.0.0.1:abc' is not a valid URL \(Invalid port"):
        base_url("http://127.0.0.1:abc", "--peer-url")  # was httpx.InvalidURL's traceback


def _stream_from(lines: list[str], pause_s: float = 0.0, status: int = 200) -> RequestResult:
    """stream_request against an in-memory transport that answers `lines` (SSE), pausing between them."""
    import time

    def body():
        for line in lines:
            time.sleep(pause_s)
            yield (line + "\n\n").encode()

    def handler(request):
        if status != 200:
            return httpx.Response(status, json={"error": {"message": "overloaded", "type": "server_error"}})
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        return stream_request(client, "http://fake", "/v1/completions", {}, RequestResult("p", 0), timeout_s=0.3)


def _chunk(text: str, finish=None, **extra) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra})


def test_stream_outcomes_by_kind():
    ok = _stream_from([_chunk("a"), ": keep-alive", _chunk("bc"), _chunk("", "length"), "data: [DONE]"])
    assert ok.ok and ok.text == "abc" and ok.finish_reason == "length"
    assert ok.usage_tokens is None and ok.tokens == 2 and len(ok.chunk_times) == 2  # counted by text chunks
    usage = _stream_from([_chunk("a"), _chunk("", "stop"), 'data: {"choices": [], "usage": {"completion_tokens": 3}}',
                          "data: [DONE]"])
    assert usage.ok and usage.tokens == 3
    cut = _stream_from([_chunk("a"), _chunk("b")])
    assert (cut.ok, cut.error) == (False, "incomplete stream")
    assert cut.message == "the stream ended without a finish_reason and data: [DONE]"
    failed = _stream_from([_chunk("a"), 'data: {"error": {"message": "generation failed: boom"}}', "data: [DONE]"])
    assert (failed.error, failed.message) == ("stream error", "generation failed: boom")
    garbled = _stream_from([_chunk("a"), "data: {not json"])
    assert garbled.error == "bad stream"
    busy = _stream_from([], status=503)
    assert (busy.error, busy.message) == ("http 503", "overloaded")
    slow = _stream_from([_chunk("a"), _chunk("b"), _chunk("c"), _chunk("d", "stop"), "data: [DONE]"], pause_s=0.12)
    assert slow.error == "timeout" and "per-request timeout of 0.3 s" in slow.message


@pytest.mark.parametrize("line", ["data: [1, 2]", 'data: "text"', 'data: {"choices": "abc"}',
                                  'data: {"choices": [7]}'])
def test_a_chunk_that_is_json_but_not_a_chunk_object_is_a_bad_stream(line):
    """Each raised AttributeError in the worker thread, which died; the report blamed the level timeout."""
    r = _stream_from([_chunk("a"), line, _chunk("", "stop"), "data: [DONE]"])
    assert (r.ok, r.error) == (False, "bad stream") and "not an OpenAI chunk object" in r.message


def test_a_server_listing_no_model_object_is_noted_by_the_probe():
    def handler(request):
        return httpx.Response(200, json=["m"]) if request.url.path == "/v1/models" else httpx.Response(404)

    settings = LoadSettings(url="http://fake/v1", levels=(1,), requests=1, max_tokens=4, **TIMEOUTS)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(load_module, "_client", lambda settings: httpx.Client(transport=httpx.MockTransport(handler)))
        info = load_module.probe(settings)
    assert info["models"] is None and "something else than a model list" in info["error"]


# -- a refused connection is a counted error ----------------------------------------------------
def test_refused_connection_is_reported_not_raised(short_prompts):
    port = free_port()  # nothing listens there
    settings = LoadSettings(url=f"http://127.0.0.1:{port}/v1", levels=(1, 2), requests=3, max_tokens=4, **TIMEOUTS)
    load = run_load(settings, load_prompts(str(short_prompts)), progress=False)
    assert "cannot reach" in load["server"]["probe"]["error"]
    for row in load["levels"]:
        assert (row["sent"], row["completed"]) == (3, 0)
        assert row["errors"] == {"connection refused": 3}
        assert f"127.0.0.1:{port}" in row["error_examples"]["connection refused"]
        assert row["output_tokens_per_s"] == 0 and row["ttft_s"]["p50"] is None


def test_cli_bad_url_and_refused_url(short_prompts, tmp_path, capsys):
    rc = main(["bench", "--concurrency", "1", "--url", "localhost:8000", "--out", str(tmp_path / "a")])
    assert rc == 2
    assert "is not an http(s) URL" in capsys.readouterr().err
    rc = main(["bench", "--concurrency", "1,2", "--url", f"http://127.0.0.1:{free_port()}/v1", "--requests", "2",
               "--max-tokens", "4", "--prompts", str(short_prompts), "--no-progress", "--out", str(tmp_path / "b")])
    captured = capsys.readouterr()
    assert rc == 1
    assert "no request completed" in captured.err and "Connection refused" in captured.err
    assert "connection refused 2" in captured.out  # the printed table
    report = (tmp_path / "b" / "report.md").read_text()
    assert "## Server load" in report and "connection refused" in report
    assert json.loads((tmp_path / "b" / "results.json").read_text())["load"]["levels"][1]["errors"] == {
        "connection refused": 2}


# -- a real server -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_served(tiny_hf_dir, tmp_path_factory):
    server = LocalServer(["--model", str(tiny_hf_dir), *SERVE], tmp_path_factory.mktemp("serve") / "server.log",
                         start_timeout_s=180, env={"OMP_NUM_THREADS": "1"})
    with server:
        yield server
    assert server.proc.poll() is not None


def _completion_tokens(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "specdec_completion_tokens_total")


def test_levels_1_and_4_count_every_request_and_token(tiny_served, tiny_hf_dir, short_prompts):
    prompts = load_prompts(str(short_prompts)) + [Prompt("prose-1", "prose", text="Once upon a time")]
    settings = LoadSettings(url=tiny_served.url + "/v1", model=str(tiny_hf_dir), levels=(4, 1), requests=5,
                            max_tokens=8, warmup=False, **TIMEOUTS)
    before = _completion_tokens(tiny_served.url)
    load = run_load(settings, prompts, progress=False)
    served_tokens = _completion_tokens(tiny_served.url) - before
    assert [row["concurrency"] for row in load["levels"]] == [1, 4]
    assert load["reference_pass"] is None and load["references"] == 3  # concurrency 1 gave the references
    assert load["settings"]["prompts_used"] == ["code-1", "chat-1", "prose-1"]
    for row in load["levels"]:
        assert (row["requests"], row["sent"], row["completed"], row["not_sent"]) == (5, 5, 5, 0)
        assert row["errors"] == {}
        assert row["token_count_source"] == "usage"
        runs = row["runs"]
        assert [r["prompt"] for r in runs] == ["code-1", "chat-1", "prose-1", "code-1", "chat-1"]
        assert all(1 <= r["usage_tokens"] <= 8 and r["tokens"] == r["usage_tokens"] for r in runs)
        assert row["output_tokens"] == sum(r["usage_tokens"] for r in runs)
        assert 5 <= row["text_chunks"] <= row["output_tokens"]  # a chunk carries one token or more
        assert row["ttft_s"]["n"] == row["latency_s"]["n"] == 5
        assert row["itl_s"]["n"] == row["text_chunks"] - 5
        assert row["ttft_s"]["p50"] <= row["ttft_s"]["p90"] <= row["ttft_s"]["p99"]
        assert row["greedy"]["compared"] == 5 and row["greedy"]["mismatches"] == 0  # identical greedy outputs
        assert row["spec"]["method"] and row["spec"]["requests"] == 5
    # the server's own count of generated tokens agrees with the usage the stream reported
    assert served_tokens == sum(row["output_tokens"] for row in load["levels"])
    probe = load["server"]["probe"]
    assert probe["error"] is None and probe["models"][0]["id"] == str(tiny_hf_dir)


def test_chat_endpoint_without_level_1_uses_a_reference_pass(tiny_served, tiny_hf_dir, short_prompts):
    settings = LoadSettings(url=tiny_served.url, model=str(tiny_hf_dir), levels=(2,), requests=4, max_tokens=6,
                            endpoint="chat", **TIMEOUTS)
    load = run_load(settings, load_prompts(str(short_prompts)), progress=False)
    assert load["reference_pass"]["requests"] == 2 and load["reference_pass"]["completed"] == 2
    row = load["levels"][0]
    assert row["completed"] == 4 and row["errors"] == {}
    assert row["greedy"] == {"compared": 4, "mismatches": 0, "compared_by": "text", "mismatched": []}


def test_unknown_model_is_counted_by_http_status(tiny_served, short_prompts):
    settings = LoadSettings(url=tiny_served.url, model="no-such-model", levels=(2,), requests=3, max_tokens=4,
                            **TIMEOUTS)
    row = run_load(settings, load_prompts(str(short_prompts)), progress=False)["levels"][0]
    assert row["completed"] == 0 and row["errors"] == {"http 404": 3}
    assert "no-such-model" in row["error_examples"]["http 404"]


def test_cli_starts_and_stops_its_own_server(tiny_hf_dir, short_prompts, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "out"
    rc = main(["bench", "--concurrency", "1,2", "--model", str(tiny_hf_dir), *SERVE, "--requests", "3",
               "--max-tokens", "6", "--prompts", str(short_prompts), "--no-progress", "--out", str(out),
               "--server-start-timeout", "180", "--request-timeout", "60", "--level-timeout", "120"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    r = json.loads((out / "results.json").read_text())
    assert r["schema"] == "specdec-bench-load/1" and "specdec_version" in r["runtime"]
    load = r["load"]
    assert load["server"]["started_by_bench"] and "--spec-type ngram-simple" in load["server"]["command_line"]
    assert [(row["concurrency"], row["completed"], row["errors"]) for row in load["levels"]] == [(1, 3, {}),
                                                                                                 (2, 3, {})]
    assert all(row["greedy"]["mismatches"] == 0 for row in load["levels"])
    report = (out / "report.md").read_text()
    assert "## Server load" in report and "| 2 | 3 / 3 | 0 |" in report
    assert "| 2 | 3 / 3 | 0 |" in captured.out  # the table is printed
    with pytest.raises(httpx.ConnectError):  # the server is gone
        httpx.get(load["settings"]["base_url"] + "/health", timeout=5)


def test_load_section_joins_a_bench_results_file(tmp_path):
    from specdec.bench.report import markdown

    results = {"schema": "specdec-bench/1", "created": "now", "settings": {"temperatures": []},
               "runtime": {}, "artifacts": {"target": {"name": "tiny"}}, "prompts": [], "configs": [],
               "summary": [], "runs": [], "sweep": [], "auto": None, "facts": []}
    (tmp_path / "results.json").write_text(json.dumps(results))
    markdown(results)  # the minimal file is a valid bench result
    row = summarize_level(1, 1, [RequestResult("p", 0, error="timeout", message="slow")], 1.0, 0, None)
    load = {"schema": "specdec-bench-load/1", "levels": [row], "server": {"started_by_bench": False},
            "settings": {"base_url": "http://127.0.0.1:1", "endpoint": "completions", "model": None, "max_tokens": 4,
                         "temperature": 0.7, "requests": 1, "prompts_used": ["p"], "request_timeout_s": 1,
                         "level_timeout_s": 1}}
    write_load(load, tmp_path)
    merged = json.loads((tmp_path / "results.json").read_text())
    assert merged["schema"] == "specdec-bench/1" and merged["load"]["levels"][0]["errors"] == {"timeout": 1}
    report = (tmp_path / "report.md").read_text()
    assert report.startswith("# specdec bench: tiny") and "## Server load" in report and "1 x timeout: slow" in report


@pytest.mark.parametrize("extra, named", [
    (["--methods", "suffix"], "--methods"), (["--repeats", "5"], "--repeats"),
    (["--draft-lengths", "1,2"], "--draft-lengths"), (["--peers", "hf-plain"], "--peers"),
    (["--peer-url", "http://127.0.0.1:9"], "--peer-url"), (["--hf-dtype", "fp32"], "--hf-dtype"),
    (["--keep-drafter-memory"], "--keep-drafter-memory"),
])
def test_load_mode_refuses_the_method_bench_s_flags(tmp_path, capsys, extra, named):
    """They were dropped without a word: the report said "spec type: auto" after --methods suffix."""
    rc = main(["bench", "--concurrency", "1", "--model", "/nonexistent/m.gguf", "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and f"{named} set the method bench" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra, named", [
    (["-md", "/tmp/draft", "--methods", "none,suffix"], "--draft-model"),
    (["--peer-model", "foo"], "--peer-model"), (["--hf-dtype", "fp32"], "--hf-dtype"),
])
def test_method_bench_refuses_flags_nothing_uses(tmp_path, capsys, extra, named):
    rc = main(["bench", "--model", "/nonexistent/m.gguf", "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and f"{named} would not be used" in err and "Traceback" not in err


def test_a_server_that_does_not_start_is_one_error(tmp_path, capsys, short_prompts):
    rc = main(["bench", "--concurrency", "1", "--requests", "1", "--model", str(tmp_path / "missing"), "-n", "2",
               "--prompts", str(short_prompts), "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("specdec: error: the specdec server exited with code") and "Traceback (" not in \
        err.splitlines()[0]


def test_a_load_run_of_another_model_is_not_joined_to_a_bench(tmp_path, capsys, short_prompts):
    """A load run of b.gguf into the --out of a.gguf's bench was appended under a.gguf's title."""
    from helpers.tiny import make_gguf_model
    from specdec.bench.results_file import check_load_joins

    a, b = make_gguf_model(tmp_path / "a.gguf", seed=1), make_gguf_model(tmp_path / "b.gguf", seed=2)
    out = tmp_path / "out"
    out.mkdir()
    results = {"schema": "specdec-bench/1", "summary": [],
               "artifacts": {"target": {"name": "a.gguf", "path": str(a), "sha256": "aa"}}}
    (out / "results.json").write_text(json.dumps(results))
    rc = main(["bench", "--concurrency", "1", "--requests", "1", "--model", str(b), "-n", "2",
               "--prompts", str(short_prompts), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "is the bench of a.gguf; a load run of" in err and "choose another --out" in err
    assert json.loads((out / "results.json").read_text()) == results and not (out / "server.log").exists()
    check_load_joins(out, {"artifact": str(tmp_path / "elsewhere.gguf"), "sha256": "aa"})  # the same file's hash
    check_load_joins(out, {"artifact": str(a), "sha256": None})  # the same path
    check_load_joins(out, {})  # unknown: joined, as asked
    with pytest.raises(ValueError, match="is the bench of a.gguf"):
        check_load_joins(out, {"artifact": str(b), "sha256": "bb"})


class _Sleeper(LocalServer):
    """A LocalServer whose process is a sleeping Python that never answers /health. It ends on SIGINT as
    `specdec serve` does (uvicorn sets its own handler): a child of a shell's background job inherits SIGINT
    ignored, and a plain Python then sleeps through stop()'s SIGINT until its SIGTERM 20 s later."""

    @property
    def command(self) -> list[str]:
        import sys

        return [sys.executable, "-c",
                "import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(130)); time.sleep(120)"]


def test_an_interrupted_start_stops_the_server(tmp_path, monkeypatch):
    """A Ctrl-C while the started server loaded its model left that server running, adopted by init."""
    def interrupted(client, url):
        raise KeyboardInterrupt

    server = _Sleeper([], tmp_path / "server.log", start_timeout_s=60)
    monkeypatch.setattr(httpx.Client, "get", interrupted)  # the Ctrl-C arrives during a /health poll
    with pytest.raises(KeyboardInterrupt):
        with server:
            pass
    assert server.proc.poll() is not None


def test_sigterm_to_the_bench_stops_the_server_it_started(tmp_path):
    """SIGTERM ended the bench without running __exit__: its server lived on."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "run.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_bench_load import _Sleeper
class Told(_Sleeper):
    def _wait_for_health(self):
        print(self.proc.pid, flush=True)
        return super()._wait_for_health()
with Told([], {str(tmp_path / "server.log")!r}, start_timeout_s=60):
    pass
""")
    bench = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(bench.stdout.readline())
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(60) == 128 + signal.SIGTERM
    finally:
        bench.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # stopped and reaped by the bench: no such process
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the server outlived the bench")


def test_a_method_bench_keeps_the_load_run_in_its_out(tmp_path, capsys, short_prompts, tiny_model):
    """Run after a load run into the same --out, the method bench rewrote results.json without it."""
    from specdec.bench.method_bench import bench

    out = tmp_path / "o"
    main(["bench", "--concurrency", "1", "--url", f"http://127.0.0.1:{free_port()}/v1", "--requests", "1",
          "--max-tokens", "2", "--prompts", str(short_prompts), "--no-progress", "--out", str(out)])
    load = json.loads((out / "results.json").read_text())["load"]
    bench(tiny_model, str(short_prompts), "none", max_tokens=2, repeats=1, warmup=False, ctx_size=256,
          progress=False, out_dir=out)
    kept = json.loads((out / "results.json").read_text())
    assert kept["schema"] == "specdec-bench/1" and kept["load"] == load
    assert "## Server load" in (out / "report.md").read_text()
    # a load run whose server loaded another file is not joined to this model's bench
    kept["load"]["server"]["artifact"] = str(tmp_path / "other.gguf")
    (out / "results.json").write_text(json.dumps(kept))
    with pytest.raises(ValueError, match="holds a load run of .*other.gguf; the bench of .* choose another --out"):
        bench(tiny_model, str(short_prompts), "none", max_tokens=2, repeats=1, warmup=False, ctx_size=256,
              progress=False, out_dir=out)
    assert json.loads((out / "results.json").read_text()) == kept
