"""Bad input gets OpenAI's error object with the right status, and the next request is served normally."""

from __future__ import annotations

import json

import openai
import pytest

from server.conftest import TINY_CONTEXT

CONTEXT = TINY_CONTEXT  # the tiny test server's: these checks run in the fast suite
MODEL = "tiny"
OK_PROMPT = "The capital of France is"
LONG_PROMPT = "word " * (CONTEXT + 50)
CHAT = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def served(tiny_server):
    return tiny_server


@pytest.fixture
def reference(tiny_reference):
    return tiny_reference


def authed(served):
    """An HTTP client that sends the server's API key (a missing key is test_server_parts' subject)."""
    return served.http(headers={"Authorization": f"Bearer {served.api_key}"})


def assert_error(response, status: int, code=None, param=None):
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


def assert_served_normally(served, reference):
    """A normal request right after the bad one succeeds with the right text."""
    resp = served.client().completions.create(model=MODEL, prompt=OK_PROMPT, max_tokens=2, temperature=0)
    expected = reference.generate(reference.prompt_ids(OK_PROMPT), 2, spec=served.engine.spec)
    assert resp.choices[0].text == expected.text


# (name, path, raw body, status, code, param)
CASES = [
    ("malformed json", "/v1/completions", b'{"prompt": "x", "max_tokens": ', 400, "invalid_json", None),
    ("malformed json chat", "/v1/chat/completions", b"{messages: [}", 400, "invalid_json", None),
    ("body not an object", "/v1/completions", b'["x"]', 400, "invalid_type", None),
    ("max_tokens a string", "/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, "invalid_type",
     "max_tokens"),
    ("max_tokens a float", "/v1/completions", {"prompt": "x", "max_tokens": 2.5}, 400, "invalid_type", "max_tokens"),
    ("temperature a string", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "invalid_type",
     "temperature"),
    ("stream a string", "/v1/chat/completions", {"messages": CHAT, "stream": "yes"}, 400, "invalid_type", "stream"),
    ("messages a string", "/v1/chat/completions", {"messages": "hello"}, 400, None, "messages"),
    ("messages missing", "/v1/chat/completions", {"model": MODEL}, 400, "missing_required_parameter",
     "messages"),
    ("unknown role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400,
     "invalid_value", "messages.0.role"),
    ("negative max_tokens", "/v1/completions", {"prompt": "x", "max_tokens": -5}, 400, "invalid_value",
     "max_tokens"),
    ("zero max_tokens", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 0}, 400, "invalid_value",
     "max_tokens"),
    ("huge max_tokens", "/v1/completions", {"prompt": "x", "max_tokens": 10**12}, 400, "invalid_value",
     "max_tokens"),
    ("prompt longer than the context", "/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 4}, 400,
     "context_length_exceeded", "prompt"),
    ("chat longer than the context", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": LONG_PROMPT}]}, 400, "context_length_exceeded", "messages"),
    ("prompt + max_tokens over the context", "/v1/completions",
     {"prompt": OK_PROMPT, "max_tokens": CONTEXT - 3}, 400, "context_length_exceeded", "prompt"),
    ("token id outside the vocabulary", "/v1/completions", {"prompt": [1, 2, 10**9]}, 400, "invalid_value",
     "prompt"),
    ("empty prompt", "/v1/completions", {"prompt": []}, 400, "invalid_value", "prompt"),
    ("n > 1", "/v1/completions", {"prompt": "x", "n": 2}, 400, "invalid_value", "n"),
    ("temperature out of range", "/v1/completions", {"prompt": "x", "temperature": -1}, 400, "invalid_value",
     "temperature"),
    ("unknown model", "/v1/completions", {"prompt": "x", "model": "gpt-4o"}, 404, "model_not_found", "model"),
    ("unknown model chat", "/v1/chat/completions", {"messages": CHAT, "model": "nope"}, 404, "model_not_found",
     "model"),
    ("draft model not loaded", "/v1/completions",
     {"prompt": "x", "speculative": {"method": "draft_model", "model": "qwen2.5-0.5b"}}, 400,
     "invalid_speculative_config", "speculative"),
    ("eagle3 not loaded", "/v1/completions", {"prompt": "x", "speculative": {"method": "eagle3"}}, 400,
     "invalid_speculative_config", "speculative"),
    ("unknown method", "/v1/chat/completions", {"messages": CHAT, "speculative": {"method": "magic"}}, 400,
     "invalid_speculative_config", "speculative"),
    ("zero draft length", "/v1/completions", {"prompt": "x", "speculative": {"num_speculative_tokens": 0}}, 400,
     "invalid_speculative_config", "speculative"),
    ("huge draft length", "/v1/completions",
     {"prompt": "x", "speculative": {"num_speculative_tokens": 10000, "adaptive": True}}, 400,
     "invalid_speculative_config", "speculative"),
    ("logit_bias", "/v1/completions", {"prompt": "x", "logit_bias": {"50256": -100}}, 400, "unsupported",
     "logit_bias"),
    ("tools", "/v1/chat/completions",
     {"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, 400,
     "unsupported", "tools"),
    ("tool_choice without tools", "/v1/chat/completions", {"messages": CHAT, "tool_choice": "required"}, 400,
     "invalid_value", "tool_choice"),
    ("unknown response format", "/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "yaml"}},
     400, "invalid_value", "response_format"),
    ("unsatisfiable schema", "/v1/chat/completions", {"messages": CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "string", "minLength": 3,
                                                                        "maxLength": 1}}}},
     400, "invalid_value", "response_format"),
    ("disabled and tuned", "/v1/completions",
     {"prompt": "x", "speculative": {"enabled": False, "num_speculative_tokens": 4}}, 400,
     "invalid_speculative_config", "speculative"),
    ("unknown speculative key", "/v1/completions", {"prompt": "x", "speculative": {"draft_len": 4}}, 400,
     "unknown_parameter", "speculative.draft_len"),
    ("speculative a string", "/v1/completions", {"prompt": "x", "speculative": "off"}, 400, None, "speculative"),
    ("unknown route", "/v1/embeddings", {"input": "x"}, 404, "not_found", None),
    ("prompt not UTF-8", "/v1/completions", b'{"prompt": "ab\\ud800cd", "max_tokens": 2}', 400, "invalid_value",
     "prompt"),
    ("message not UTF-8", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x\\udfff"}]}', 400,
     "invalid_value", "messages"),
    ("temperature NaN", "/v1/completions", b'{"prompt": "x", "temperature": NaN}', 400, "invalid_value",
     "temperature"),
    ("best_of > 1", "/v1/completions", {"prompt": "x", "best_of": 3}, 400, "unsupported", "best_of"),
    ("suffix", "/v1/completions", {"prompt": "x", "suffix": "y"}, 400, "unsupported", "suffix"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {"messages": CHAT, "top_logprobs": 3}, 400,
     "invalid_value", "top_logprobs"),
    ("top_logprobs > 20", "/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21}, 400,
     "invalid_value", "top_logprobs"),
    ("logprobs < 0", "/v1/completions", {"prompt": "x", "logprobs": -1}, 400, "invalid_value", "logprobs"),
    ("streamed top_logprobs > 20", "/v1/chat/completions",
     {"messages": CHAT, "logprobs": True, "top_logprobs": 21, "stream": True}, 400, "invalid_value", "top_logprobs"),
    ("streamed logprobs > 20", "/v1/completions", {"prompt": "x", "logprobs": 21, "stream": True}, 400,
     "invalid_value", "logprobs"),
    ("zero max_completion_tokens", "/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, 400,
     "invalid_value", "max_completion_tokens"),
    # other servers' extensions that change the answer are refused, not dropped
    ("vLLM guided_json", "/v1/completions", {"prompt": "x", "guided_json": {"type": "object"}}, 400, "unsupported",
     "guided_json"),
    ("llama.cpp grammar that does not parse", "/v1/completions", {"prompt": "x", "grammar": "root ::= [a-z"}, 400,
     "invalid_value", "grammar"),
    ("two grammars", "/v1/completions", {"prompt": "x", "grammar": "root ::= \"a\"", "json_schema": {}}, 400,
     "invalid_value", "grammar"),
    ("ignore_eos", "/v1/completions", {"prompt": "x", "ignore_eos": True}, 400, "unsupported", "ignore_eos"),
    ("repetition_penalty", "/v1/completions", {"prompt": "x", "repetition_penalty": 1.2}, 400, "unsupported",
     "repetition_penalty"),
    ("min_tokens", "/v1/completions", {"prompt": "x", "min_tokens": 5}, 400, "unsupported", "min_tokens"),
    ("continue_final_message", "/v1/chat/completions", {"messages": CHAT, "continue_final_message": True}, 400,
     "unsupported", "continue_final_message"),
    ("no generation prompt", "/v1/chat/completions", {"messages": CHAT, "add_generation_prompt": False}, 400,
     "unsupported", "add_generation_prompt"),
    ("own chat_template", "/v1/chat/completions", {"messages": CHAT, "chat_template": "{{ messages }}"}, 400,
     "unsupported", "chat_template"),
    ("reasoning_effort", "/v1/chat/completions", {"messages": CHAT, "reasoning_effort": "high"}, 400, "unsupported",
     "reasoning_effort"),
    ("audio out", "/v1/chat/completions", {"messages": CHAT, "modalities": ["text", "audio"]}, 400, "unsupported",
     "modalities"),
    ("assistant tool_calls", "/v1/chat/completions",
     {"messages": CHAT + [{"role": "assistant", "content": None, "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, 400, "unsupported",
     "messages.1.tool_calls"),
]


@pytest.mark.parametrize("name, path, body, status, code, param", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_an_openai_error_and_the_server_goes_on(served, reference, name, path, body, status,
                                                             code, param):
    assert served.engine.cache.max_len == CONTEXT
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    with authed(served) as http:
        response = http.post(path, content=content, headers={"content-type": "application/json"})
    assert_error(response, status, code, param)
    assert_served_normally(served, reference)


def test_an_empty_body_is_told_what_to_send(served, reference):
    with authed(served) as http:
        response = http.post("/v1/completions", content=b"", headers={"content-type": "application/json"})
    error = assert_error(response, 400)
    assert error["message"] == "The request body must be a JSON object." and error["param"] is None
    assert_served_normally(served, reference)


@pytest.mark.parametrize("path, body, message", [
    ("/v1/completions", {"prompt": "x", "temperature": float("nan")}, "Input should be a finite number"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 0}, "max_completion_tokens must be"),
])
def test_the_message_names_what_was_sent(served, path, body, message):
    with authed(served) as http:
        response = http.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})
    assert message in assert_error(response, 400)["message"]


def test_openai_client_raises_its_own_exceptions(served, reference):
    client = served.client()
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=2)
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2)
    assert err.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:  # also when streaming: the error comes before the stream
        client.completions.create(model=MODEL, prompt="x", max_tokens=-1, stream=True)
    assert err.value.param == "max_tokens"
    assert_served_normally(served, reference)


def test_other_servers_fields_at_their_neutral_values_are_served(served, reference):
    """Clients written for vLLM / llama.cpp send their fields at defaults; those change nothing."""
    body = {"prompt": OK_PROMPT, "max_tokens": 2, "temperature": 0, "user": "u1", "repetition_penalty": 1.0,
            "ignore_eos": False, "skip_special_tokens": True, "min_tokens": 0, "guided_json": None,
            "stop_token_ids": [], "chat_template_kwargs": {}}
    with authed(served) as http:
        response = http.post("/v1/completions", content=json.dumps(body).encode(),
                             headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    expected = reference.generate(reference.prompt_ids(OK_PROMPT), 2, spec=served.engine.spec)
    assert response.json()["choices"][0]["text"] == expected.text
