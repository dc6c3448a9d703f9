"""One streaming request to an OpenAI-compatible server, timed from the client (the load run's unit).

    result = stream_request(client, "http://127.0.0.1:8000", "/v1/completions", body, RequestResult("p1", 0),
                            timeout_s=300)
    result.ok, result.ttft_s, result.latency_s, result.tokens, result.text

TTFT = first chunk carrying text - send; latency = last byte - send; TPOT = (latency - TTFT) /
(tokens - 1). Output tokens are the stream's usage.completion_tokens when the server sends it, else
one per text chunk. A network or server failure is kept on the result as an error kind and a message.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class RequestResult:
    prompt_id: str
    index: int
    ok: bool = False
    error: str | None = None  # kind: "http 503", "timeout", "connection refused", "incomplete stream", ...
    message: str | None = None
    sent_at: float = 0.0  # seconds from the level's start
    ttft_s: float | None = None
    latency_s: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each text-carrying chunk, from send
    text: str = ""
    finish_reason: str | None = None
    usage_tokens: int | None = None  # usage.completion_tokens, when the server sent it
    spec: dict | None = None  # specdec's per-request counters, when the server sent them

    @property
    def tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.chunk_times)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.latency_s is None or self.tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.tokens - 1)

    def record(self) -> dict:
        """The per-request row of results.json (chunk times summarized, not listed)."""
        return {"prompt": self.prompt_id, "index": self.index, "ok": self.ok, "error": self.error,
                "message": self.message, "sent_at_s": self.sent_at, "ttft_s": self.ttft_s,
                "latency_s": self.latency_s, "tpot_s": self.tpot_s, "tokens": self.tokens if self.ok else None,
                "usage_tokens": self.usage_tokens, "text_chunks": len(self.chunk_times),
                "finish_reason": self.finish_reason}


def _first_choice(data) -> dict | None:
    """The first choice of a streamed chunk ({} where it has none); None where the chunk is not shaped as
    OpenAI's (not an object, choices not a list of objects)."""
    if not isinstance(data, dict):
        return None
    choices = data.get("choices") or []
    if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
        return None
    return choices[0] if choices else {}


def _chunk_text(choice: dict, chat: bool) -> str:
    text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
    return text if isinstance(text, str) else ""


def stream_request(client: httpx.Client, base: str, path: str, body: dict, result: RequestResult,
                   timeout_s: float) -> RequestResult:
    """Send one streaming request and fill `result`; never raises for a network or server failure."""
    chat = path.endswith("chat/completions")
    t0 = time.perf_counter()
    deadline = t0 + timeout_s
    done = False
    try:
        with client.stream("POST", base + path, json=body) as response:
            if response.status_code != 200:
                response.read()
                result.error, result.message = f"http {response.status_code}", error_message(response)
                return result
            for line in response.iter_lines():
                now = time.perf_counter()
                if now > deadline:
                    result.error = "timeout"
                    result.message = f"no end of stream within the per-request timeout of {timeout_s:g} s"
                    return result
                if not line.startswith("data:"):
                    continue  # blank separators, comments (": ping"), event names
                payload = line[5:].strip()
                if payload == "[DONE]":
                    done = True
                    break
                try:
                    data = json.loads(payload)
                except json.JSONDecodeError:
                    result.error, result.message = "bad stream", f"a data line is not JSON: {payload[:120]!r}"
                    return result
                choice = _first_choice(data)
                if choice is None:
                    result.error = "bad stream"
                    result.message = f"a data line is not an OpenAI chunk object: {payload[:120]!r}"
                    return result
                if "error" in data and not choice:
                    err = data["error"]
                    result.error = "stream error"
                    result.message = str(err.get("message") if isinstance(err, dict) else err)[:300]
                    return result
                text = _chunk_text(choice, chat)
                if text:
                    if result.ttft_s is None:
                        result.ttft_s = now - t0
                    result.chunk_times.append(now - t0)
                    result.text += text
                if choice.get("finish_reason"):
                    result.finish_reason = str(choice["finish_reason"])
                usage = data.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    result.usage_tokens = usage["completion_tokens"]
                if isinstance(data.get("spec"), dict):
                    result.spec = data["spec"]
    except httpx.TimeoutException as exc:
        result.error = "timeout"
        result.message = f"{type(exc).__name__} after {time.perf_counter() - t0:.1f} s (limit {timeout_s:g} s)"
        return result
    except httpx.ConnectError as exc:
        result.error = "connection refused" if "refused" in str(exc).lower() else "connection error"
        result.message = f"cannot connect to {base}: {exc}"
        return result
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        result.error = "connection error" if isinstance(exc, (httpx.NetworkError, OSError)) else "request error"
        result.message = f"{type(exc).__name__}: {exc}"[:300]
        return result
    result.latency_s = time.perf_counter() - t0
    if not done or result.finish_reason is None:
        missing = " and ".join(x for x, ok in (("a finish_reason", result.finish_reason), ("data: [DONE]", done))
                               if not ok)
        result.error, result.message = "incomplete stream", f"the stream ended without {missing}"
        return result
    result.ok = True
    return result


def error_message(response: httpx.Response) -> str:
    try:
        err = response.json().get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if err:
            return str(err)[:300]
    except (ValueError, AttributeError):
        pass
    return response.text[:300] or response.reason_phrase
