"""OpenAI tools on the chat endpoint, for models whose chat template writes calls as Hermes-style
<tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Qwen2.5, Qwen3, Hermes, SmolLM3 templates).

    check_tools(body, chat_template)                 # OpenAI's 400s for tools the server cannot serve
    grammar_text = call_grammar(tools, tool_choice)  # "required" / a named function: the call is constrained
    messages = template_messages(body.messages)      # assistant tool_calls and tool results for the template
    content, calls = parse_calls(text)               # the answer back into OpenAI's tool_calls

tool_choice "none" renders no tools and leaves the answer free; "auto" renders them and the model decides
(its calls are parsed back); "required" and {"type": "function", "function": {"name": ...}} constrain the
answer to one call of the allowed functions, its arguments following the function's parameters schema.
Streamed, the text before the first <tool_call> goes out as it comes (CallStream holds back only what could
be the start of one), and the calls go out as tool_calls deltas when the answer ends.
"""

from __future__ import annotations

import json
import re

from specdec.server.schemas import APIError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
# the template writes '{"name": "f", "arguments": {...}}': the constrained call is written the same way
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def check_tools(tools, tool_choice, chat_template: str | None) -> None:
    """400 for malformed tools, a tool_choice naming no given function, a template without tool calls."""
    if tool_choice not in (None, "none", "auto", "required") and not (
            isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
            and isinstance((tool_choice.get("function") or {}).get("name"), str)):
        raise APIError(400, 'tool_choice must be "none", "auto", "required" or {"type": "function", "function": '
                       '{"name": ...}}', param="tool_choice", code="invalid_value")
    if not tools:
        if tool_choice not in (None, "none"):
            raise APIError(400, "tool_choice needs tools", param="tool_choice", code="invalid_value")
        return
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                or not isinstance(fn.get("parameters", {}), dict):
            raise APIError(400, f'tools[{i}] must be {{"type": "function", "function": {{"name": ..., '
                           '"parameters": {...}}}}', param=f"tools.{i}", code="invalid_value")
    if isinstance(tool_choice, dict) and tool_choice["function"]["name"] not in names(tools):
        raise APIError(400, f"tool_choice names {tool_choice['function']['name']!r}, which is not among the tools "
                       f"({', '.join(names(tools))})", param="tool_choice", code="invalid_value")
    if tool_choice != "none" and (not chat_template or OPEN not in chat_template):
        raise APIError(400, "this model's chat template writes no <tool_call> blocks, so the server cannot "
                       "render tools for it or read its calls back", param="tools", code="unsupported")


def names(tools) -> list[str]:
    return [t["function"]["name"] for t in tools]


def call_grammar(tools, tool_choice) -> str | None:
    """A Lark grammar (llguidance's) of one call for "required" or a named function; None otherwise."""
    if not tools or tool_choice in (None, "none", "auto"):
        return None
    allowed = [t["function"] for t in tools
               if not isinstance(tool_choice, dict) or t["function"]["name"] == tool_choice["function"]["name"]]
    schema = {"anyOf": [{"type": "object", "properties": {
        "name": {"const": fn["name"]}, "arguments": fn.get("parameters") or {"type": "object"}},
        "required": ["name", "arguments"], "additionalProperties": False} for fn in allowed],
        "x-guidance": LAYOUT}
    return f'start: "{OPEN}\\n" call "\\n{CLOSE}"\ncall: %json {json.dumps(schema)}\n'


def template_messages(messages) -> list[dict]:
    """The chat template's messages: an assistant turn's tool_calls with their arguments as objects (the
    template writes them with tojson), a tool result's content as text."""
    out = []
    for m in messages:
        d = m.as_template_dict()
        if m.tool_calls:
            calls = []
            for call in m.tool_calls:
                fn = dict(call.get("function") or {}) if isinstance(call, dict) else {}
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError:
                        pass  # written as the client sent it
                calls.append({**call, "function": fn})
            d["tool_calls"] = calls
        out.append(d)
    return out


def parse_calls(text: str) -> tuple[str | None, list[dict]]:
    """(the answer's text outside its calls, or None; OpenAI tool_calls) from <tool_call> blocks. A block that
    is not a JSON call stays in the text."""
    calls, kept, last = [], [], 0
    for match in _CALL.finditer(text):
        try:
            value = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(value, dict) or not isinstance(value.get("name"), str):
            continue
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append({"id": f"call_{len(calls)}", "type": "function", "function": {
            "name": value["name"], "arguments": json.dumps(value.get("arguments", {}))}})
    kept.append(text[last:])
    content = "".join(kept).strip()
    return content or None, calls


class CallStream:
    """A streamed answer split into the text to send now and the calls to send at the end.

    feed(delta) -> the text that can go out now (none of a <tool_call> block, nor a tail that may start one);
    finish() -> (the rest of the text outside calls, the calls as parse_calls gives them)."""

    def __init__(self):
        self.sent = 0  # characters of self.text already given out
        self.text = ""

    def feed(self, delta: str) -> str:
        self.text += delta
        start = self.text.find(OPEN, self.sent)
        if start < 0:  # hold back the longest tail that is a prefix of OPEN
            start = len(self.text) - next((k for k in range(min(len(OPEN) - 1, len(self.text)), 0, -1)
                                           if self.text.endswith(OPEN[:k])), 0)
        out, self.sent = self.text[self.sent:start], max(self.sent, start)
        return out

    def finish(self) -> tuple[str, list[dict]]:
        content, calls = parse_calls(self.text[self.sent:])
        if not calls:  # no call after all: the held text is the answer's
            return self.text[self.sent:], []
        return content or "", calls
