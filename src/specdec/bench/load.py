"""`specdec bench --concurrency 1,4,16`: an OpenAI-compatible server under load, measured from the client.

For each concurrency level C, C worker threads share the level's N requests: each takes the
next request (prompt i mod len(prompts)), streams it to completion, and takes another, until
all N were sent. Every loop is bounded: N requests, a per-request deadline (checked between
stream chunks; the HTTP read timeout bounds a silent stall), and a per-level deadline after
which no new request starts.

    settings = LoadSettings(url="http://127.0.0.1:8000", model="smollm2-135m", levels=(1, 4, 16),
                            requests=16, max_tokens=32)
    section = run_load(settings, load_prompts("mixed"))      # the "load" section of results.json

Only the HTTP API is used (streaming completions or chat, /v1/models, /health), so the same
client measures llama-server, vLLM or specdec's own server, however that server schedules
requests (local_server.py starts specdec's own when no --url is given). Per request
(streaming.py): TTFT, latency, TPOT and the output tokens, counted from the stream's usage
(stream_options.include_usage) when the server sends it, else one per text chunk; the report
says which. Per level: inter-token latency (ITL) = gaps between arrivals of text-carrying chunks
(a chunk may carry several tokens: a verify step can emit several).

Greedy check (temperature 0): every output is compared, as text, with the output of the same
prompt sent alone (the concurrency-1 level when there is one, else a sequential reference pass).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace

import httpx

from specdec.bench.streaming import RequestResult, error_message, stream_request

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


# -- settings and one request's body ----------------------------------------------------------
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
            if not 0 < seconds < float("inf"):  # NaN fails too: a NaN deadline bounds no wait
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
                out["error"] = f"/v1/models answered {r.status_code}: {error_message(r)}"
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
