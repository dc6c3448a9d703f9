"""Structured output through the server (server/structured.py): OpenAI's response_format (json_object,
json_schema) and llama.cpp's grammar / json_schema fields constrain the answer, which is the engine's plain
greedy answer under the same grammar token for token (the server speculates: ngram-simple, and the grammar
drafter it adds), on the tiny model with the openai client."""

from __future__ import annotations

import json

import pytest

from specdec.engine.config import SpecConfig
from specdec.engine.constrain import compile_for
from specdec.sampling import SamplingParams

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "blue"]}},
          "required": ["ok", "tag"], "additionalProperties": False}
CHAT = [{"role": "user", "content": "Answer in JSON."}]


@pytest.fixture
def client(tiny_server):
    return tiny_server.client()


def plain(tiny_reference, ids: list[int], kind: str, text: str, max_tokens: int = 40):
    grammar = compile_for(tiny_reference.model, kind, text)
    return tiny_reference.generate(ids, max_tokens, SpecConfig(), sampling=SamplingParams(grammar=grammar))


def test_response_format_json_schema_is_the_constrained_plain_answer(client, tiny_reference):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}
    out = client.chat.completions.create(model="tiny", messages=CHAT, response_format=fmt, temperature=0,
                                         max_tokens=40)
    text = out.choices[0].message.content
    value = json.loads(text)
    assert set(value) == {"ok", "tag"} and isinstance(value["ok"], bool) and value["tag"] in ("red", "blue")
    assert out.choices[0].finish_reason == "stop"
    assert text == plain(tiny_reference, tiny_reference.chat_ids(CHAT), "json_schema", json.dumps(SCHEMA)).text
    assert out.model_extra["spec"]["by_drafter"]["grammar"]["accepted"] > 0  # keys and punctuation, drafted


def test_json_object_and_llama_cpp_fields(client, tiny_reference):
    ids = tiny_reference.prompt_ids("x")
    out = client.completions.create(model="tiny", prompt="x", temperature=0, max_tokens=24,
                                    extra_body={"response_format": {"type": "json_object"}})
    assert out.choices[0].text == plain(tiny_reference, ids, "json_object", "", 24).text
    assert out.choices[0].text.startswith("{")
    gbnf = 'root ::= ("yes" | "no") "!"'
    out = client.completions.create(model="tiny", prompt="x", temperature=0, max_tokens=8, extra_body={"grammar": gbnf})
    assert out.choices[0].text in ("yes!", "no!")
    assert out.choices[0].text == plain(tiny_reference, ids, "gbnf", gbnf, 8).text
    out = client.completions.create(model="tiny", prompt="x", temperature=0, max_tokens=40,
                                    extra_body={"json_schema": SCHEMA})
    assert json.loads(out.choices[0].text)["tag"] in ("red", "blue")


@pytest.mark.slow
def test_a_real_model_answers_in_the_schema(smollm_server, reference):
    """smollm2-135m, speculating (ngram-simple and the grammar drafter): a JSON answer in the schema, plain's
    answer under the schema token for token."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer"}}, "required": ["name", "age"],
              "additionalProperties": False}
    messages = [{"role": "user", "content": "Give the name and age of a famous scientist as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, "strict": True}}
    out = smollm_server.client().chat.completions.create(model="smollm2-135m", messages=messages, response_format=fmt,
                                                         temperature=0, max_tokens=40)
    value = json.loads(out.choices[0].message.content)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int)
    grammar = compile_for(reference.model, "json_schema", json.dumps(schema))
    alone = reference.generate(reference.chat_ids(messages), 40, SpecConfig(), sampling=SamplingParams(grammar=grammar))
    assert out.choices[0].message.content == alone.text
    assert out.model_extra["spec"]["by_drafter"]["grammar"]["accepted"] > 0
