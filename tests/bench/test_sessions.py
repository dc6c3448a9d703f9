"""The agentic session set (src/specdec/bench/sets/agentic.jsonl) and its runner (bench/sessions.py) on the tiny model:
later turns reuse the conversation's rows (a count), and speculative turns are plain turns token for token."""

from __future__ import annotations

import json

import pytest

from specdec.bench.sessions import DEFAULT_SESSIONS, Session, load_sessions, render, run_session, spec_of
from specdec.engine.engine import Engine


def test_the_set_is_multi_turn_agent_work():
    sessions = load_sessions()
    assert len(sessions) >= 3 and all(len(s.turns()) >= 5 for s in sessions)
    roles = {m["role"] for s in sessions for m in s.messages}
    assert {"system", "user", "assistant", "tool"} <= roles
    calls = [m["content"] for s in sessions for m in s.messages if m["content"].startswith("<tool_call>")]
    assert calls and all(json.loads(c.removeprefix("<tool_call>").removesuffix("</tool_call>"))["name"] for c in calls)
    meta = json.loads(DEFAULT_SESSIONS.read_text().splitlines()[0])["_meta"]
    assert "no evaluation set" in meta["source"]


def test_a_session_without_an_assistant_turn_is_refused(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"id": "x", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    with pytest.raises(ValueError, match="s.jsonl:1: a session needs 'messages' with at least one assistant message"):
        load_sessions(path)


def test_turns_reuse_the_conversation_and_speculation_changes_no_token(tiny_model):
    full = load_sessions()[1]  # the JSON extraction session: short turns; its first 2 fit the tiny context
    session = Session(full.id, full.category, full.messages[:5])
    plain = run_session(Engine(tiny_model, max_len=512, prefix_cache="on"), session, 6)
    spec = run_session(Engine(tiny_model, max_len=512, prefix_cache="on"), session, 6, spec_of("ngram-simple"))
    assert len(plain) == 2
    assert [t.token_ids for t in spec] == [t.token_ids for t in plain]
    assert plain[0].cached_tokens == 0
    turns = session.turns()
    for t in range(1, len(plain)):
        previous = len(render(tiny_model.tokenizer, turns[t - 1]))
        assert previous <= plain[t].cached_tokens < plain[t].prompt_tokens  # the whole last prompt is reused
