"""A request body -> a Job: the prompt's ids, sampling, stop strings and speculative settings, or OpenAI's 400
(404 for another model) naming the parameter this server refuses.

    check_model(body.model, served_name)
    ids = completion_prompt(tok, body.prompt, vocab_size, context)   # or chat_prompt(tok, messages, context)
    job = make_job(engine, body, ids, body.max_tokens, "completions", "prompt", default_max_tokens)
"""

from __future__ import annotations

import asyncio

from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams
from specdec.server.jobs import Job
from specdec.server.overrides import resolve_spec
from specdec.server.schemas import APIError, GenerationRequest, answer_changing
from specdec.server.structured import request_grammar


def check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(404, f"The model `{name}` does not exist; this server serves `{served}`.", param="model",
                       code="model_not_found")


def completion_prompt(tok, prompt, vocab_size: int, context: int) -> list[int]:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        if len(prompt) != 1:
            raise APIError(400, f"one prompt per request, got {len(prompt)}", param="prompt", code="invalid_value")
        prompt = prompt[0]
    if isinstance(prompt, str):
        return _encode(tok, prompt, "prompt", context)
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise APIError(400, f"prompt token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})",
                       param="prompt", code="invalid_value")
    return list(prompt)


def chat_prompt(tok, messages: list[dict], context: int, tools: list[dict] | None = None) -> list[int]:
    try:
        text = tok.apply_chat_template(messages, tools=tools)
    except ValueError as exc:  # any failure of the template (model/tokenizer.py)
        raise APIError(400, f"the chat template rejected these messages: {exc}", param="messages",
                       code="invalid_value") from None
    return _encode(tok, text, "messages", context, add_bos=False)


def _encode(tok, text: str, param: str, context: int, add_bos: bool | None = None) -> list[int]:
    """The prompt's ids; a text that cannot fit the context is refused without being tokenized whole."""
    try:
        ids = tok.encode_at_most(text, context - 1, add_bos=add_bos)  # make_job's room: one token at least
    except ValueError as exc:  # text that is not UTF-8
        raise APIError(400, str(exc), param=param, code="invalid_value") from None
    if ids is None:
        raise _context_exceeded(context, f"more than {context - 1}", param)
    return ids


def _context_exceeded(context: int, tokens: str, param: str) -> APIError:
    return APIError(400, f"This model's maximum context length is {context} tokens. However, your prompt has "
                    f"{tokens} tokens, which leaves no room for a completion. Please shorten the prompt.",
                    param=param, code="context_length_exceeded")


def make_job(engine: Engine, body: GenerationRequest, prompt: list[int], max_tokens: int | None, endpoint: str,
              prompt_param: str, default_max_tokens: int, max_tokens_param: str = "max_tokens") -> Job:
    if body.n != 1:
        raise APIError(400, f"n must be 1 (one choice per request), got {body.n}", param="n", code="invalid_value")
    if body.stream_options is not None and not body.stream:  # vLLM refuses it too: it asks for what never comes
        raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options",
                       code="invalid_value")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name):
            raise APIError(400, f"{name} is not supported by this server (send 0)", param=name, code="unsupported")
    chat = endpoint == "chat.completions"  # tools are the chat endpoint's (server/tools.py)
    unsupported = {"logit_bias": bool(body.logit_bias), "tools": bool(body.tools) and not chat,
                   "tool_choice": body.tool_choice not in (None, "none", "auto") and not chat}
    for name, used in unsupported.items():
        if used:
            raise APIError(400, f"{name} is not supported by this server; send the request without it", param=name,
                           code="unsupported")
    name = answer_changing(body.model_extra)
    if name is not None:
        raise APIError(400, f"{name} is not supported by this server (it would change the answer); send the "
                       "request without it", param=name, code="unsupported")
    context = engine.cache.max_len
    if max_tokens is not None and not 1 <= max_tokens <= context:
        raise APIError(400, f"{max_tokens_param} must be between 1 and {context} (the context length), got "
                       f"{max_tokens}", param=max_tokens_param, code="invalid_value")
    if not prompt:
        raise APIError(400, "the prompt is empty", param=prompt_param, code="invalid_value")
    room = context - len(prompt)  # prompt + completion fill at most the context, as vLLM's max_model_len
    if room < 1:
        raise _context_exceeded(context, str(len(prompt)), prompt_param)
    if max_tokens is None:
        max_tokens = min(default_max_tokens, room)
    elif max_tokens > room:
        raise APIError(400, f"This model's maximum context length is {context} tokens. However, you requested "
                       f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the prompt, {max_tokens} in the "
                       "completion). Please reduce the length of the prompt or completion.",
                       param=prompt_param, code="context_length_exceeded")
    stop = (body.stop,) if isinstance(body.stop, str) else tuple(body.stop or ())
    if any(s == "" for s in stop):
        raise APIError(400, "stop strings must not be empty", param="stop", code="invalid_value")
    grammar = request_grammar(engine.model, body)  # response_format, llama.cpp's grammar / json_schema
    try:
        sampling = SamplingParams(temperature=body.temperature, top_k=max(body.top_k, 0), top_p=body.top_p,
                                  min_p=body.min_p, seed=body.seed, grammar=grammar)
    except ValueError as exc:
        raise APIError(400, str(exc), code="invalid_value") from None
    spec = resolve_spec(engine.spec, body.speculative)
    sources = bool(body.stream_options and body.stream_options.include_sources)
    return Job(prompt, sampling, max_tokens, stop, spec, stream=body.stream, endpoint=endpoint,
               loop=asyncio.get_running_loop(), skip_special=body.skip_special_tokens, sources=sources)
