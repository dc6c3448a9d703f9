"""`specdec bench --concurrency 1,4,16`: an OpenAI-compatible server under load, measured from the client.

For each concurrency level C, C worker threads share the level's N requests: each takes the
next request (prompt i mod len(prompts)), streams it to completion, and takes another, until
all N were sent. Every loop is bounded: N requests, a per-request deadline (checked between
stream chunks; the HTTP read timeout bounds a silent stall), and a per-level deadline after
which no new request starts.

    settings = LoadSettings(url="http://127.0.0.1:8000", model="smollm2-135m", levels=(1, 4, 16),
                            requests=16, max_tokens=32)
    section = run_load(settings, load_prompts("mixed"))      # the "load" section of results.json

    with LocalServer(["--model", "smollm2-135m", "--spec-type", "ngram-simple"], log_path) as server:
        section = run_load(replace(settings, url=server.url), prompts)

Only the HTTP API is used (streaming completions or chat, /v1/models, /health), so the same
client measures llama-server, vLLM or specdec's own server, however that server schedules
requests. Per request: TTFT = first chunk carrying text - send; latency = last byte - send;
TPOT = (latency - TTFT) / (tokens - 1); inter-token latency (ITL) = gaps between arrivals of
text-carrying chunks (a chunk may carry several tokens: a verify step can emit several).
Output tokens come from the stream's usage (stream_options.include_usage) when the server
sends it, else one per text chunk; the report says which.

Greedy check (temperature 0): every output is compared, as text, with the output of the same
prompt sent alone (the concurrency-1 level when there is one, else a sequential reference pass).
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx

from specdec.model.errors import SpecdecError

SCHEMA = "specdec-bench-load/1"
ENDPOINTS = ("completions", "chat")


# -- percentiles -------------------------------------------------------------------------------
def percentile(values, p: float) -> float | None:
    """The p-th percentile (0..100), linear between closest ranks (numpy's default); None when empty.

    >>> percentile([1, 2, 3, 4], 50)
    2.5
    >>> percentile([10, 20, 30, 40, 50], 90)   # rank 0.9 * 4 = 3.6 -> 40 + 0.6 * 10
    46.0
    """
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    rank = p / 100 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def distribution(values, ps=(50, 90, 99)) -> dict:
    """{"p50": ..., "p90": ..., "p99": ..., "mean": ..., "n": ...} of the values (None entries dropped)."""
    xs = [v for v in values if v is not None]
    out = {f"p{p:g}": percentile(xs, p) for p in ps}
    out["mean"] = sum(xs) / len(xs) if xs else None
    out["n"] = len(xs)
    return out


# -- settings and one request ------------------------------------------------------------------
@dataclass(frozen=True)
class LoadSettings:
    url: str  # the server's base URL; a trailing /v1 is allowed
    model: str | None = None  # sent as "model" (None: left out)
    levels: tuple[int, ...] = (1, 4, 16)
    requests: int = 32  # per level
    max_tokens: int = 64
    temperature: float = 0.0
    endpoint: str = "completions"  # or "chat"
    request_timeout_s: float = 300.0
    level_timeout_s: float = 1800.0
    seed: int = 0
    api_key: str | None = None
    warmup: bool = True

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {self.endpoint!r}")
        if not self.levels or any(c < 1 for c in self.levels):
            raise ValueError(f"--concurrency needs levels of at least 1, got {list(self.levels)}")
        if self.requests < 1 or self.max_tokens < 1:
            raise ValueError("--requests and --max-tokens must be at least 1")
        for flag, seconds in (("--request-timeout", self.request_timeout_s), ("--level-timeout", self.level_timeout_s)):
            if not 0 < seconds < float("inf"):  # NaN too: it turned every wait into none
                raise ValueError(f"{flag} must be a positive number of seconds, got {seconds}")

    @property
    def base(self) -> str:
        return base_url(self.url)


def base_url(url: str, flag: str = "--url") -> str:
    """http://host:port from http://host:port/v1 (or /v1/); a URL without http(s)://, or one httpx cannot
    parse (a port that is not a number), is a ValueError naming the flag."""
    base = url.strip().rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    try:
        parsed = httpx.URL(base) if base.startswith(("http://", "https://")) else None
    except httpx.InvalidURL as exc:
        raise ValueError(f"{flag} {url!r} is not a valid URL ({exc}); give one like http://127.0.0.1:8080/v1") \
            from None
    if parsed is None or not parsed.host:
        raise ValueError(f"{flag} {url!r} is not an http(s) URL; give one like http://127.0.0.1:8080/v1")
    return base


def request_body(prompt, settings: LoadSettings, index: int) -> tuple[str, dict]:
    """(path, JSON body) of one streaming request for a bench Prompt.

    completions: raw text as is; chat messages as a plain "User: ...\\nAssistant:" transcript.
    chat: messages as they are; raw text as one user message.
    """
    body: dict = {"max_tokens": settings.max_tokens, "temperature": settings.temperature, "stream": True,
                  "stream_options": {"include_usage": True}}
    if settings.model:
        body["model"] = settings.model
    if settings.temperature > 0:
        body["seed"] = settings.seed + index
    if settings.endpoint == "chat":
        body["messages"] = [dict(m) for m in prompt.messages] if prompt.messages else \
            [{"role": "user", "content": prompt.text}]
        return "/v1/chat/completions", body
    if prompt.text is not None:
        body["prompt"] = prompt.text
    else:
        body["prompt"] = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in prompt.messages) + \
            "Assistant:"
    return "/v1/completions", body


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
                result.error, result.message = f"http {response.status_code}", _error_message(response)
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


def _error_message(response: httpx.Response) -> str:
    try:
        err = response.json().get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        if err:
            return str(err)[:300]
    except (ValueError, AttributeError):
        pass
    return response.text[:300] or response.reason_phrase


# -- one level ---------------------------------------------------------------------------------
def _client(settings: LoadSettings) -> httpx.Client:
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    timeout = httpx.Timeout(settings.request_timeout_s, connect=min(10.0, settings.request_timeout_s))
    return httpx.Client(timeout=timeout, headers=headers)


def run_level(settings: LoadSettings, prompts, concurrency: int, requests: int,
              indices: list[int] | None = None) -> tuple[list[RequestResult], float, int]:
    """C workers share `requests` requests; returns (results in send order, wall seconds, requests not sent).

    indices: the prompt index of each request (default i mod len(prompts)).
    """
    indices = indices if indices is not None else [i % len(prompts) for i in range(requests)]
    lock = threading.Lock()
    next_request = [0]
    results: list[RequestResult] = []

    def worker(client: httpx.Client) -> None:
        with client:
            while True:
                with lock:
                    i = next_request[0]
                    if i >= len(indices) or time.perf_counter() > level_deadline:
                        return
                    next_request[0] += 1
                prompt = prompts[indices[i]]
                path, body = request_body(prompt, settings, i)
                result = RequestResult(prompt.id, i, sent_at=time.perf_counter() - t0)
                try:
                    stream_request(client, settings.base, path, body, result, settings.request_timeout_s)
                except Exception as exc:  # a bug of the bench's own, kept on the request, not lost with the thread
                    result.error, result.message = "client error", f"{type(exc).__name__}: {exc}"[:300]
                with lock:
                    results.append(result)

    # clients first: making one takes tens of milliseconds (an SSL context), which is not the server's time
    threads = [threading.Thread(target=worker, args=(_client(settings),), daemon=True,
                                name=f"load-{concurrency}-{k}") for k in range(min(concurrency, len(indices)))]
    t0 = time.perf_counter()
    level_deadline = t0 + settings.level_timeout_s
    for t in threads:
        t.start()
    join_by = level_deadline + settings.request_timeout_s + 30  # every request ends by its own deadline
    for t in threads:
        t.join(max(0.0, join_by - time.perf_counter()))
    wall = time.perf_counter() - t0
    with lock:
        done = sorted(results, key=lambda r: r.index)
        not_sent = len(indices) - next_request[0]
    return done, wall, not_sent


def summarize_level(concurrency: int, planned: int, results: list[RequestResult], wall_s: float, not_sent: int,
                    references: dict[str, str] | None) -> dict:
    """One row of the load table: throughput, latency percentiles, errors by kind, the greedy check."""
    ok = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    examples: dict[str, str] = {}
    for r in results:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
            examples.setdefault(r.error, r.message or "")
    tokens = sum(r.tokens for r in ok)
    with_usage = sum(r.usage_tokens is not None for r in ok)
    source = None if not ok else "usage" if with_usage == len(ok) else "chunks" if with_usage == 0 else "mixed"
    gaps = [b - a for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    row = {
        "concurrency": concurrency, "requests": planned, "sent": len(results), "completed": len(ok),
        "not_sent": not_sent, "errors": errors, "error_examples": examples, "wall_s": wall_s,
        "output_tokens": tokens, "token_count_source": source,
        "text_chunks": sum(len(r.chunk_times) for r in ok),
        "output_tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "ttft_s": distribution(r.ttft_s for r in ok),
        "itl_s": distribution(gaps, (50, 99)),
        "tpot_s": distribution((r.tpot_s for r in ok), (50, 99)),
        "latency_s": distribution((r.latency_s for r in ok), (50, 99)),
        "greedy": None, "spec": None,
    }
    if references is not None:
        compared = [r for r in ok if r.prompt_id in references]
        bad = [r for r in compared if r.text != references[r.prompt_id]]
        row["greedy"] = {"compared": len(compared), "mismatches": len(bad), "compared_by": "text",
                         "mismatched": [{"prompt": r.prompt_id, "index": r.index,
                                         "first_difference_at_char": _first_difference(r.text,
                                                                                       references[r.prompt_id])}
                                        for r in bad[:10]]}
    specs = [r.spec for r in ok if r.spec is not None and "drafted" in r.spec]
    if specs:
        drafted = sum(int(s.get("drafted") or 0) for s in specs)
        accepted = sum(int(s.get("accepted") or 0) for s in specs)
        row["spec"] = {"requests": len(specs), "drafted": drafted, "accepted": accepted,
                       "acceptance_rate": accepted / drafted if drafted else None,
                       "engaged": "yes" if drafted > 0 else "no", "method": specs[0].get("method")}
    row["runs"] = [r.record() for r in results]
    return row


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


# -- all levels --------------------------------------------------------------------------------
def probe(settings: LoadSettings) -> dict:
    """What the server says about itself (/v1/models, /health); errors are noted, never raised."""
    out: dict = {"models": None, "health": None, "error": None}
    try:
        with _client(settings) as client:
            r = client.get(settings.base + "/v1/models", timeout=10)
            listed = r.json() if r.status_code == 200 else None
            if isinstance(listed, dict) and isinstance(listed.get("data") or [], list):
                out["models"] = [m for m in (listed.get("data") or []) if isinstance(m, dict)]
            elif r.status_code == 200:
                out["error"] = f"/v1/models answered something else than a model list: {r.text[:120]!r}"
            else:
                out["error"] = f"/v1/models answered {r.status_code}: {_error_message(r)}"
            h = client.get(settings.base + "/health", timeout=10)
            if h.status_code == 200:
                try:
                    out["health"] = h.json()
                except ValueError:
                    out["health"] = h.text[:200]
    except (httpx.HTTPError, ValueError, OSError) as exc:
        out["error"] = f"cannot reach {settings.base}: {type(exc).__name__}: {exc}"
    return out


def choose_model(settings: LoadSettings, given: str | None, preferred: str | None) -> tuple[str | None, str | None]:
    """The model name to send to a --url server: `given` if any; else `preferred` when the server lists it,
    else the server's first listed model. Returns (name, a note for the user or None)."""
    if given:
        return given, None
    ids = [m["id"] for m in (probe(settings)["models"] or []) if isinstance(m.get("id"), str) and m["id"]]
    if not ids or preferred in ids:
        return preferred, None
    return ids[0], (f"{settings.base} does not serve {preferred!r}; sending its first model {ids[0]!r} "
                    "(--peer-model chooses)")


def run_load(settings: LoadSettings, prompts, progress: bool = True, server: dict | None = None) -> dict:
    """Every concurrency level in ascending order; returns the "load" section of results.json."""
    prompts = list(prompts)
    if not prompts:
        raise ValueError("no prompts to send")
    levels = sorted(set(settings.levels))
    say = (lambda msg: print(msg, file=sys.stderr, flush=True)) if progress else (lambda msg: None)
    info = probe(settings)
    if info["error"]:
        say(f"load: {info['error']}")
    greedy = settings.temperature == 0.0
    used = sorted({i % len(prompts) for i in range(settings.requests)})
    references: dict[str, str] | None = {} if greedy else None
    reference_pass = None

    if settings.warmup and not info["error"]:
        warm = replace(settings, max_tokens=min(4, settings.max_tokens))
        run_level(warm, prompts, 1, 1)
    if greedy and 1 not in levels:  # outputs of each prompt sent alone, for the greedy check
        say(f"load: reference pass, {len(used)} prompts one at a time")
        results, wall, _ = run_level(settings, prompts, 1, len(used), used)
        for r in results:
            if r.ok:
                references.setdefault(r.prompt_id, r.text)
        reference_pass = {"requests": len(used), "completed": sum(r.ok for r in results), "wall_s": wall}

    rows = []
    for c in levels:
        say(f"load: concurrency {c}, {settings.requests} requests")
        results, wall, not_sent = run_level(settings, prompts, c, settings.requests)
        if greedy and c == 1:
            for r in results:
                if r.ok:
                    references.setdefault(r.prompt_id, r.text)
        rows.append((c, results, wall, not_sent))
    if greedy and 1 in levels:
        missing = [i for i in used if prompts[i].id not in references]
        if missing:  # a prompt whose concurrency-1 request failed: try it alone once more
            results, _, _ = run_level(settings, prompts, 1, len(missing), missing)
            for r in results:
                if r.ok:
                    references.setdefault(r.prompt_id, r.text)

    out_levels = []
    for c, results, wall, not_sent in rows:
        row = summarize_level(c, settings.requests, results, wall, not_sent, references)
        out_levels.append(row)
        err = sum(row["errors"].values())
        say(f"load: concurrency {c}: {row['completed']}/{row['requests']} completed, {err} errors"
            + (f" ({'; '.join(f'{k}: {v}' for k, v in row['errors'].items())})" if err else "")
            + (f", {row['output_tokens_per_s']:.1f} tok/s" if row["completed"] else ""))
    return {
        "schema": SCHEMA,
        "settings": {**{k: v for k, v in asdict(settings).items() if k != "api_key"}, "base_url": settings.base,
                     "levels": levels, "api_key": "set" if settings.api_key else None,
                     "prompts": [p.id for p in prompts], "prompts_used": [prompts[i].id for i in used]},
        "server": {**(server or {"started_by_bench": False}), "probe": info},
        "reference_pass": reference_pass,
        "references": len(references) if references is not None else None,
        "levels": out_levels,
    }


# -- a server of our own -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerStartError(SpecdecError):
    """The server the bench started exited or never answered /health (its log says why)."""


class LocalServer:
    """`specdec serve <serve_args>` in a subprocess on 127.0.0.1 and a free port, until stop().

    Its output goes to log_path. start() waits (at most start_timeout_s) for /health to answer 200,
    and fails with the log's last lines when the process exits first.
    """

    def __init__(self, serve_args: list[str], log_path, start_timeout_s: float = 600.0, env: dict | None = None):
        self.serve_args = list(serve_args)
        self.log_path = Path(log_path)
        self.start_timeout_s = start_timeout_s
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._sigterm = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "specdec.cli", "serve", *self.serve_args, "--host", "127.0.0.1",
                "--port", str(self.port), "--log-level", "warning"]

    def start(self) -> str:
        self.port = free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env)
        finally:
            log.close()  # the child holds its own descriptor
        try:  # a Ctrl-C while the model loads must not leave the server running on its own
            return self._wait_for_health()
        except BaseException:
            self.stop()
            raise

    def _wait_for_health(self) -> str:
        deadline = time.monotonic() + self.start_timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                if self.proc.poll() is not None:
                    raise ServerStartError(f"the specdec server exited with code {self.proc.returncode} before "
                                           f"answering /health; last lines of {self.log_path}:\n{self.log_tail()}")
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        return self.url
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(f"the specdec server did not answer /health within "
                                           f"{self.start_timeout_s:g} s (log: {self.log_path})")
                time.sleep(0.25)

    def stop(self) -> int | None:
        """SIGINT (uvicorn's graceful stop), then SIGTERM, then SIGKILL; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        for sig, wait_s in ((signal.SIGINT, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            self.proc.send_signal(sig)
            try:
                return self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        return None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> LocalServer:
        # SIGTERM (a `timeout`, a job scheduler) ends Python without running __exit__: while the server
        # lives, it raises SystemExit instead, so the server is stopped on the way out
        self._sigterm = None  # the handler to put back (a list: signal.signal may return None)
        if threading.current_thread() is threading.main_thread():
            self._sigterm = [signal.signal(signal.SIGTERM, _exit_on_sigterm)]
        try:
            self.start()
        except BaseException:
            self._restore_sigterm()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self._restore_sigterm()

    def _restore_sigterm(self) -> None:
        if self._sigterm is not None:
            signal.signal(signal.SIGTERM, self._sigterm[0] if self._sigterm[0] is not None else signal.SIG_DFL)
            self._sigterm = None


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)
