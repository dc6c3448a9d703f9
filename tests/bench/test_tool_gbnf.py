"""bench/tool_gbnf.py: the GBNF llama-server gets on the sessions' tool turns holds the same calls as specdec's
own call grammar (server/tools.py), read here by specdec's grammar engine (llguidance reads GBNF too): every
scripted call of the shipped set, and no call of another name, a missing argument or another layout."""

from __future__ import annotations

import pytest

from specdec.bench.sessions import load_sessions
from specdec.bench.tool_gbnf import call_gbnf
from specdec.engine.constrain import compile_for
from specdec.sampling.grammar import GrammarState


def accepts(model, kind: str, text: str, answer: str) -> bool:
    state = GrammarState(compile_for(model, kind, text))
    try:
        state.advance(model.tokenizer.encode(answer, add_bos=False))
    except RuntimeError:
        return False
    return state.matcher.is_accepting()


def on_lines(call: str) -> str:  # the template's layout, which both grammars write
    return call.replace("<tool_call>", "<tool_call>\n").replace("</tool_call>", "\n</tool_call>")


def test_the_gbnf_holds_the_calls_specdecs_call_grammar_holds(tiny_model):
    checked = 0
    for s in load_sessions():
        if not s.tools:
            continue
        gbnf = call_gbnf(list(s.tools))
        for t, answer in enumerate(s.answers(), 1):
            if s.constraint(t) is None:
                continue
            call = on_lines(answer)
            assert accepts(tiny_model, "gbnf", gbnf, call) and accepts(tiny_model, *s.constraint(t), call)
            checked += 1
        wrong = [on_lines('<tool_call>{"name": "delete_repo", "arguments": {"path": "x"}}</tool_call>'),
                 on_lines('<tool_call>{"name": "read_file", "arguments": {}}</tool_call>'),
                 on_lines('<tool_call>{"name":"read_file","arguments":{"path":"x"}}</tool_call>'),
                 on_lines('<tool_call>{"name": "write_file", "arguments": {"path": "x","text": "y"}}</tool_call>'),
                 on_lines('<tool_call>{"name": "write_file", "arguments": {"text": "y", "path": "x"}}</tool_call>'),
                 '<tool_call>{"name": "read_file", "arguments": {"path": "x"}}</tool_call>']
        for call in wrong:
            assert not accepts(tiny_model, "gbnf", gbnf, call), call
            assert not accepts(tiny_model, *s.constraint(1), call), call
    assert checked == 8


def test_a_parameter_it_cannot_write_is_refused():
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "object"}}, "required": ["x"], "additionalProperties": False}}}
    with pytest.raises(ValueError, match="tool f, parameter x: a parameter of type"):
        call_gbnf([tool])
    loose = {"type": "function", "function": {"name": "g", "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}}}}}
    with pytest.raises(ValueError, match="tool g: its parameters must all be required"):
        call_gbnf([loose])
