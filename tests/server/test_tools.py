"""OpenAI tools on the chat endpoint (server/tools.py): calls rendered with the model's own chat template,
constrained to the function's schema when required or named, parsed back into tool_calls, and tool results
sent back in a second turn; on qwen2.5-coder-0.5b (its template writes <tool_call> blocks) with the openai
client. Bad tools are OpenAI's 400s on the tiny server."""

from __future__ import annotations

import json

import openai
import pytest

from server.conftest import _serve
from specdec.server.tools import call_grammar, parse_calls

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                         "parameters": {"type": "object", "properties": {}}}}


def test_calls_are_parsed_back_and_other_text_kept():
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    content, calls = parse_calls(text)
    assert content == "Let me look."  # the whitespace before the call dropped
    assert calls == [{"id": "call_0", "type": "function",
                      "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    assert parse_calls("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])
    assert call_grammar([WEATHER], "auto") is None and call_grammar([WEATHER], "none") is None
    named = call_grammar([WEATHER, TIME], {"type": "function", "function": {"name": "get_time"}})
    assert "get_time" in named and "get_weather" not in named


@pytest.mark.parametrize("body, param, message", [
    ({"tools": [{"type": "function"}]}, "tools.0", "tools[0] must be"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "tool_choice names 'nope', which is not among the tools (get_weather)"),
    ({"tool_choice": "required"}, "tool_choice", "tool_choice needs tools"),
    ({"tools": [WEATHER]}, "tools", "this model's chat template writes no <tool_call> blocks"),
])
def test_bad_tools_are_a_400(tiny_server, body, param, message):
    with pytest.raises(openai.BadRequestError) as err:
        tiny_server.client().chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                     max_tokens=4, **body)
    assert err.value.body["param"] == param and message in err.value.body["message"]


@pytest.fixture(scope="module")
def qwen_server():
    from helpers.models import real_model
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine

    engine = Engine(real_model("qwen2.5-coder-0.5b", "gguf"), SpecConfig(drafters=("suffix",)), max_len=1024)
    thread, served = _serve(engine, "qwen", None)
    yield served
    thread.stop()


@pytest.mark.slow
def test_a_two_turn_tool_round_trip(qwen_server):
    client = qwen_server.client()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.create(model="qwen", messages=messages, tools=[WEATHER, TIME],
                                           tool_choice="required", temperature=0, max_tokens=40)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.function.name in ("get_weather", "get_time")
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    assert first.model_extra["spec"]["by_drafter"]["grammar"]["accepted"] > 0  # the call's skeleton, drafted
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "cloudy"}'}]
    second = client.chat.completions.create(model="qwen", messages=messages, tools=[WEATHER, TIME],
                                            temperature=0, max_tokens=40)
    answer = second.choices[0]
    assert answer.finish_reason in ("stop", "length") and not answer.message.tool_calls
    assert "18" in answer.message.content  # the tool's result reached the prompt
    # streamed: the same call, as tool_calls deltas, and finish_reason tool_calls
    chunks = list(client.chat.completions.create(model="qwen", messages=messages[:1], tools=[WEATHER, TIME],
                                                 tool_choice="required", temperature=0, max_tokens=40, stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = [t for d in deltas for t in (d.tool_calls or [])]  # the name first, then argument fragments
    assert [t.index for t in streamed] == [0] * len(streamed) and streamed[0].id == call.id
    assert (streamed[0].function.name, "".join(t.function.arguments for t in streamed)) == (
        call.function.name, call.function.arguments)
    assert "".join(d.content or "" for d in deltas) == ""
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.slow
def test_auto_on_a_real_model_as_it_answers(qwen_server):
    """tool_choice "auto" on qwen2.5-coder-0.5b, greedy. Asked for the weather, this model writes the call's JSON
    but without the <tool_call> tags its own template asks for, so the server reads no call: the JSON is the
    answer's content (Hermes' format is the tagged block; an untagged object could be any JSON the user asked
    for). Asked what no tool serves, it answers in text. tool_choice "required" or a named function is how to
    get this model's calls (test_a_two_turn_tool_round_trip); a model that tags its calls has them read back
    under "auto" (tests/server/test_tool_stream.py reads such answers)."""
    client = qwen_server.client()

    def ask(question: str, max_tokens: int):
        return client.chat.completions.create(model="qwen", messages=[{"role": "user", "content": question}],
                                              tools=[WEATHER, TIME], tool_choice="auto", temperature=0,
                                              max_tokens=max_tokens).choices[0]

    weather = ask("What is the weather in Paris?", 24)
    assert weather.message.tool_calls is None and weather.finish_reason == "stop"
    assert json.loads(weather.message.content) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    sum_ = ask("What is 2 + 2? Reply with just the number.", 8)
    assert sum_.message.tool_calls is None and sum_.finish_reason == "stop" and sum_.message.content == "4"
