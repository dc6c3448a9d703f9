"""Request bodies of the OpenAI-compatible API, and its error object.

Fields are strict (a string where an integer belongs is a 400, never coerced; null is the
field's default, as in OpenAI's API) and unknown fields are ignored, as OpenAI clients send
fields this server has no use for (user, metadata, ...). Fields we cannot honour with a non-default value (n > 1,
penalties) are rejected by the handlers, not silently dropped; so are the
extensions of vLLM, SGLang and llama.cpp's servers that change the answer (ANSWER_CHANGING,
e.g. guided_json, ignore_eos, continue_final_message), and assistant messages that carry tool_calls.
response_format and llama.cpp's grammar / json_schema constrain the answer (server/structured.py).

Extras OpenAI clients ignore:
    request  "speculative": {"enabled": false} or {"method": "ngram", "num_speculative_tokens": 5}
    request  "stream_options": {"include_sources": true}: every streamed chunk with text also carries
             "specdec": {"sources": [[source, characters], ...], "tokens", "drafted", "accepted"}
    response "spec": SpecStats.to_dict() of that request, its verdict included (also on the last streamed chunk)
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.responses import Response


class APIError(Exception):
    """An error answered as OpenAI's {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers  # extra response headers, e.g. Retry-After on a 503

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        """Rendered with non-ASCII escaped: a message that quotes the client's input (a lone surrogate in a
        model name) must not fail to render and turn the error into a 500."""
        return Response(json.dumps(self.body(), ensure_ascii=True), status_code=self.status, headers=self.headers,
                        media_type="application/json")


# Fields other OpenAI-compatible servers (vLLM, SGLang, llama.cpp) honour and this one cannot, each
# with the values that leave the answer as if it had not been sent (null always does). Sent with any
# other value the request is refused, as the client expects an answer they shaped.
ANSWER_CHANGING: dict[str, tuple] = {
    # sampling
    "repetition_penalty": (1, 1.0), "repeat_penalty": (1, 1.0), "typical_p": (1, 1.0), "tfs_z": (1, 1.0),
    "top_a": (0, 0.0), "top_n_sigma": (-1, -1.0), "mirostat": (0,), "dynatemp_range": (0, 0.0),
    "dry_multiplier": (0, 0.0),
    "xtc_probability": (0, 0.0), "length_penalty": (1, 1.0), "use_beam_search": (False,),
    "min_tokens": (0,), "min_new_tokens": (0,), "ignore_eos": (False,), "no_stop_trim": (False,),
    "stop_regex": ([],), "custom_logit_processor": (), "stop_token_ids": ([],), "bad_words": ([],),
    "allowed_token_ids": (), "logits_processors": ([],), "n_predict": (-1,), "n_probs": (0,),
    "prompt_logprobs": (), "truncate_prompt_tokens": (), "include_stop_str_in_output": (False,),
    "spaces_between_special_tokens": (True,),
    # constrained decoding
    "guided_json": (), "guided_regex": (), "guided_choice": (), "guided_grammar": (), "structured_outputs": (),
    "regex": (), "ebnf": (), "functions": ([],),
    "function_call": ("none", "auto"),
    # chat templating
    "continue_final_message": (False,), "add_generation_prompt": (True,), "chat_template": (),
    "chat_template_kwargs": ({},), "documents": ([],), "echo": (False,), "reasoning_effort": (),
    # output in other forms
    "modalities": (["text"],), "audio": (),
}


def answer_changing(extra: dict | None) -> str | None:
    """The first field of `extra` (a request's unknown fields) in ANSWER_CHANGING sent with a value
    that changes the answer, or None."""
    for name, value in (extra or {}).items():
        neutral = ANSWER_CHANGING.get(name)
        if neutral is not None and value is not None and not any(
                type(value) is type(v) and value == v for v in neutral):
            return name
    return None


class SpeculativeOverride(BaseModel):
    """Per-request speculative settings; every field left out keeps the server's setting.

    {"enabled": false}                                 plain decoding for this request
    {"num_speculative_tokens": 5}                      the server's method, a longer draft
    {"method": "ngram", "num_speculative_tokens": 2}   vLLM method names
    {"spec_type": "ngram-simple,suffix"}               llama.cpp --spec-type names
    A draft model must be the one the server loaded (-md); anything else is a 400.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    enabled: bool | None = None
    method: str | None = None
    spec_type: str | None = None
    num_speculative_tokens: int | None = None
    draft_n_min: int | None = None
    draft_p_min: float | None = None
    adaptive: bool | None = None
    model: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    include_usage: bool | None = None  # null: false, as vLLM reads it
    include_sources: bool | None = None  # specdec's: where each token of a chunk came from (responses.py)


class GenerationRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions.

    temperature defaults to 1.0 as in OpenAI's API; send 0 for greedy decoding.
    top_k -1 and 0 both mean "off" (vLLM uses -1).
    """

    model_config = ConfigDict(extra="allow", strict=True)  # extras are checked against ANSWER_CHANGING

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data):
        """OpenAI's API takes null for an optional field and reads it as the default (clients that send every
        field send the unset ones so): a null where the default is a value is that default, not a 400."""
        if isinstance(data, dict):
            return {k: v for k, v in data.items()
                    if not (v is None and k in cls.model_fields and cls.model_fields[k].default is not None)}
        return data

    model: str | None = None  # None = the served model
    max_tokens: int | None = None  # None = the server's default, capped by the context
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)  # NaN: "should be a finite number"
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    speculative: SpeculativeOverride | None = None
    skip_special_tokens: bool = True  # vLLM's: false keeps special tokens' text (<|im_end|>) in the answer
    # Fields that change what the client gets back: read so that a request using them is refused
    # (job_builder.make_job), never served as if they had not been sent.
    logit_bias: dict[str, float] | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None  # {"type": "json_object"} or json_schema: server/structured.py


class CompletionRequest(GenerationRequest):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None  # n: each token's logprob and its n most likely (server/logprobs.py)
    echo: bool = False
    best_of: int | None = None  # refused unless 1, as n
    suffix: str | None = None  # refused unless empty


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None  # handed to the chat template, which may show it
    # an assistant turn's tool calls: the chat template would drop them, so they are refused
    tool_calls: list | None = None
    function_call: dict | None = None
    # an assistant turn the answer continues (DeepSeek's "prefix", Mistral's / Kimi's "partial"): the
    # template would close it and open another, so it is refused
    prefix: bool | None = None
    partial: bool | None = None

    def as_template_dict(self) -> dict:
        """{"role", "content": str} (and "name" when given) as chat templates expect ("developer" is rendered
        as "system")."""
        if isinstance(self.content, list):  # parts joined by newlines, as vLLM joins them for a text template
            content = "\n".join(part.text for part in self.content)
        else:
            content = self.content or ""
        message = {"role": "system" if self.role == "developer" else self.role, "content": content}
        return message if self.name is None else {**message, "name": self.name}


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # OpenAI's newer name for max_tokens
    logprobs: bool = False
    top_logprobs: int | None = None  # with logprobs: true (server/logprobs.py)
