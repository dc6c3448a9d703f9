"""A GBNF grammar (llama.cpp's) of one tool call, for llama-server's `grammar` field on the sessions' tool turns:
the language of specdec's own call grammar (server/tools.py call_grammar with tool_choice "required"), written
for a runtime that takes no JSON schema inside <tool_call> tags.

    <tool_call>\\n{"name": "NAME", "arguments": {"key": value, ...}}\\n</tool_call>

One line of JSON with ", " and ": " (call_grammar's layout), properties in the schema's order. Parameters
schemas it can write: an object whose properties are all required and no others (additionalProperties
false), of type string, integer, number, boolean, or an array of those; anything else is a ValueError naming
the tool, so a session is never sent under a looser grammar than specdec's.
"""

from __future__ import annotations

import json

OPEN, CLOSE = "<tool_call>", "</tool_call>"
SCALARS = {
    "string": 'string',
    "integer": 'integer',
    "number": 'number',
    "boolean": '("true" | "false")',
}
BASE = r'''string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] ) )* "\""
integer ::= "-"? ( "0" | [1-9] [0-9]* )
number ::= integer ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
'''


def _lit(text: str) -> str:
    """A GBNF string literal of `text`."""
    return json.dumps(text)


def _value(schema: dict, where: str) -> str:
    kind = schema.get("type")
    if kind in SCALARS:
        return SCALARS[kind]
    if kind == "array" and isinstance(schema.get("items"), dict) and schema["items"].get("type") in SCALARS:
        item = SCALARS[schema["items"]["type"]]
        return f'"[" ( {item} ( ", " {item} )* )? "]"'
    raise ValueError(f"{where}: a parameter of type {json.dumps(schema)} has no GBNF here; use strings, numbers, "
                     "booleans or arrays of them")


def _arguments(fn: dict) -> str:
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    props = params.get("properties") or {}
    name = fn["name"]
    if set(params.get("required", [])) != set(props) or params.get("additionalProperties", True) is not False:
        raise ValueError(f"tool {name}: its parameters must all be required with additionalProperties false "
                         "to be written as one GBNF call")
    parts = [f'{_lit(json.dumps(key) + ": ")} {_value(schema, f"tool {name}, parameter {key}")}'
             for key, schema in props.items()]
    return '"{" ' + ' ", " '.join(parts) + ' "}"' if parts else '"{}"'


def call_gbnf(tools: list[dict]) -> str:
    """The GBNF of one call of any of `tools` (OpenAI's [{"type": "function", "function": {...}}])."""
    if not tools:
        raise ValueError("a call grammar needs at least one tool")
    rules = []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        head = json.dumps({"name": fn["name"], "arguments": {}})[:-3]  # '{"name": "NAME", "arguments": '
        rules.append(f'call{i} ::= {_lit(head)} {_arguments(fn)} "}}"')
    alts = " | ".join(f"call{i}" for i in range(len(tools)))
    return f'root ::= {_lit(OPEN + chr(10))} ( {alts} ) {_lit(chr(10) + CLOSE)}\n' + "\n".join(rules) + "\n" + BASE
