"""A Job -> its HTTP response: one JSON body when it is done, or OpenAI's SSE stream of its events.

    return await answer(worker, job, body, request, model_name, chat=False)

A stream sends "spec" on its last chunk (the one with finish_reason) and "usage" only when the client
asks for stream_options.include_usage, on the usage-only chunk (choices: []) that follows. With
stream_options.include_sources, each chunk with text also carries "specdec": {"sources": [[source,
characters], ...], "tokens", "drafted", "accepted"}: the chunk's text cut into one run per token (its
characters are Unicode code points, in order, adding up to the text), each named by where the token came
from ("target", or the drafter whose accepted draft it was), and the request's counts so far.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import Request
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from specdec.server import logprobs
from specdec.server.errors import as_api_error
from specdec.server.jobs import Delta, Done, Failed, Job
from specdec.server.metrics import ServerMetrics
from specdec.server.tools import CallParser, parse_calls
from specdec.server.scheduler import QueueFull, Scheduler, ServerStopping
from specdec.server.schemas import APIError, GenerationRequest

_DISCONNECT_POLL_S = 0.25  # how often a waiting handler checks that its client is still there


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


def _usage(done: Done) -> dict:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": done.cached_tokens}}


def _logprobs(job: Job, done: Done, tokenizer, chat: bool) -> dict | None:
    if job.logprobs is None or done.logprobs is None:
        return None
    if chat:
        return logprobs.chat_object(done.logprobs, tokenizer)
    return logprobs.completion_object(done.logprobs, tokenizer, job.logprobs)


async def answer(worker: Scheduler, job: Job, body: GenerationRequest, request: Request, model_name: str,
                 chat: bool):
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    created = int(time.time())
    try:
        worker.submit(job)
    except QueueFull as full:
        raise APIError(503, str(full), type="server_error", code="server_busy",
                       headers={"Retry-After": str(full.retry_after_s)}) from None
    except ServerStopping as stopping:
        raise as_api_error(stopping) from None
    streaming = False
    try:
        event = await _next_event(job, request)
        if isinstance(event, Failed):
            raise as_api_error(event.error)
        if isinstance(event, Done) and event.finish_reason == "cancelled":
            raise APIError(503, "the request was cancelled: the server is stopping",
                           type="server_error", code="cancelled")
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            streaming = True
            return StreamingResponse(
                _sse(job, event, rid, created, model_name, chat, include_usage, request.app.state.metrics,
                     chat and bool(body.tools) and body.tool_choice != "none", worker.engine.model.tokenizer),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
                background=BackgroundTask(job.cancel))  # also when the stream never started
        while not isinstance(event, Done):
            event = await _next_event(job, request)
            if isinstance(event, Failed):
                raise as_api_error(event.error)
    except _ClientGone:
        return Response(status_code=499)  # nobody reads this; the worker has been told to stop
    finally:
        if not streaming:
            job.cancel()  # a no-op when the job is done; stops it when this handler ends early
    tokenizer = worker.engine.model.tokenizer
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": event.text},
                  "logprobs": _logprobs(job, event, tokenizer, chat), "finish_reason": event.finish_reason}
        if body.tools and body.tool_choice != "none":  # the answer's <tool_call> blocks as OpenAI's tool_calls
            content, calls = parse_calls(event.text)
            if calls:
                choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
                choice["finish_reason"] = "tool_calls" if event.finish_reason == "stop" else event.finish_reason
    else:
        choice = {"index": 0, "text": event.text, "logprobs": _logprobs(job, event, tokenizer, chat),
                  "finish_reason": event.finish_reason}
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": model_name, "choices": [choice], "usage": _usage(event), "spec": event.stats.to_dict()}


async def _sse(job: Job, first, rid: str, created: int, model_name: str, chat: bool, include_usage: bool,
               metrics: ServerMetrics, tools: bool = False, tokenizer=None):
    """OpenAI's SSE stream: `data: {chunk}` lines, then `data: [DONE]`. The job is cancelled if this stops early.
    tools: the answer's <tool_call> blocks go out as tool_calls deltas as they are written (server/tools.py).
    With Job.logprobs, each chunk with text carries the logprobs its events brought (those of the tokens whose
    text it completes), and the chunk with finish_reason any left (tokens with no text: an EOS, a stop string's)."""
    obj = "chat.completion.chunk" if chat else "text_completion"
    calls = CallParser() if tools else None
    called = False  # a tool_calls delta went out
    owed: list = []  # TokenLogprobs the events brought that no chunk carried yet
    offset = 0  # completions' text_offset of the next token: its tokens' texts so far, as the unstreamed answer's

    def take_logprobs() -> dict | None:
        nonlocal owed, offset
        if job.logprobs is None or not owed:
            return None
        entries, owed = owed, []
        if chat:
            return logprobs.chat_object(entries, tokenizer)
        out = logprobs.completion_object(entries, tokenizer, job.logprobs, offset)
        offset += sum(len(t) for t in out["tokens"])
        return out

    def chunk(text: str | None, finish_reason: str | None = None, role: bool = False, tool_calls=None,
              **extra) -> str:
        if chat:
            delta = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_calls is not None:
                delta["tool_calls"] = tool_calls
            choice = {"index": 0, "delta": delta, "logprobs": take_logprobs(), "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": take_logprobs(), "finish_reason": finish_reason}
        return _data({"id": rid, "object": obj, "created": created, "model": model_name, "choices": [choice],
                      **extra})

    try:
        if chat:
            yield chunk("", role=True)
        event = first
        while True:
            if isinstance(event, (Delta, Done)) and event.logprobs:
                owed += event.logprobs
            if isinstance(event, (Delta, Done)) and event.text:
                if calls is None:
                    yield chunk(event.text, **({"specdec": event.sources} if event.sources else {}))
                else:  # content, and tool calls' names and arguments as they are written
                    for kind, value in calls.feed(event.text):
                        called |= kind == "tool_call"
                        yield chunk(value) if kind == "content" else chunk(None, tool_calls=[value])
            if isinstance(event, Done):
                spec = event.stats.to_dict()
                finish = event.finish_reason
                if calls is not None:
                    for kind, value in calls.finish():  # held text of a block that never became a call
                        yield chunk(value)
                    finish = "tool_calls" if called and finish == "stop" else finish
                yield chunk(None, finish, spec=spec)
                if include_usage:  # OpenAI's usage-only chunk, the one place a stream carries usage
                    yield _data({"id": rid, "object": obj, "created": created, "model": model_name, "choices": [],
                                 "usage": _usage(event), "spec": spec})
                break
            elif isinstance(event, Failed):  # counted by code as the error handler counts one before the stream
                err = as_api_error(event.error)
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
