"""Peers: an OpenAI-compatible endpoint (mocked) and transformers generate, each labeled honestly."""

from __future__ import annotations

import json

import httpx
import pytest

from bench_helpers import short_prompts, validate_results  # noqa: F401 (short_prompts is a fixture)
from specdec.bench.peers import PeerError, URLPeer, parse_completion


def _server(extra: dict):
    """A fake /v1/completions that echoes a fixed text and adds `extra` to every answer."""
    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        answer = {"choices": [{"text": " hello world"}], "usage": {"completion_tokens": 5}}
        answer.update(extra)
        return httpx.Response(200, json=answer)

    return httpx.Client(transport=httpx.MockTransport(handle)), seen


def test_llama_cpp_timings_and_draft_counters_are_read():
    client, seen = _server({"timings": {"prompt_ms": 20.0, "predicted_ms": 100.0, "predicted_n": 5,
                                        "draft_n": 12, "draft_n_accepted": 9}})
    peer = URLPeer("http://127.0.0.1:8080/v1/", model="m", client=client)
    out = peer.generate([1, 2], "prompt text", 0.0, 5, 3)
    assert seen[0][0] == "/v1/completions"
    assert seen[0][1]["prompt"] == "prompt text" and seen[0][1]["max_tokens"] == 5 and seen[0][1]["model"] == "m"
    assert (out.engaged, out.drafted, out.accepted) == ("yes", 12, 9)
    # llama.cpp starts predicted_ms at the first token: 100 ms are the 4 steps after it, as specdec times its own
    assert out.decode_tokens_per_s == pytest.approx(40.0)  # not predicted_n / predicted_ms (50, as if 5 steps)
    assert out.timing_source == "server timings" and out.text == " hello world"
    assert peer.label == "url:127.0.0.1:8080"


@pytest.mark.parametrize("extra, engaged", [
    ({}, "unknown"),
    ({"timings": {"predicted_ms": 10.0, "predicted_n": 5, "draft_n": 0, "draft_n_accepted": 0}}, "no"),
    ({"spec": {"drafted": 4, "accepted": 2}}, "yes"),
    ({"spec": {"engaged": False}}, "no"),
])
def test_engagement_is_unknown_unless_the_server_says(extra, engaged):
    out = parse_completion({"choices": [{"text": "x"}], "usage": {"completion_tokens": 3}, **extra}, 0.5)
    assert out.engaged == engaged
    if not extra.get("timings"):
        assert out.timing_source.startswith("client wall clock")


@pytest.mark.parametrize("answer, message", [
    (["x"], "not an OpenAI completion"),  # was AttributeError
    ({"choices": [{"text": 5}]}, "the choice's text is 5"),
    ({"choices": [{"text": "x"}], "timings": {"draft_n": "many"}}, "not an OpenAI completion .*ValueError"),
])
def test_a_peer_answer_that_is_not_a_completion_is_one_error(answer, message):
    client = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(200, json=answer)))
    with pytest.raises(PeerError, match=message):
        URLPeer("http://127.0.0.1:8080", client=client).generate([1], "p", 0.0, 4, 0)


@pytest.mark.parametrize("respond, message", [
    (lambda request: httpx.Response(503, text="busy"), "answered 503: busy"),
    (lambda request: httpx.Response(200, text="<html>"), "answered something that is not JSON: '<html>'"),
])
def test_a_failing_peer_is_one_error_naming_it(respond, message):
    client = httpx.Client(transport=httpx.MockTransport(respond))
    with pytest.raises(PeerError, match="peer http://127.0.0.1:8080/v1/completions " + message):
        URLPeer("http://127.0.0.1:8080", client=client).generate([1], "p", 0.0, 4, 0)


def test_an_unreachable_peer_is_one_error():
    from specdec.bench.local_server import free_port

    peer = URLPeer(f"http://127.0.0.1:{free_port()}", timeout=5)
    with pytest.raises(PeerError, match="ConnectError"):
        peer.generate([1], "p", 0.0, 4, 0)


def test_url_peer_in_the_bench_is_reported_unknown(tiny_model, short_prompts, tmp_path):
    from specdec.bench.method_bench import bench

    client, seen = _server({})
    r = bench(tiny_model, str(short_prompts), "none", temperatures=[0.0], max_tokens=4, repeats=1, warmup=False,
              ctx_size=256, peer_urls=["http://localhost:9999"], url_client=client, progress=False, out_dir=tmp_path)
    validate_results(r)
    row = next(s for s in r["summary"] if s["config"].startswith("url:") and s["category"] == "all")
    assert row["engaged"] == "unknown" and row["drafted"] is None
    peer = next(c for c in r["configs"] if c["kind"] == "peer")
    assert peer["speculation_path"] == "unknown" and peer["in_memory_format"].startswith("unknown")
    md = (tmp_path / "report.md").read_text()
    assert "| unknown |" in md and "wall clock including prefill" in md
    assert f"| KV cache (specdec) | {tiny_model.info.kv_cache} |" in md  # --cache-type left no trace in the report
    assert len(seen) == len(r["prompts"])


def test_specdec_server_as_a_peer_reports_its_draft_counters(tiny_model, tiny_hf_dir, short_prompts):
    """Our own server returns "spec" (SpecStats) with each completion: the peer reads engaged from it."""
    from starlette.testclient import TestClient

    from specdec.bench.method_bench import bench
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine
    from specdec.server.app import create_app

    engine = Engine(tiny_model, SpecConfig(drafters=("draft-simple",), draft_model=str(tiny_hf_dir)), max_len=256)
    with TestClient(create_app(engine, "tiny")) as client:
        r = bench(tiny_model, str(short_prompts), "none", temperatures=[0.0], max_tokens=6, repeats=1, warmup=False,
                  ctx_size=256, peer_urls=["http://testserver"], url_client=client, progress=False)
    row = next(s for s in r["summary"] if s["kind"] == "peer" and s["category"] == "all")
    assert row["engaged"] == "yes" and row["drafted"] > 0 and row["acceptance_rate"] is not None
    runs = [run for run in r["runs"] if run["config"] == row["config"]]
    assert all(run["compared_by"] == "text" for run in runs)
    assert all(run["identical_to_baseline"] for run in runs)  # same model, same numerics, lossless drafts


def test_transformers_peers_are_labeled(tiny_model, tiny_hf_dir, short_prompts, tmp_path):
    from specdec.bench.method_bench import bench

    r = bench(tiny_model, str(short_prompts), "none", draft_model=str(tiny_hf_dir), temperatures=[0.0],
              max_tokens=6, repeats=1, warmup=False, ctx_size=256, per_category=1,
              peers=["hf-prompt-lookup", "hf-assisted", "hf-plain"], hf_dtype="fp32", progress=False, out_dir=tmp_path)
    validate_results(r)
    configs = {c["label"]: c for c in r["configs"]}
    assert [c["label"] for c in r["configs"]][1:] == ["hf-plain", "hf-assisted", "hf-prompt-lookup"]
    assert configs["hf-assisted"]["baseline"] == "hf-plain" and configs["hf-plain"]["baseline"] == "none"
    # the tiny folder holds fp32 and both runtimes run fp32 here; GGUF files differ (tests/bench/test_bench_real.py)
    assert configs["hf-plain"]["in_memory_format"] == "fp32 dense floating point (as stored; same as specdec's fp32)"
    assert configs["hf-assisted"]["options"]["num_assistant_tokens"] == 3
    rows = {s["config"]: s for s in r["summary"] if s["category"] == "all"}
    assert rows["hf-plain"]["engaged"] == "no"
    assert rows["hf-assisted"]["engaged"] == "unknown" and rows["hf-prompt-lookup"]["engaged"] == "unknown"
    hf_runs = [run for run in r["runs"] if run["config"].startswith("hf-")]
    assert len(hf_runs) == 3 * len({run["prompt"] for run in r["runs"]})
    for run in hf_runs:  # greedy: hf-plain gives specdec's fp32 tokens, the others hf-plain's
        assert run["output_tokens"] > 0 and run["identical_to_baseline"] is True, run
    assert "transformers_version" in r["runtime"]
    md = (tmp_path / "report.md").read_text()
    assert "the same format as specdec" in md and "'engaged: unknown'" in md


def test_assisted_peer_needs_a_draft_model(tiny_model, short_prompts):
    from specdec.bench.method_bench import bench

    with pytest.raises(ValueError, match="needs --draft-model"):
        bench(tiny_model, str(short_prompts), "none", peers=["hf-assisted"], progress=False)
    with pytest.raises(ValueError, match="unknown peer"):
        bench(tiny_model, str(short_prompts), "none", peers=["vllm"], progress=False)


def test_the_api_key_is_sent_to_peer_urls():
    """--api-key reached the --url server of the load mode but not a --peer-url (a 401 from llama-server)."""
    headers = []

    def handle(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {"completion_tokens": 1}})

    client = httpx.Client(transport=httpx.MockTransport(handle))
    URLPeer("http://127.0.0.1:8080", client=client, api_key="SECRET").generate([1], "p", 0.0, 1, None)
    URLPeer("http://127.0.0.1:8080", client=client).generate([1], "p", 0.0, 1, None)
    assert headers == ["Bearer SECRET", None]


def test_a_missing_optional_package_says_what_to_install(monkeypatch):
    import sys

    from specdec.bench.peers import optional_module

    monkeypatch.setitem(sys.modules, "transformers", None)  # what a plain `pip install specdec` has
    with pytest.raises(ValueError, match="--peers needs the transformers package.*pip install transformers=="):
        optional_module("transformers", "--peers")
    assert optional_module("json", "x") is json


def test_assisted_generation_s_first_tokens_are_not_counted_as_decoded(tiny_hf_dir):
    """transformers hands over the first step's accepted drafts with the first token, after the time the
    bench counts as prefill: counted as decoded tokens they inflated hf-assisted's tok/s (+7% at n=16)."""
    from specdec.bench.peers import HF_PEERS, HFModels, HFPeer

    assert "hf-assisted" in HF_PEERS
    hf = HFModels(tiny_hf_dir, tiny_hf_dir, "fp32", "fp32")
    peer = HFPeer("hf-assisted", hf, [], 3)  # no eos: the run goes to max_tokens
    out = peer.generate([5, 17, 33, 101], "", 0.0, 12, 0)
    assert out.output_tokens == 12 and out.prefill_tokens >= 2  # the first token with accepted drafts of its own
    assert out.decode_tokens_per_s == pytest.approx((12 - out.prefill_tokens) / out.decode_s)
    plain = HFPeer("hf-plain", hf, [], 3).generate([5, 17, 33, 101], "", 0.0, 12, 0)
    assert plain.prefill_tokens == 1 and plain.token_ids == out.token_ids


def test_a_peer_that_fails_is_recorded_and_the_bench_still_written(tiny_model, short_prompts, tmp_path):
    """One 500 from a peer ended the whole bench with nothing written; a dead peer is asked 3 times, no more."""
    from specdec.bench.method_bench import bench

    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if len(seen) == 1:
            return httpx.Response(200, json={"choices": [{"text": " hi"}], "usage": {"completion_tokens": 4}})
        return httpx.Response(500, text="boom")

    r = bench(tiny_model, str(short_prompts), "none", temperatures=[0.0], max_tokens=4, repeats=3, warmup=False,
              ctx_size=256, peer_urls=["http://localhost:9999"], url_client=httpx.Client(
                  transport=httpx.MockTransport(handle)), progress=False, out_dir=tmp_path)
    validate_results(r)
    peer_runs = [run for run in r["runs"] if run["config"].startswith("url:")]
    assert len(peer_runs) == 6 and len(seen) == 4  # 1 answer, 3 failures in a row, then not sent
    assert sum(run.get("error", "").startswith("peer http://localhost:9999/v1/comp") for run in peer_runs) == 3
    assert sum(run.get("error", "").startswith("not sent: the peer failed 3") for run in peer_runs) == 2
    assert all(run["decode_tokens_per_s"] is None for run in peer_runs if run.get("error"))
    row = next(s for s in r["summary"] if s["config"].startswith("url:") and s["category"] == "all")
    assert (row["runs"], row["failed_runs"]) == (1, 5)
    plain = next(s for s in r["summary"] if s["config"] == "none" and s["category"] == "all")
    assert (plain["runs"], plain["failed_runs"]) == (6, 0)
    md = (tmp_path / "report.md").read_text()
    assert "5 of 6 runs FAILED and are left out of its numbers (first: peer http://localhost:9999" in md
    assert json.loads((tmp_path / "results.json").read_text())["runs"] == r["runs"]


@pytest.mark.slow
def test_a_url_peer_gets_the_prompt_without_the_bos_its_server_adds(short_prompts):
    """The decoded ids began with the BOS's text, and the server put its own BOS before it (Gemma: 2 BOS).
    gemma3-270m's tokenizer adds a BOS to raw text and its chat template writes one."""
    from helpers.models import real_model
    from specdec.bench.method_bench import bench
    from specdec.bench.prompts import load_prompts
    from specdec.model.catalogue import model_path

    if not model_path("gemma3-270m").is_file():
        pytest.skip("gemma3-270m is not pulled (specdec pull gemma3-270m)")
    model = real_model("gemma3-270m", "int8")
    tok = model.tokenizer
    client, seen = _server({})
    bench(model, str(short_prompts), "none", temperatures=[0.0], max_tokens=4, repeats=1, warmup=False,
          ctx_size=256, peer_urls=["http://localhost:9999"], url_client=client, progress=False)
    rendered = [p.render(tok) for p in load_prompts(str(short_prompts))]
    bos = tok.decode([tok.bos_id])
    assert bos == "<bos>" and all(ids[0] == tok.bos_id != ids[1] for ids in rendered)
    sent = [body["prompt"] for _, body in seen]
    assert sent == [tok.decode(ids[1:]) for ids in rendered] and not any(text.startswith(bos) for text in sent)


def test_a_url_peer_gets_the_whole_prompt_from_a_tokenizer_without_bos(tiny_model, short_prompts):
    """The tiny model's BPE tokenizer adds no BOS: nothing is cut from the prompt's text."""
    from specdec.bench.method_bench import bench
    from specdec.bench.prompts import load_prompts

    tok = tiny_model.tokenizer
    client, seen = _server({})
    bench(tiny_model, str(short_prompts), "none", temperatures=[0.0], max_tokens=4, repeats=1, warmup=False,
          ctx_size=256, peer_urls=["http://localhost:9999"], url_client=client, progress=False)
    rendered = [p.render(tok) for p in load_prompts(str(short_prompts))]
    assert not tok.add_bos and [body["prompt"] for _, body in seen] == [tok.decode(ids) for ids in rendered]


@pytest.mark.parametrize("extra, message", [
    (["--peer-url", "http://127.0.0.1:abc"], "--peer-url 'http://127.0.0.1:abc' is not a valid URL"),
    (["--peer-url", "localhost:8080"], "--peer-url 'localhost:8080' is not an http"),
    (["--peer-url", "http://127.0.0.1:9/v1", "--peer-url", "http://127.0.0.1:9"], "names http://127.0.0.1:9 twice"),
    (["--peers", "hf-plain,vllm"], "choose each at most once from hf-plain"),
    (["--peers", "hf-plain,hf-plain"], "choose each at most once from hf-plain"),
])
def test_bad_peers_are_one_error_before_the_model_loads(tmp_path, capsys, extra, message):
    from specdec.cli import main

    rc = main(["bench", "--model", "/nonexistent/m.gguf", "--out", str(tmp_path / "o"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err and "nonexistent" not in err
