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


def test_the_shipped_constraints_accept_the_scripted_answers(tiny_model):
    """--constrain on: invoice-json's schema holds every scripted answer, and each tool session's call grammar
    each scripted call (written on the template's lines), so constrained turns ask for what the script wrote."""
    from specdec.engine.constrain import compile_for
    from specdec.sampling.grammar import GrammarState

    sessions = {s.id: s for s in load_sessions()}
    assert sessions["invoice-json"].response_format["type"] == "json_schema"
    checked = 0
    for s in sessions.values():
        for t, answer in enumerate(s.answers(), 1):
            c = s.constraint(t)
            if c is None:
                assert s.tools and not answer.startswith("<tool_call>")  # a tool session's closing words
                continue
            if c[0] == "gbnf":
                answer = answer.replace("<tool_call>", "<tool_call>\n").replace("</tool_call>", "\n</tool_call>")
            state = GrammarState(compile_for(tiny_model, *c))
            state.advance(tiny_model.tokenizer.encode(answer, add_bos=False))
            assert state.matcher.is_accepting(), (s.id, t)
            checked += 1
    assert checked == 13  # 5 JSON answers and 4 calls in each tool session
