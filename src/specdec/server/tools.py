"""OpenAI tools on the chat endpoint, for models whose chat template writes calls as Hermes-style
<tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks (Qwen2.5, Qwen3, Hermes, SmolLM3 templates).

    check_tools(body, chat_template)                 # OpenAI's 400s for tools the server cannot serve
    grammar_text = call_grammar(tools, tool_choice)  # "required" / a named function: the call is constrained
    messages = template_messages(body.messages)      # assistant tool_calls and tool results for the template
    content, calls = parse_calls(text)               # the answer back into OpenAI's tool_calls
    parser = CallParser(); parser.feed(delta)        # the same, streamed: content and tool_calls deltas

tool_choice "none" renders no tools and leaves the answer free; "auto" renders them and the model decides
(its calls are parsed back); "required" and {"type": "function", "function": {"name": ...}} constrain the
answer to one call of the allowed functions, its arguments following the function's parameters schema.
Streamed, the text before the first <tool_call> goes out as it comes, and each call as OpenAI and vLLM stream
them: its index, id, type and name as soon as the name is written, then its arguments' text in fragments as it
is generated (CallParser below: the reading rules, the same for the streamed and the whole answer).
"""

from __future__ import annotations

import json

from specdec.server.schemas import APIError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
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
    """(the answer's text outside its calls, or None; OpenAI tool_calls) from its <tool_call> blocks, read as a
    stream of it would be (CallParser): a block that is not a call stays in the text."""
    parser = CallParser()
    return assemble(parser.feed(text) + parser.finish())


# Calls read as the answer arrives, into OpenAI's streamed tool_calls deltas:
#
#     parser = CallParser()
#     events = parser.feed(piece)          # for each piece of the answer: [("content", text) | ("tool_call", delta)]
#     events += parser.finish()            # at its end
#     content, calls = assemble(events)    # what the non-streamed answer carries (parse_calls)
#
# The parser reads one character at a time, so every split of an answer into pieces gives the same assembled
# content and calls; the non-streamed answer is the whole text fed at once, so it is what the stream assembles to.
# - Text outside a block is content, sent as it comes, except what may be the start of <tool_call> and
#   whitespace, held until something follows: whitespace just before a call, or after the last call at the
#   answer's end, is dropped (so "Sure.\n<tool_call>...</tool_call>\n" is content "Sure." and one call).
# - A block becomes call i once it reads `<tool_call>` `{"name": "<name>"` (whitespace allowed around the
#   punctuation): then {"index": i, "id": "call_i", "type": "function", "function": {"name": ..., "arguments":
#   ""}} goes out. Until then the block is held; one that turns out otherwise (not a JSON object, another key
#   first, a bad name, the answer ending there) is content, as written.
# - Then `, "arguments": ` and an object: its text, as the model writes it, goes out in {"index": i, "function":
#   {"arguments": fragment}} deltas, up to the brace that closes it (strings and escapes tracked; the inside is
#   not checked). Then `}` and `</tool_call>` end the call. A call with no "arguments" key gets "{}".
# - Once its name is out a call stays a call. If the answer ends inside it (max_tokens), its arguments are the
#   text written so far (not whole JSON, as OpenAI's then); if the block leaves the shape above, the call ends
#   there and the text from that character on is read as content again (the skeleton read so far is dropped).

WS = " "  # a step of any amount of whitespace in a skeleton below
_HEAD = (WS, "{", WS, '"name"', WS, ":", WS, '"')  # then the name's characters up to its closing quote
_ARG_KEY = (WS, '"arguments"', WS, ":")  # after the comma that follows the name; then whitespace and "{"
_TAIL = (WS, "}", WS, CLOSE)  # after the arguments' object
_END = (WS, CLOSE)  # after the call's own "}" where it had no arguments


def _step(steps: tuple, at: tuple[int, int], c: str) -> tuple[int, int] | None:
    """at = (step, characters of it matched) after c, or None where c does not fit; done at (len(steps), 0)."""
    k, pos = at
    while k < len(steps) and steps[k] == WS:
        if c.isspace():
            return k, 0
        k += 1
    if k == len(steps) or c != steps[k][pos]:
        return None
    return (k + 1, 0) if pos + 1 == len(steps[k]) else (k, pos + 1)


class CallParser:
    """One answer's text -> content and tool_calls deltas, in order (the rules above)."""

    def __init__(self):
        self.calls = 0  # calls ended so far: the index of the call being read, if any
        self.state = "out"  # out | head | name | after_name | arg_key | args_start | args | tail | end
        self.ws = ""  # out: whitespace not sent yet
        self.tag = ""  # out: a prefix of OPEN not sent yet
        self.block = ""  # head, name: the block's text so far, OPEN included
        self.name_start = 0  # name: where the name's characters start in self.block
        self.at = (0, 0)  # the place in the current skeleton (_step)
        self.after_call = False  # out: no content since a call ended (whitespace at the answer's end is dropped)
        self.depth, self.in_string, self.escape = 0, False, False  # args: the object's nesting
        self.has_args = False
        self.events: list = []

    def feed(self, text: str) -> list:
        for c in text:
            self._char(c)
        events, self.events = self.events, []
        return events

    def finish(self) -> list:
        if self.state == "out":  # whitespace after the last call is dropped
            self._content(("" if self.after_call and not self.tag else self.ws) + self.tag)
        elif self.state in ("head", "name"):  # a block that never became a call: its text
            self._content(self.ws + self.block)
        else:  # inside a call: it ends as it is
            self.calls += 1
        self.state, self.ws, self.tag, self.block = "out", "", "", ""
        events, self.events = self.events, []
        return events

    def _char(self, c: str) -> None:
        state = self.state
        if state == "out":
            self._out(c)
        elif state == "head":
            self.at = _step(_HEAD, self.at, c)
            if self.at is None:
                self._not_a_call(c)
            else:
                self.block += c
                if self.at[0] == len(_HEAD):
                    self.state, self.name_start = "name", len(self.block)
        elif state == "name":
            if c == '"' and not self.escape:
                self._header(c)
            else:
                self.block += c
                self.escape = c == "\\" and not self.escape
        elif state == "after_name":
            if c == ",":
                self.state, self.at = "arg_key", (0, 0)
            elif c == "}":
                self.state, self.at = "end", (0, 0)
                if not self.has_args:
                    self._arguments("{}")
            elif not c.isspace():
                self._call_ends(c)
        elif state == "args_start":
            if c == "{":
                self.state, self.depth, self.in_string, self.escape, self.has_args = "args", 1, False, False, True
                self._arguments(c)
            elif not c.isspace():
                self._call_ends(c)
        elif state == "args":
            self._arguments(c)
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.state, self.at = "tail", (0, 0)
        else:  # arg_key, tail, end: skeletons
            steps = {"arg_key": _ARG_KEY, "tail": _TAIL, "end": _END}[state]
            self.at = _step(steps, self.at, c)
            if self.at is None:
                self._call_ends(c)
            elif self.at[0] == len(steps):
                if state == "arg_key":
                    self.state = "args_start"
                else:  # the call's </tool_call>
                    self.calls += 1
                    self.state, self.after_call = "out", True

    def _out(self, c: str) -> None:
        if self.tag:
            if OPEN.startswith(self.tag + c):
                self.tag += c
                if self.tag == OPEN:  # a block: held until it is a call or is not
                    self.state, self.block, self.tag, self.at, self.escape = "head", OPEN, "", (0, 0), False
                return
            self._content(self.ws + self.tag)
            self.ws = self.tag = ""
        if c == "<":
            self.tag = c
        elif c.isspace():
            self.ws += c
        else:
            self._content(self.ws + c)
            self.ws = ""

    def _not_a_call(self, c: str) -> None:
        """The held block is content after all; c is read again outside it."""
        self._content(self.ws + self.block)
        self.state, self.ws, self.block = "out", "", ""
        self._out(c)

    def _header(self, quote: str) -> None:
        try:
            name = json.loads('"' + self.block[self.name_start:] + '"')
        except json.JSONDecodeError:  # a control character or a bad escape in the name
            return self._not_a_call(quote)
        self.events.append(("tool_call", {"index": self.calls, "id": f"call_{self.calls}", "type": "function",
                                          "function": {"name": name, "arguments": ""}}))
        self.state, self.ws, self.block, self.has_args, self.after_call = "after_name", "", "", False, False

    def _call_ends(self, c: str) -> None:
        """The block left the call's shape at c: the call ends as it is, c is read again as content."""
        self.calls += 1
        self.state, self.after_call = "out", False
        self._out(c)

    def _content(self, text: str) -> None:
        if not text:
            return
        self.after_call = False
        if self.events and self.events[-1][0] == "content":
            self.events[-1] = ("content", self.events[-1][1] + text)
        else:
            self.events.append(("content", text))

    def _arguments(self, text: str) -> None:
        last = self.events[-1] if self.events else None
        if last and last[0] == "tool_call" and last[1]["index"] == self.calls and "id" not in last[1]:
            last[1]["function"]["arguments"] += text
        else:
            self.events.append(("tool_call", {"index": self.calls, "function": {"arguments": text}}))


def assemble(events) -> tuple[str | None, list[dict]]:
    """(the content, or None where there is none; the calls, OpenAI's tool_calls) from a parser's events."""
    content, calls = [], []
    for kind, value in events:
        if kind == "content":
            content.append(value)
        elif "id" in value:
            calls.append({"id": value["id"], "type": value["type"], "function": dict(value["function"])})
        else:
            calls[value["index"]]["function"]["arguments"] += value["function"]["arguments"]
    return "".join(content) or None, calls
