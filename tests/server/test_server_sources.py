"""Where each streamed token came from (stream_options.include_sources), the verdict in `spec`, and the chat
page's route, on the tiny test server (ngram-simple speculation, an API key)."""

from __future__ import annotations

import json
import re

import pytest

from specdec.model.text_stream import TextStream

MESSAGES = [{"role": "user", "content": "Say hi"}]  # the tiny model's answer falls into a loop ngram-simple drafts
N = 40


def stream_chunks(served, body: dict, n: int = N) -> list[dict]:
    with served.http(headers={"Authorization": f"Bearer {served.api_key}"}) as http:
        response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": n, "temperature": 0,
                                                           "stream": True, **body})
    assert response.status_code == 200, response.text
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def expected_characters(tokenizer, result) -> list[str]:
    """The source of each character of the answer, from the engine's sources and the text's tokens."""
    stream = TextStream(tokenizer, (), skip_special=True, track_tokens=True)
    stream.finish(result.text, result.token_ids)
    return [result.source_names[result.sources[i]] for i, n in stream.pieces(0, len(result.text)) for _ in range(n)]


@pytest.mark.parametrize("n", [N - 3, N - 2, N - 1, N])  # the last step's tokens differ: a draft, or none
def test_each_chunk_names_where_its_characters_came_from(tiny_server, tiny_reference, n):
    chunks = stream_chunks(tiny_server, {"stream_options": {"include_sources": True}}, n)
    expected = tiny_reference.generate(tiny_reference.chat_ids(MESSAGES), n, spec=tiny_server.engine.spec)
    text, characters, tokens = "", [], 0
    for chunk in chunks:
        content = chunk["choices"][0]["delta"].get("content") if chunk["choices"] else None
        if not content:
            assert "specdec" not in chunk  # only chunks with text carry sources
            continue
        extra = chunk["specdec"]
        assert set(extra) == {"sources", "tokens", "drafted", "accepted"}
        assert sum(n for _, n in extra["sources"]) == len(content) and all(n > 0 for _, n in extra["sources"])
        assert extra["tokens"] >= tokens and extra["accepted"] <= extra["drafted"]
        tokens = extra["tokens"]
        text += content
        characters += [source for source, n in extra["sources"] for _ in range(n)]
    assert text == expected.text
    assert characters == expected_characters(tiny_reference.model.tokenizer, expected)
    assert {"target", "ngram-simple"} == set(characters)  # drafts were accepted, and the target made the rest
    spec = chunks[-1]["spec"]
    assert spec["accepted"] == expected.stats.accepted and spec["verdict"]["decode_s"] > 0


def test_a_stream_that_does_not_ask_carries_no_sources(tiny_server):
    for body in ({}, {"stream_options": {"include_usage": True}}, {"stream_options": {"include_sources": False}}):
        chunks = stream_chunks(tiny_server, body)
        assert not any("specdec" in c for c in chunks)
        last = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
        assert "verdict" in last["spec"]


@pytest.mark.parametrize("value", ["yes", 1])
def test_include_sources_must_be_true_or_false(tiny_server, value):
    with tiny_server.http(headers={"Authorization": f"Bearer {tiny_server.api_key}"}) as http:
        response = http.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "stream": True,
                                                           "stream_options": {"include_sources": value}})
    assert response.status_code == 400, response.text
    assert "include_sources" in response.json()["error"]["message"] + str(response.json()["error"]["param"])


def test_an_answer_carries_the_verdict_and_speculation_off_says_so(tiny_server):
    with tiny_server.http(headers={"Authorization": f"Bearer {tiny_server.api_key}"}) as http:
        body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "speculative": {"enabled": False}}
        off = http.post("/v1/chat/completions", json=body).json()["spec"]
    assert off["rollback_s"] == 0.0
    verdict = off["verdict"]
    assert verdict["reason"] == "not_configured" and verdict["estimate_from"] == "own_plain_steps"
    assert verdict["speedup"] == pytest.approx(1.0, rel=1e-6)  # a plain request priced by its own steps


def test_the_chat_page_needs_no_key_and_fetches_nothing_from_elsewhere(tiny_server):
    with tiny_server.http() as http:  # no API key
        page = http.get("/")
        assert http.get("/v1/models").status_code == 401  # the API still needs it
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    html = page.text
    assert 'id="messages"' in html and "/v1/chat/completions" in html and "include_sources" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)  # no CDN, no remote script or style
    assert "http://" not in html and "https://" not in html and "import " not in html
