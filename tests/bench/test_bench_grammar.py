"""The method bench under a grammar (specdec bench --json-schema / --grammar): every specdec request follows
it, the baseline's too, so greedy speculative output is compared with plain output under the same grammar."""

from __future__ import annotations

import json

import httpx
import pytest

import specdec.cli  # noqa: F401 (first: specdec.bench.method_bench and specdec.cli import each other)
from bench_helpers import short_prompts  # noqa: F401 (a fixture)
from specdec.engine.constrain import compile_for

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "blue"]}},
          "required": ["ok", "tag"], "additionalProperties": False}


def test_every_run_follows_the_grammar_and_speculation_matches_plain(tiny_model, short_prompts, monkeypatch):
    from specdec.bench import runner
    from specdec.bench.method_bench import bench

    grammar = compile_for(tiny_model, "json_schema", json.dumps(SCHEMA))
    texts = []
    real = runner.run_specdec

    def run_specdec(engine, method, ids, sampling, max_tokens):
        out = real(engine, method, ids, sampling, max_tokens)
        texts.append(out.text)
        return out

    monkeypatch.setattr(runner, "run_specdec", run_specdec)
    r = bench(tiny_model, str(short_prompts), "none,ngram-simple", temperatures=[0.0], max_tokens=40, repeats=1,
              warmup=False, ctx_size=256, progress=False, grammar=grammar)
    assert r["settings"]["grammar"] == {"kind": "json_schema", "text": json.dumps(SCHEMA)}
    assert len(texts) == len(r["runs"]) > 0
    for text in texts:
        assert json.loads(text)["tag"] in ("red", "blue"), text
    row = next(s for s in r["summary"] if s["config"] == "ngram-simple" and s["category"] == "all")
    assert row["greedy_identical"]["identical"] == row["greedy_identical"]["compared"] > 0


def test_a_url_peer_gets_the_grammar_and_hugging_face_peers_are_refused(tiny_model, short_prompts):
    from specdec.bench.method_bench import bench

    seen = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"choices": [{"text": "a"}], "usage": {"completion_tokens": 1}})

    client = httpx.Client(transport=httpx.MockTransport(handle))
    for kind, text, field in (("gbnf", 'root ::= "a"', {"grammar": 'root ::= "a"'}),
                              ("json_schema", json.dumps(SCHEMA), {"json_schema": SCHEMA})):
        seen.clear()
        bench(tiny_model, str(short_prompts), "none", max_tokens=4, repeats=1, warmup=False, ctx_size=256,
              peer_urls=["http://localhost:9999"], url_client=client, progress=False,
              grammar=compile_for(tiny_model, kind, text))
        assert seen and all(body.items() >= field.items() for body in seen)  # llama-server's own fields
    with pytest.raises(ValueError, match="the Hugging Face peers .--peers. would answer unconstrained"):
        bench(tiny_model, str(short_prompts), "none", peers=["hf-plain"], progress=False, warmup=False,
              ctx_size=256, grammar=compile_for(tiny_model, "json_object", ""))
