"""Streamed tool calls (server/tools.py, CallParser): the incremental reader on every split of known answers, its
rules for blocks that are not calls or do not end, and the tiny model's streamed tool_calls deltas assembled
against its non-streamed answer under a forced call (tool_choice required or named)."""

from __future__ import annotations

import json

import pytest

from server.conftest import _serve
from specdec.server.tools import CallParser, assemble

ANSWER = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris} [x", "days": [1, '
          '{"a": "</tool_call>"}]}}\n</tool_call>\n<tool_call>\n{"name": "get_time"}\n</tool_call>\nDone.')
CALLS = [{"id": "call_0", "type": "function", "function": {
             "name": "get_weather", "arguments": '{"city": "Pa\\"ris} [x", "days": [1, {"a": "</tool_call>"}]}'}},
         {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]


def read(pieces) -> list:
    parser = CallParser()
    return [e for piece in pieces for e in parser.feed(piece)] + parser.finish()


def check_deltas(events) -> None:
    """OpenAI's delta order: a call's header (index, id, type, name, empty arguments) first, then fragments of
    its arguments only, indexes 0, 1, ... in order."""
    begun = -1
    for kind, delta in events:
        if kind != "tool_call":
            continue
        if "id" in delta:
            assert delta["index"] == begun + 1 and delta["function"]["arguments"] == "" and delta["type"] == "function"
            begun += 1
        else:
            assert delta["index"] == begun and set(delta) == {"index", "function"} and set(delta["function"]) == {
                "arguments"}


def test_the_known_answer_and_every_split_of_it():
    whole = read([ANSWER])
    assert assemble(whole) == ("Let me look.\nDone.", CALLS)
    check_deltas(whole)
    for cut in range(len(ANSWER) + 1):
        events = read([ANSWER[:cut], ANSWER[cut:]])
        check_deltas(events)
        assert assemble(events) == (("Let me look.\nDone.", CALLS)), cut
    for step in (1, 2, 3, 7):
        events = read([ANSWER[i:i + step] for i in range(0, len(ANSWER), step)])
        check_deltas(events)
        assert assemble(events) == ("Let me look.\nDone.", CALLS), step


def test_names_and_arguments_go_out_as_they_are_written():
    parser = CallParser()
    upto_name = ANSWER.index('"get_weather"') + len('"get_weather"')
    first = parser.feed(ANSWER[:upto_name - 1])
    assert first == [("content", "Let me look.")]  # the newline held, then dropped before the call
    assert parser.feed('"') == [("tool_call", {"index": 0, "id": "call_0", "type": "function",
                                               "function": {"name": "get_weather", "arguments": ""}})]
    args = CALLS[0]["function"]["arguments"]
    start = ANSWER.index(args)
    sent = parser.feed(ANSWER[upto_name:start + 10])
    assert sent == [("tool_call", {"index": 0, "function": {"arguments": args[:10]}})]
    assert parser.feed(ANSWER[start + 10:start + 11]) == [("tool_call", {"index": 0, "function": {
        "arguments": args[10]}})]


@pytest.mark.parametrize("text, content, calls", [
    # not a call: the block is content as written, and a real call after it still counts
    ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>", []),
    ('<tool_call>{"arguments": {}, "name": "f"}</tool_call>', '<tool_call>{"arguments": {}, "name": "f"}</tool_call>',
     []),
    ('x <tool_call>{"name": "bad\x01"}', 'x <tool_call>{"name": "bad\x01"}', []),
    ('<tool_call><tool_call>{"name": "f", "arguments": {}}</tool_call>', "<tool_call>", [("f", "{}")]),
    # an answer that ends before the name is out: content; "<tool" at the end too
    ('Hi <tool_call>\n{"name": "get_wea', 'Hi <tool_call>\n{"name": "get_wea', []),
    ("a <tool", "a <tool", []),
    ("plain text  \n", "plain text  \n", []),
    # an answer that ends inside a call (max_tokens): the call with the arguments written so far
    ('x <tool_call>{"name": "f", "arguments": {"a": "b', "x", [("f", '{"a": "b')]),
    ('<tool_call>{"name": "f", "argu', None, [("f", "")]),
    # a call that leaves the shape: it ends there, and the rest is content
    ('<tool_call>{"name": "f", "arguments": {"a": 1}, "x": 2}</tool_call> ok', ', "x": 2}</tool_call> ok',
     [("f", '{"a": 1}')]),
    ('<tool_call>{"name": "f", "arguments": [1]}</tool_call>', '[1]}</tool_call>', [("f", "")]),
])
def test_blocks_that_are_not_calls_or_do_not_end(text, content, calls):
    for pieces in ([text], list(text)):
        got_content, got_calls = assemble(read(pieces))
        assert got_content == content
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls


# The tiny model with a chat template that renders tools and writes <tool_call> blocks (Hermes' layout)
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }} {% endfor %}"
    "(<tool_call>)<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# closed schemas of short values: the random model's forced call ends within max_tokens
LIGHT = {"type": "function", "function": {"name": "light", "parameters": {
    "type": "object", "properties": {"on": {"type": "boolean"}, "room": {"enum": ["hall", "den"]}},
    "required": ["on", "room"], "additionalProperties": False}}}
UNIT = {"type": "function", "function": {"name": "unit", "parameters": {
    "type": "object", "properties": {"u": {"enum": ["c", "f"]}}, "required": ["u"], "additionalProperties": False}}}


@pytest.fixture(scope="module")
def tools_server(tiny_hf_dir):
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine
    from specdec.model.load import load_model

    model = load_model(str(tiny_hf_dir), "fp32", progress=False)  # its own tokenizer, given the tools template
    model.tokenizer.chat_template = TOOLS_TEMPLATE
    engine = Engine(model, SpecConfig(drafters=("ngram-simple",)), max_len=512, max_sequences=2)
    thread, served = _serve(engine, "tiny-tools", None)
    yield served
    thread.stop()


@pytest.mark.parametrize("choice, max_tokens, sampling", [
    ("required", 120, {"temperature": 0}),
    ({"type": "function", "function": {"name": "unit"}}, 120, {"temperature": 0}),
    ("required", 120, {"temperature": 1.0, "seed": 7}),
    ({"type": "function", "function": {"name": "light"}}, 55, {"temperature": 0}),  # cut inside the arguments
])
def test_streamed_deltas_assemble_to_the_non_streamed_answer(tools_server, choice, max_tokens, sampling):
    client = tools_server.client()
    kwargs = dict(model="tiny-tools", messages=[{"role": "user", "content": "Lights on in the hall"}],
                  tools=[LIGHT, UNIT], tool_choice=choice, max_tokens=max_tokens, logprobs=True, **sampling)
    whole = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    events = [e for d in deltas for e in ([("content", d.content)] if d.content else []) + [
        ("tool_call", t.model_dump(exclude_none=True)) for t in (d.tool_calls or [])]]
    check_deltas(events)
    content, calls = assemble(events)
    assert content == whole.message.content
    assert calls == [c.model_dump() for c in whole.message.tool_calls]
    assert len(calls) == 1 and calls[0]["function"]["name"] in ("light", "unit")
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    if max_tokens == 55:
        assert whole.finish_reason == "length"
        with pytest.raises(json.JSONDecodeError):
            json.loads(calls[0]["function"]["arguments"])
    else:
        assert whole.finish_reason == "tool_calls"
        arguments = json.loads(calls[0]["function"]["arguments"])
        assert set(arguments) == ({"u"} if calls[0]["function"]["name"] == "unit" else {"on", "room"})
    # the name went out as soon as it was written, the arguments as they came: a chunk carries the logprobs
    # of the tokens that arrived since the one before, so those up to the header's are not the whole answer
    choices = [c.choices[0] for c in chunks if c.choices]
    (header,) = [i for i, d in enumerate(deltas) for t in (d.tool_calls or []) if t.id]
    fragments = [i for i, d in enumerate(deltas) for t in (d.tool_calls or []) if not t.id]
    before = sum(len(c.logprobs.content) for c in choices[:header + 1] if c.logprobs)
    assert 0 < before < len(whole.logprobs.content) and len(fragments) > 1 and header < fragments[0]
