"""OpenAI-compatible HTTP server over one Engine.

    app = create_app(engine, "smollm2-135m", api_key=None)
    uvicorn.run(app, host="127.0.0.1", port=8000)

Endpoints: POST /v1/completions, POST /v1/chat/completions (both stream as SSE with
"stream": true), GET /v1/models, GET /v1/models/{id}, GET /health, GET /metrics
(Prometheus text), and GET / the chat page (static/chat.html: it streams the chat endpoint and
colours each token by where it came from). With an api_key, every /v1 path needs "Authorization:
Bearer KEY" (or "X-Api-Key: KEY"); /, /health and /metrics stay open (they say nothing about prompts;
the page sends the key the user types into it).

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

The routes are here; a request body becomes a Job in job_builder.py, a Job's events become the
response (JSON or SSE) in responses.py, errors take OpenAI's shape in errors.py, and the API key
and the body's size are checked in middleware.py before any route runs.
"""

from __future__ import annotations

import time
from contextlib import asynccontextmanager
from importlib.resources import files

from fastapi import FastAPI, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, Response

from specdec.engine.engine import Engine
from specdec.server import logprobs
from specdec.server.errors import install_error_handlers
from specdec.server.job_builder import chat_prompt, check_model, completion_prompt, make_job
from specdec.server.tools import OPEN as OPEN_CALL
from specdec.server.tools import check_tools, template_messages
from specdec.server.metrics import CONTENT_TYPE, ServerMetrics
from specdec.server.middleware import APIKeyMiddleware, BodyLimit
from specdec.server.responses import answer
from specdec.server.scheduler import DEFAULT_PREFILL_CHUNK, Scheduler
from specdec.server.schemas import APIError, ChatCompletionRequest, CompletionRequest

DEFAULT_MAX_TOKENS = 256  # when a request names no max_tokens (capped by the room left in the context)
MAX_BODY_BYTES = 32 * 2**20  # a bigger request body is a 413 before it is read whole: no prompt that fits is so long


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
        app.add_middleware(APIKeyMiddleware, api_key=api_key, metrics=metrics)
    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES, metrics=metrics)
    install_error_handlers(app, metrics)
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
        check_model(model_id, model_name)
        return model_card()

    @app.api_route("/health", methods=["GET", "HEAD"])  # health checkers often send HEAD
    async def health():
        return {"status": "ok", "model": model_name, "waiting": worker.waiting, "running": worker.running,
                "max_batch": worker.max_batch}

    @app.get("/metrics")
    async def prometheus():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    page = (files("specdec.server") / "static" / "chat.html").read_text(encoding="utf-8")

    @app.get("/", include_in_schema=False)
    async def chat_page():
        return HTMLResponse(page)

    # -- generation routes ---------------------------------------------------------------------
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        want_logprobs = logprobs.completion_request(body.logprobs)
        if body.echo:
            raise APIError(400, "echo is not supported by this server", param="echo", code="unsupported")
        if body.best_of not in (None, 1):
            raise APIError(400, f"best_of must be 1 (one completion per request), got {body.best_of}",
                           param="best_of", code="unsupported")
        if body.suffix:
            raise APIError(400, "suffix (text after the completion) is not supported by this server",
                           param="suffix", code="unsupported")
        check_model(body.model, model_name)
        ids = await run_in_threadpool(completion_prompt, tok, body.prompt, engine.model.config.vocab_size,
                                      engine.cache.max_len)
        job = make_job(engine, body, ids, body.max_tokens, "completions", "prompt", default_max_tokens)
        job.logprobs = want_logprobs
        return await answer(worker, job, body, request, model_name, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        want_logprobs = logprobs.chat_request(body.logprobs, body.top_logprobs)
        check_model(body.model, model_name)
        if body.max_tokens is not None and body.max_completion_tokens is not None \
                and body.max_tokens != body.max_completion_tokens:
            raise APIError(400, "max_tokens and max_completion_tokens differ; send one of them",
                           param="max_completion_tokens", code="invalid_value")
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        check_tools(body.tools, body.tool_choice, tok.chat_template)
        for i, m in enumerate(body.messages):
            if m.function_call or (m.tool_calls and OPEN_CALL not in (tok.chat_template or "")):
                field = "function_call" if m.function_call else "tool_calls"
                raise APIError(400, f"messages[{i}] carries {field}, which this server cannot put in this model's "
                               "prompt (use tool_calls, with a model whose template writes them)",
                               param=f"messages.{i}.{field}", code="unsupported")
            if m.prefix or m.partial:
                field = "prefix" if m.prefix else "partial"
                raise APIError(400, f"messages[{i}] asks for its text to be continued ({field}: true), which this "
                               "server does not do: its chat template closes every message",
                               param=f"messages.{i}.{field}", code="unsupported")
        messages = template_messages(body.messages)  # assistant tool_calls and tool results too (server/tools.py)
        tools = body.tools if body.tool_choice != "none" else None
        ids = await run_in_threadpool(chat_prompt, tok, messages, engine.cache.max_len, tools)
        job = make_job(engine, body, ids, max_tokens, "chat.completions", "messages", default_max_tokens,
                       "max_tokens" if body.max_completion_tokens is None else "max_completion_tokens")
        job.logprobs = want_logprobs
        return await answer(worker, job, body, request, model_name, chat=True)

    return app

