"""OpenAI's `logprobs` fields: what a request asks for, and the response's objects (engine/logprobs.py computes
them: the target's log-probabilities after any grammar mask, the same with and without speculation).

    /v1/completions        "logprobs": n (0..20)  ->  choice["logprobs"] = {"tokens", "token_logprobs",
                           "top_logprobs": [{token: logprob}, ...] or null, "text_offset"}
    /v1/chat/completions   "logprobs": true, "top_logprobs": n  ->  choice["logprobs"] = {"content": [{"token",
                           "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}

A token's text is its own decoding (a token that holds part of a UTF-8 character reads as U+FFFD there, as in
vLLM); "bytes" are that text's UTF-8. A logprob of -inf (a token a grammar forbids, listed among the top ones)
is sent as -9999.0, as vLLM does: JSON has no infinity.

Streamed, each chunk carries the same objects for its own tokens, as vLLM does (chat: "logprobs":
{"content": [...]}; completions: the four lists, text_offset counting on from the chunks before): a token goes
out in the chunk that completes its text (server/scheduler.py), tokens with no text of their own (an EOS, a
stop string's, a character's first bytes) with the next such chunk or the last one; over the whole stream, each
token exactly once, in order: the chunks' lists joined are the unstreamed answer's.
"""

from __future__ import annotations

import math

from specdec.engine.logprobs import MAX_TOP_LOGPROBS, TokenLogprob
from specdec.server.schemas import APIError

FORBIDDEN = -9999.0  # what -inf is sent as


def completion_request(logprobs: int | None) -> int | None:
    """The engine's logprobs count of a /v1/completions request (None: none asked)."""
    if logprobs is None:
        return None
    _check_count(logprobs, "logprobs")
    return logprobs


def chat_request(logprobs: bool | None, top_logprobs: int | None) -> int | None:
    """The engine's logprobs count of a /v1/chat/completions request (None: none asked)."""
    if top_logprobs is not None and not logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value")
    if not logprobs:
        return None
    if top_logprobs is not None:
        _check_count(top_logprobs, "top_logprobs")
    return top_logprobs or 0


def chat_object(entries: list[TokenLogprob], tokenizer) -> dict:
    def one(token: int, logprob: float) -> dict:
        text = tokenizer.decode([token])
        return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                        for e in entries], "refusal": None}


def completion_object(entries: list[TokenLogprob], tokenizer, top: int, start: int = 0) -> dict:
    """start: the first token's text_offset (a streamed chunk's: the text of the tokens in the chunks before)."""
    texts = [tokenizer.decode([e.token]) for e in entries]
    offsets, at = [], start
    for text in texts:
        offsets.append(at)
        at += len(text)
    tops = [{tokenizer.decode([t]): _finite(lp) for t, lp in e.top} for e in entries] if top else None
    return {"tokens": texts, "token_logprobs": [_finite(e.logprob) for e in entries], "top_logprobs": tops,
            "text_offset": offsets}


def _finite(logprob: float) -> float:
    return FORBIDDEN if math.isinf(logprob) else logprob


def _check_count(n, param: str) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP_LOGPROBS:
        raise APIError(400, f"{param} must be an integer between 0 and {MAX_TOP_LOGPROBS}, got {n!r}", param=param,
                       code="invalid_value")
