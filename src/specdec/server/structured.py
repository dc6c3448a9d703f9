"""A request's grammar from its body: OpenAI's response_format, llama.cpp's `grammar` and `json_schema` fields.

    response_format {"type": "text"}                                   no grammar
    response_format {"type": "json_object"}                            any JSON object
    response_format {"type": "json_schema", "json_schema": {"name": "...", "schema": {...}, "strict": true}}
    "json_schema": {...}   (llama-server's field: a JSON schema)
    "grammar": "root ::= ..."   (llama-server's field: GBNF)

The answer then follows the grammar token for token (engine/constrain.py), with or without speculation;
`strict` false is served as strict (the schema is always enforced). One of them per request; anything else is
OpenAI's 400 naming the field.

    grammar = request_grammar(engine.model, body)    # a compiled sampling.grammar.Grammar, or None
"""

from __future__ import annotations

import json

from specdec.engine.constrain import compile_for
from specdec.sampling.grammar import Grammar
from specdec.server.schemas import APIError, GenerationRequest
from specdec.server.tools import call_grammar

FORMATS = ("text", "json_object", "json_schema")


def request_grammar(model, body: GenerationRequest) -> Grammar | None:
    """The grammar the body asks for, compiled for `model`'s vocabulary; None when it asks for none."""
    extra = body.model_extra or {}
    asked = [(name, kind, text) for name, (kind, text) in (
        ("response_format", _response_format(body.response_format)),
        ("json_schema", _schema_field(extra.get("json_schema"))),
        ("grammar", _grammar_field(extra.get("grammar"))),
        ("tool_choice", _tool_call(body)),  # "required" or a named function: one call, its arguments' schema
    ) if kind is not None]
    if not asked:
        return None
    if len(asked) > 1:
        names = " and ".join(name for name, _, _ in asked)
        raise APIError(400, f"{names} each constrain the answer; send one of them", param=asked[1][0],
                       code="invalid_value")
    name, kind, text = asked[0]
    try:
        return compile_for(model, kind, text)
    except ValueError as exc:  # a schema no value satisfies, a grammar that does not parse (one sentence)
        raise APIError(400, f"{name}: {exc}", param=name, code="invalid_value") from None


def _tool_call(body) -> tuple[str | None, str | None]:
    call = call_grammar(body.tools, body.tool_choice)
    return (None, None) if call is None else ("gbnf", call)  # a Lark grammar: the gbnf kind reads Lark too


def _response_format(value) -> tuple[str | None, str | None]:
    """(grammar kind, its text) of a response_format; (None, None) for none."""
    name = "response_format"
    if value is None:
        return None, None
    kind = value.get("type")
    if kind not in FORMATS:
        raise APIError(400, f"response_format.type must be one of {', '.join(FORMATS)}, got {kind!r}",
                       param=name, code="invalid_value")
    if kind == "text":
        return None, None
    if kind == "json_object":
        return "json_object", ""
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise APIError(400, 'response_format json_schema needs "json_schema": {"name": ..., "schema": {...}}',
                       param=name, code="invalid_value")
    if not isinstance(spec.get("strict", True), (bool, type(None))):
        raise APIError(400, "response_format.json_schema.strict must be true or false", param=name,
                       code="invalid_value")
    # no "schema": any JSON value would do, as OpenAI reads it; an object is what clients then parse
    return "json_schema", json.dumps(spec.get("schema") or {"type": "object"})


def _schema_field(value):
    if value is None:
        return None, None
    if isinstance(value, str):  # a schema sent as text
        return "json_schema", value
    if not isinstance(value, dict):
        raise APIError(400, f"json_schema must be a JSON schema object, got {type(value).__name__}",
                       param="json_schema", code="invalid_value")
    return "json_schema", json.dumps(value)


def _grammar_field(value):
    if value is None or value == "":  # llama-server's neutral value
        return None, None
    if not isinstance(value, str):
        raise APIError(400, f"grammar must be a GBNF grammar as a string, got {type(value).__name__}",
                       param="grammar", code="invalid_value")
    return "gbnf", value
