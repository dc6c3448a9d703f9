"""OpenAI-compatible HTTP server over one Engine.

    app = create_app(engine, "smollm2-135m", api_key=None)
    uvicorn.run(app, host="127.0.0.1", port=8000)

Endpoints: POST /v1/completions, POST /v1/chat/completions (both stream as SSE with
"stream": true), GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics
(Prometheus text). With an api_key, every /v1 path needs "Authorization: Bearer KEY" (or
"X-Api-Key: KEY"); /health and /metrics stay open (they say nothing about prompts).

Extras OpenAI clients ignore: the request field "speculative" overrides the server's
speculative settings for that request (see overrides.py); every response carries
"spec" = SpecStats.to_dict() of that request next to the usual "usage". A stream sends
"spec" on its last chunk (the one with finish_reason) and, as OpenAI does, "usage" only when
the client asks for stream_options.include_usage: on the usage-only chunk (choices: []) that
follows, with "spec" again.

Concurrency: handlers only validate, tokenize and wait; generation runs on one scheduler
thread (scheduler.py) that batches up to max_batch sequences into one target forward per
step (continuous batching), each with its own draft, and queues at most max_queue more
(beyond that: 503 with Retry-After). A client that disconnects cancels its request, which
frees its sequence's place at the next step.

Errors are OpenAI's {"error": {"message", "type", "param", "code"}}: malformed JSON and
wrong field types are 400 (FastAPI's 422 is replaced), an unknown model is 404
(model_not_found), a missing or wrong API key is 401, a prompt longer than the context is
400 (context_length_exceeded), a full queue is 503 (server_busy, with Retry-After), a
request past the server's --request-timeout is 504 (timeout).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response, StreamingResponse

from specdec.engine.engine import Engine
from specdec.model.errors import SpecdecError
from specdec.sampling import SamplingParams
from specdec.server.metrics import CONTENT_TYPE, ServerMetrics
from specdec.server.overrides import resolve_spec
from specdec.server.scheduler import DEFAULT_PREFILL_CHUNK, QueueFull, Scheduler, ServerStopping
from specdec.server.schemas import (APIError, ChatCompletionRequest, CompletionRequest, GenerationRequest,
                                    answer_changing)
from specdec.server.jobs import Delta, Done, Failed, Job

log = logging.getLogger("specdec.server")

DEFAULT_MAX_TOKENS = 256  # when a request names no max_tokens (capped by the room left in the context)
MAX_BODY_BYTES = 32 * 2**20  # a bigger request body is a 413 before it is read whole: no prompt that fits is so long
_DISCONNECT_POLL_S = 0.25  # how often a waiting handler checks that its client is still there


def create_app(engine: Engine, model_name: str, api_key: str | None = None,
               default_max_tokens: int = DEFAULT_MAX_TOKENS, max_batch: int | None = None, max_queue: int = 64,
               request_timeout: float | None = None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK) -> FastAPI:
    """A FastAPI app serving `engine` as model `model_name`. One app per engine: the app owns its scheduler.

    max_batch: sequences generated together (default: every cache slot of the engine, see
    Engine(max_sequences=...)); max_queue: requests that may wait beyond those; request_timeout:
    seconds from arrival after which a request fails (None: no limit).
    """
    metrics = ServerMetrics()
    worker = Scheduler(engine, metrics, max_batch, max_queue, prefill_chunk, request_timeout)
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        yield
        await run_in_threadpool(worker.stop)

    app = FastAPI(title="specdec", summary="OpenAI-compatible speculative decoding server", lifespan=lifespan)
    app.state.engine, app.state.worker, app.state.metrics = engine, worker, metrics
    if api_key:
        app.add_middleware(_APIKeyMiddleware, api_key=api_key, metrics=metrics)
    app.add_middleware(_BodyLimit, limit=MAX_BODY_BYTES, metrics=metrics)
    _install_error_handlers(app, metrics)
    tok = engine.model.tokenizer

    # -- info routes ---------------------------------------------------------------------------
    def model_card() -> dict:
        return {"id": model_name, "object": "model", "created": created, "owned_by": "specdec",
                "max_model_len": engine.cache.max_len, "speculative": engine.spec.method}

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def list_models():
        return {"object": "list", "data": [model_card()]}

    @app.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"])
    async def get_model(model_id: str):
        _check_model(model_id, model_name)
        return model_card()

    @app.api_route("/health", methods=["GET", "HEAD"])  # health checkers often send HEAD
    async def health():
        return {"status": "ok", "model": model_name, "waiting": worker.waiting, "running": worker.running,
                "max_batch": worker.max_batch}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    # -- generation routes ---------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        if body.logprobs is not None:
            raise APIError(400, "logprobs are not supported by this server", param="logprobs", code="unsupported")
        if body.echo:
            raise APIError(400, "echo is not supported by this server", param="echo", code="unsupported")
        if body.best_of not in (None, 1):
            raise APIError(400, f"best_of must be 1 (one completion per request), got {body.best_of}",
                           param="best_of", code="unsupported")
        if body.suffix:
            raise APIError(400, "suffix (text after the completion) is not supported by this server",
                           param="suffix", code="unsupported")
        _check_model(body.model, model_name)
        ids = await run_in_threadpool(_completion_prompt, tok, body.prompt, engine.model.config.vocab_size,
                                      engine.cache.max_len)
        job = _make_job(engine, body, ids, body.max_tokens, "completions", "prompt", default_max_tokens)
        return await _answer(worker, job, body, request, model_name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        if body.logprobs or body.top_logprobs is not None:
            param = "logprobs" if body.logprobs else "top_logprobs"
            raise APIError(400, f"{param} are not supported by this server", param=param, code="unsupported")
        _check_model(body.model, model_name)
        if body.max_tokens is not None and body.max_completion_tokens is not None \
                and body.max_tokens != body.max_completion_tokens:
            raise APIError(400, "max_tokens and max_completion_tokens differ; send one of them",
                           param="max_completion_tokens", code="invalid_value")
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        for i, m in enumerate(body.messages):
            if m.tool_calls or m.function_call:
                field = "tool_calls" if m.tool_calls else "function_call"
                raise APIError(400, f"messages[{i}] carries {field}, which this server cannot put in the prompt "
                               "(it serves no tools)", param=f"messages.{i}.{field}", code="unsupported")
            if m.prefix or m.partial:
                field = "prefix" if m.prefix else "partial"
                raise APIError(400, f"messages[{i}] asks for its text to be continued ({field}: true), which this "
                               "server does not do: its chat template closes every message",
                               param=f"messages.{i}.{field}", code="unsupported")
        messages = [m.as_template_dict() for m in body.messages]
        ids = await run_in_threadpool(_chat_prompt, tok, messages, engine.cache.max_len)
        job = _make_job(engine, body, ids, max_tokens, "chat.completions", "messages", default_max_tokens,
                        "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens")
        return await _answer(worker, job, body, request, model_name, chat=True)

    return app


# -- request -> Job ----------------------------------------------------------------------------
def _check_model(name: str | None, served: str) -> None:
    if name is not None and name != served:
        raise APIError(404, f"The model `{name}` does not exist; this server serves `{served}`.", param="model",
                       code="model_not_found")


def _completion_prompt(tok, prompt, vocab_size: int, context: int) -> list[int]:
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


def _chat_prompt(tok, messages: list[dict], context: int) -> list[int]:
    try:
        text = tok.apply_chat_template(messages)
    except ValueError as exc:  # any failure of the template (model/tokenizer.py)
        raise APIError(400, f"the chat template rejected these messages: {exc}", param="messages",
                       code="invalid_value") from None
    return _encode(tok, text, "messages", context, add_bos=False)


def _encode(tok, text: str, param: str, context: int, add_bos: bool | None = None) -> list[int]:
    """The prompt's ids; a text that cannot fit the context is refused without being tokenized whole."""
    try:
        ids = tok.encode_at_most(text, context - 1, add_bos=add_bos)  # _make_job's room: one token at least
    except ValueError as exc:  # text that is not UTF-8
        raise APIError(400, str(exc), param=param, code="invalid_value") from None
    if ids is None:
        raise _context_exceeded(context, f"more than {context - 1}", param)
    return ids


def _context_exceeded(context: int, tokens: str, param: str) -> APIError:
    return APIError(400, f"This model's maximum context length is {context} tokens. However, your prompt has "
                    f"{tokens} tokens, which leaves no room for a completion. Please shorten the prompt.",
                    param=param, code="context_length_exceeded")


def _make_job(engine: Engine, body: GenerationRequest, prompt: list[int], max_tokens: int | None, endpoint: str,
              prompt_param: str, default_max_tokens: int, max_tokens_param: str = "max_tokens") -> Job:
    if body.n != 1:
        raise APIError(400, f"n must be 1 (one choice per request), got {body.n}", param="n", code="invalid_value")
    if body.stream_options is not None and not body.stream:  # vLLM refuses it too: it asks for what never comes
        raise APIError(400, "stream_options is only allowed with stream: true", param="stream_options",
                       code="invalid_value")
    for name in ("frequency_penalty", "presence_penalty"):
        if getattr(body, name):
            raise APIError(400, f"{name} is not supported by this server (send 0)", param=name, code="unsupported")
    unsupported = {"logit_bias": bool(body.logit_bias), "tools": bool(body.tools),
                   "tool_choice": body.tool_choice not in (None, "none", "auto"),
                   "response_format": body.response_format not in (None, {"type": "text"})}
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
    try:
        sampling = SamplingParams(temperature=body.temperature, top_k=max(body.top_k, 0), top_p=body.top_p,
                                  min_p=body.min_p, seed=body.seed)
    except ValueError as exc:
        raise APIError(400, str(exc), code="invalid_value") from None
    spec = resolve_spec(engine.spec, body.speculative)
    return Job(prompt, sampling, max_tokens, stop, spec, stream=body.stream, endpoint=endpoint,
               loop=asyncio.get_running_loop(), skip_special=body.skip_special_tokens)


# -- Job -> response ---------------------------------------------------------------------------
class _ClientGone(Exception):
    pass


async def _next_event(job: Job, request: Request):
    """The job's next event; cancels the job and raises _ClientGone when the client disconnects first."""
    getter = asyncio.ensure_future(job.events.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=_DISCONNECT_POLL_S)
            if done:
                return getter.result()
            if await request.is_disconnected():
                job.cancel()
                raise _ClientGone
    finally:
        if not getter.done():
            getter.cancel()


def _worker_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, TimeoutError):
        return APIError(504, str(exc), type="server_error", code="timeout")
    if isinstance(exc, ServerStopping):
        return APIError(503, str(exc), type="server_error", code="server_stopping")
    if isinstance(exc, ValueError):
        return APIError(400, str(exc), code="invalid_value")
    if isinstance(exc, SpecdecError):
        return APIError(500, str(exc), type="server_error", code="internal_error")
    log.error("generation failed: %r", exc)
    return APIError(500, f"generation failed: {type(exc).__name__}: {exc}", type="server_error",
                    code="internal_error")


def _usage(done: Done) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


async def _answer(worker: Scheduler, job: Job, body: GenerationRequest, request: Request, model_name: str,
                  chat: bool):
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    try:
        worker.submit(job)
    except QueueFull as full:
        raise APIError(503, str(full), type="server_error", code="server_busy",
                       headers={"Retry-After": str(full.retry_after_s)}) from None
    except ServerStopping as stopping:
        raise _worker_error(stopping) from None
    streaming = False
    try:
        event = await _next_event(job, request)
        if isinstance(event, Failed):
            raise _worker_error(event.error)
        if isinstance(event, Done) and event.finish_reason == "cancelled":
            raise APIError(503, "the request was cancelled: the server is stopping",
                           type="server_error", code="cancelled")
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            streaming = True
            return StreamingResponse(
                _sse(job, event, rid, created, model_name, chat, include_usage, request.app.state.metrics),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                background=BackgroundTask(job.cancel))  # also when the stream never started
        while not isinstance(event, Done):
            event = await _next_event(job, request)
            if isinstance(event, Failed):
                raise _worker_error(event.error)
    except _ClientGone:
        return Response(status_code=499)  # nobody reads this; the worker has been told to stop
    finally:
        if not streaming:
            job.cancel()  # a no-op when the job is done; stops it when this handler ends early
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": event.text}, "logprobs": None,
                  "finish_reason": event.finish_reason}
    else:
        choice = {"index": 0, "text": event.text, "logprobs": None, "finish_reason": event.finish_reason}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model_name, "choices": [choice], "usage": _usage(event), "spec": event.stats.to_dict()}


async def _sse(job: Job, first, rid: str, created: int, model_name: str, chat: bool, include_usage: bool,
               metrics: ServerMetrics):
    """OpenAI's SSE stream: `data: {chunk}` lines, then `data: [DONE]`. The job is cancelled if this stops early."""
    obj = "chat.completion.chunk" if chat else "text_completion"

    def chunk(text: str | None, finish_reason: str | None = None, role: bool = False, **extra) -> str:
        if chat:
            delta = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return _data({"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice],
                      **extra})

    try:
        if chat:
            yield chunk("", role=True)
        event = first
        while True:
            if isinstance(event, Delta):
                if event.text:
                    yield chunk(event.text)
            elif isinstance(event, Done):
                if event.text:
                    yield chunk(event.text)
                spec = event.stats.to_dict()
                yield chunk(None, event.finish_reason, spec=spec)
                if include_usage:  # OpenAI's usage-only chunk, the one place a stream carries usage
                    yield _data({"id": rid, "object": obj, "created": created, "model": model_name, "choices": [],
                                 "usage": _usage(event), "spec": spec})
                break
            elif isinstance(event, Failed):  # counted by code as the error handler counts one before the stream
                err = _worker_error(event.error)
                metrics.record_error(err.status, err.code)
                yield _data(err.body(), ascii=True)
                break
            event = await job.events.get()
        yield "data: [DONE]\n\n"
    finally:
        job.cancel()  # a no-op when the job is done; stops generation when the client went away


def _data(obj: dict, ascii: bool = False) -> str:
    """One SSE event. ascii: escape non-ASCII (an error message may quote a lone surrogate the client sent)."""
    return f"data: {json.dumps(obj, ensure_ascii=ascii)}\n\n"


# -- errors and authentication ------------------------------------------------------------------
_PYDANTIC_CODES = {"missing": "missing_required_parameter", "extra_forbidden": "unknown_parameter",
                   "json_invalid": "invalid_json"}


def _param_loc(error: dict) -> list[str]:
    """A validation error's parameter path without "body" and without pydantic's names of union branches
    ('str', 'list[TextPart]'), which are no parameter of the request ("messages.0.content.str")."""
    return [str(p) for p in tuple(error.get("loc", ()))[1:]
            if not (isinstance(p, str) and ("[" in p or p in ("str", "int", "float", "bool", "none")))]


def _install_error_handlers(app: FastAPI, metrics: ServerMetrics) -> None:
    def answer(err: APIError) -> JSONResponse:
        metrics.record_error(err.status, err.code)
        return err.response()

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        errors = exc.errors()
        first = errors[0] if errors else {"type": "invalid", "loc": ("body",), "msg": "invalid request"}
        # a union field (content: str | list[TextPart]) fails once per branch, the string branch first: the
        # error that got deepest into the value says what is wrong ("Input should be 'text'" for an image part)
        field = tuple(first.get("loc", ()))[:2]
        first = max((e for e in errors if tuple(e.get("loc", ()))[:2] == field), key=lambda e: len(_param_loc(e)),
                    default=first)
        kind = first.get("type", "")
        loc = _param_loc(first)
        param = ".".join(loc) or None
        if kind == "json_invalid":
            message = ("We could not parse the JSON body of your request: "
                       f"{first.get('ctx', {}).get('error', 'invalid JSON')}. The API expects a JSON object.")
            param = None
        elif kind in ("model_attributes_type", "missing") and not loc:  # a body that is no object, or none
            message = "The request body must be a JSON object."
            param, kind = None, "model_attributes_type"  # an empty body misses no parameter: it is no object
        elif kind == "missing":
            message = f"Missing required parameter: '{param}'."
        elif kind.endswith("_type"):
            given = repr(first.get("input"))[:60]
            message = f"Invalid type for '{param}': {first.get('msg', 'wrong type')} (got {given})."
        elif param is None:  # e.g. a key that is no valid string
            message = f"Invalid request body: {first.get('msg', 'invalid')}."
        else:
            message = f"Invalid value for '{param}': {first.get('msg', 'invalid')}."
            if re.fullmatch(r"messages\.\d+\.content\.\d+\.type", param):
                message += " specdec serves text models: a message's content parts must be text parts."
        code = _PYDANTIC_CODES.get(kind, "invalid_type" if kind.endswith("_type") else "invalid_value")
        return answer(APIError(400, message, param=param, code=code))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        message = f"{exc.detail}: {request.method} {request.url.path}" if exc.status_code in (404, 405) \
            else str(exc.detail)
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        if exc.status_code == 400:  # FastAPI's own: a body that is not UTF-8 or nests too deep for the parser
            message = ("We could not parse the body of your request as JSON (it is not UTF-8 text, or it nests "
                       "too deep). The API expects a JSON object.")
            code = "invalid_json"
        return answer(APIError(exc.status_code, message, param=None, code=code))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return answer(APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error",
                               code="internal_error"))


class _BodyLimit:
    """A request body over `limit` bytes is a 413 in OpenAI's error shape: at once when Content-Length says so,
    else (a chunked body) as soon as the bytes read pass the limit."""

    def __init__(self, app, limit: int, metrics: ServerMetrics):
        self.app, self.limit, self.metrics = app, limit, metrics

    def too_large(self, size: str) -> str:
        return f"the request body has {size} bytes; this server takes at most {self.limit} (no prompt that fits " \
               "the context is longer)"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            self.metrics.record_error(413, "request_too_large")
            error = APIError(413, self.too_large(str(int(declared))), code="request_too_large")
            await error.response()(scope, receive, send)
            return
        read = 0

        async def counted():
            nonlocal read
            message = await receive()
            read += len(message.get("body", b""))
            if read > self.limit:  # raised inside the body's parsing: the app's error handler answers it
                raise StarletteHTTPException(413, self.too_large(f"more than {self.limit}"))
            return message

        await self.app(scope, counted, send)


class _APIKeyMiddleware:
    """Every /v1 path needs the key: `Authorization: Bearer <api_key>` (the scheme in any case, as RFC 7235
    says) or `X-Api-Key: <api_key>` (llama.cpp's server takes it). Plain ASGI, so streaming is untouched."""

    def __init__(self, app, api_key: str, metrics: ServerMetrics):
        self.app = app
        self.expected = api_key.encode()
        self.metrics = metrics

    def given_key(self, headers: dict[bytes, bytes]) -> bytes | None:
        if b"authorization" in headers:
            scheme, _, key = headers[b"authorization"].partition(b" ")
            return key.strip(b" ") if scheme.lower() == b"bearer" else b""
        return headers.get(b"x-api-key")

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1"):
            given = self.given_key(dict(scope["headers"]))
            if given is None or not hmac.compare_digest(given, self.expected):
                message = ("You didn't provide an API key: send it as 'Authorization: Bearer KEY'." if given is None
                           else "Incorrect API key provided.")
                self.metrics.record_error(401, "invalid_api_key")
                response = APIError(401, message, code="invalid_api_key",
                                    headers={"WWW-Authenticate": "Bearer"}).response()
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
