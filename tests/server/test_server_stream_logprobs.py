"""Logprobs on streamed answers (tiny model, ngram-simple speculation): joined over the chunks they are the
unstreamed answer's, each token once, in order, with and without speculation, on both endpoints; a chunk's
tokens spell its text; a stop string's held-back text loses no token."""

from __future__ import annotations

import json
import re

import pytest
from conftest import _serve

from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine

CHAT = [{"role": "user", "content": "Say hi"}]  # the tiny model's answer loops: drafts are accepted


@pytest.fixture(scope="module")
def served(tiny_model):
    engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",)), max_len=1024, max_sequences=2)
    thread, served = _serve(engine, "tiny", None)
    yield served
    thread.stop()


def post(served, route: str, body: dict) -> dict:
    with served.http() as http:
        reply = http.post(route, json=body)
    assert reply.status_code == 200, reply.text
    return reply.json()


def stream(served, route: str, body: dict) -> list[dict]:
    """The stream's chunks (the JSON of each `data:` line before [DONE])."""
    chunks = []
    with served.http() as http, http.stream("POST", route, json={**body, "stream": True}) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def chunk_text(chunk: dict, chat: bool) -> str:
    choice = chunk["choices"][0]
    return (choice["delta"].get("content") or "") if chat else choice["text"]


def spells(tokens: list[str], text: str) -> bool:
    """Whether tokens' texts joined are text, a run of U+FFFD (tokens holding parts of a character, each
    read alone) standing for the characters they make up."""
    parts = re.split("(\ufffd+)", "".join(tokens))
    return re.fullmatch("".join(".+" if p.startswith("\ufffd") else re.escape(p) for p in parts), text,
                        re.DOTALL) is not None


def joined(chunks: list[dict], chat: bool) -> dict:
    """The chunks' logprobs joined into one unstreamed answer's object."""
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    if chat:
        return {"content": [e for p in parts for e in p["content"]], "refusal": None}
    return {key: [v for p in parts for v in p[key]] for key in ("tokens", "token_logprobs", "top_logprobs",
                                                                 "text_offset")}


@pytest.mark.parametrize("speculate", [True, False])
@pytest.mark.parametrize("chat", [True, False])
def test_streamed_logprobs_joined_are_the_unstreamed_ones(served, chat, speculate):
    route = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"max_tokens": 40, "temperature": 0, "speculative": {"enabled": speculate},
            **({"messages": CHAT, "logprobs": True, "top_logprobs": 2} if chat else {"prompt": "Say hi",
                                                                                     "logprobs": 2})}
    whole = post(served, route, body)
    chunks = stream(served, route, body)
    assert (chunks[-1]["spec"]["accepted"] > 0) == speculate  # speculation ran, or did not
    want = whole["choices"][0]["logprobs"]
    assert len(want["content"] if chat else want["tokens"]) == whole["usage"]["completion_tokens"]
    assert joined(chunks, chat) == want  # every token once, in order, its top ones and offsets too
    assert "".join(chunk_text(c, chat) for c in chunks) == (whole["choices"][0]["message"]["content"] if chat
                                                            else whole["choices"][0]["text"])
    for c in chunks[:-1]:  # a chunk's tokens spell its text (no stop string: whole tokens are sent)
        lp = c["choices"][0]["logprobs"]
        tokens = [e["token"] for e in lp["content"]] if chat and lp else (lp or {}).get("tokens", [])
        assert spells(tokens, chunk_text(c, chat))


def test_a_stop_strings_held_back_text_loses_no_token(served):
    body = {"prompt": "Say hi", "max_tokens": 40, "temperature": 0, "logprobs": 1}
    text = post(served, "/v1/completions", body)["choices"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 4]  # cut mid-answer: text is held back, tokens are cut
    assert len(stop) == 4 and stop.strip()
    body["stop"] = [stop]
    whole = post(served, "/v1/completions", body)
    assert whole["choices"][0]["finish_reason"] == "stop"
    chunks = stream(served, "/v1/completions", body)
    assert joined(chunks, chat=False) == whole["choices"][0]["logprobs"]
    assert "".join(chunk_text(c, False) for c in chunks) == whole["choices"][0]["text"]


def test_no_streamed_logprobs_unless_asked(served):
    chunks = stream(served, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4})
    assert all(c["choices"][0]["logprobs"] is None for c in chunks)
