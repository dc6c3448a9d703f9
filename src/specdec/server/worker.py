"""The one thread that runs the Engine for the server.

Why one thread: the Engine's drafters are shared stateful objects (begin/propose/
on_accept/end follow one request at a time) and its KV cache is one slot-set, so
generations must not interleave. Every request becomes a Job on a FIFO queue; the
worker takes them in arrival order and runs each to the end (or until its client
goes away) before the next. Requests are therefore served one at a time: with N
clients at once, the last waits for the N-1 before it. What that costs (tests/server/
test_server_load.py; smollm2-135m int8, ngram-simple, a shared 2-core CPU): 16 streaming
clients x 32 tokens at once got 0.67 requests/s, the same as one after another, with
latency p50 11.0 s / p90 21.9 s / p99 23.7 s and time to first token p50 9.7 s, against
1.3-1.7 s for a request alone; the time is queue wait, not overhead. Throughput stays that
of one stream; only batching requests in the Engine (one forward for several slots) would
raise it.

Tokens travel back to the asyncio side through the Job's asyncio.Queue, filled
from this thread with loop.call_soon_threadsafe (the thread-safe hand-off). A
handler whose client disconnects sets the Job's cancel flag; the worker checks it
before starting a job and between engine.step calls, then frees the cache slot
with engine.finish.

    worker = GenerationWorker(engine, metrics)
    job = Job(prompt_ids, SamplingParams(), max_tokens=16, stop=(), spec=engine.spec, stream=True,
              endpoint="completions", loop=asyncio.get_running_loop())
    worker.submit(job)
    event = await job.events.get()   # Delta(...), then more Deltas, then Done(...) or Failed(...)
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine, Request
from specdec.engine.stats import SpecStats
from specdec.sampling import SamplingParams
from specdec.server.metrics import ServerMetrics

log = logging.getLogger("specdec.server")


@dataclass
class Delta:
    """New text of a streamed request (may be empty: the first Delta says generation started)."""

    text: str


@dataclass
class Done:
    text: str  # the text not yet sent in a Delta (for a non-streamed request: all of it)
    finish_reason: str  # "stop", "length" or "cancelled"
    prompt_tokens: int
    completion_tokens: int
    stats: SpecStats


@dataclass
class Failed:
    error: BaseException


@dataclass
class Job:
    prompt: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop: tuple[str, ...]
    spec: SpecConfig
    stream: bool
    endpoint: str
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled.set()

    def put(self, event) -> None:
        """Hand an event to the asyncio side (called from the worker thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel()


class TextStream:
    """Text deltas of a growing output that never take back what they sent.

    Holds back an incomplete UTF-8 character, and, when stop strings are set, the last
    (longest stop - 1) characters: a stop string found later starts no earlier than that,
    so the text sent is always a prefix of the final (stop-cut) text. Call `advance` only
    while the request is unfinished (its text holds no stop string yet), then `finish`.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.sent = ""

    def advance(self, output: list[int]) -> str:
        text = self.tokenizer.decode(output).rstrip("\ufffd")
        return self._take(text[: max(0, len(text) - self.hold)])

    def finish(self, final_text: str) -> str:
        return self._take(final_text)

    def _take(self, text: str) -> str:
        if not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent) :], text
        return piece


class GenerationWorker:
    """Runs Jobs one at a time, in arrival order, on one daemon thread."""

    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None):
        self.engine = engine
        self.metrics = metrics or ServerMetrics()
        self._queue: queue.Queue[Job | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.current: Job | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="specdec-generation", daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel the running job, drop queued ones, and end the thread."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.cancel()
                self.metrics.queued.dec()
        if self.current is not None:
            self.current.cancel()
        self._queue.put(None)
        thread.join(timeout)

    def submit(self, job: Job) -> None:
        self.start()
        self.metrics.queued.inc()
        self._queue.put(job)

    @property
    def waiting(self) -> int:
        return self._queue.qsize()

    # -- the worker thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            self.metrics.queued.dec()
            self.current = job
            self.metrics.running.set(1)
            try:
                self._serve(job)
            except BaseException as exc:  # never let one request end the worker
                log.exception("generation worker: unexpected error")
                job.put(Failed(exc))
            finally:
                self.current = None
                self.metrics.running.set(0)

    def _serve(self, job: Job) -> None:
        m = self.metrics
        taken = time.perf_counter()
        m.queue_wait.observe(taken - job.arrived)
        if job.cancelled.is_set():  # the client went away while waiting (or the server is stopping)
            m.record_generation(job.endpoint, "cancelled", 0, 0, None)
            job.put(Done("", "cancelled", len(job.prompt), 0, SpecStats(method=job.spec.method)))
            return
        engine = self.engine
        text = TextStream(engine.model.tokenizer, job.stop)
        req: Request | None = None
        try:
            req = engine.start(job.prompt, job.sampling, job.max_tokens, job.stop, job.spec)
            first_at = time.perf_counter()
            m.ttft.observe(first_at - job.arrived)
            # a finished request's text may hold a stop string: only Done (engine.result) sends that text
            if job.stream:
                job.put(Delta("" if req.finished else text.advance(req.output)))
            while not req.finished and not job.cancelled.is_set():
                if engine.step(req) and job.stream and not req.finished:
                    piece = text.advance(req.output)
                    if piece:
                        job.put(Delta(piece))
            last_at = time.perf_counter()
        except Exception as exc:
            m.record_generation(job.endpoint, "error", len(job.prompt), len(req.output) if req else 0,
                                req.stats if req else None)
            job.put(Failed(exc))
            return
        finally:
            if req is not None:
                engine.finish(req)
        result = engine.result(req)
        finish_reason = "cancelled" if not req.finished else result.finish_reason
        n = len(result.token_ids)
        if n > 1:
            m.tpot.observe((last_at - first_at) / (n - 1))
        m.latency.observe(last_at - job.arrived)
        m.record_generation(job.endpoint, finish_reason, result.prompt_tokens, n, result.stats)
        piece = text.finish(result.text) if job.stream else result.text
        job.put(Done(piece, finish_reason, result.prompt_tokens, n, result.stats))
