"""Continuous batching: the thread that runs the Engine for the server.

Every running sequence takes part in ONE target forward per step (Engine.step_batch):
its next prompt chunk while it prefills, else its last token plus its own draft. New
requests join between steps, up to `max_batch` running at once; a long prompt is
prefilled `prefill_chunk` tokens per step, so the streams already running keep flowing.
Each sequence's rows are computed bitwise as they would be alone (model/transformer.py,
forward_batch), so at T=0 an answer is the same beside 63 others as alone; at T>0 each
request samples with its own seeded generator.

Speculation and batching share one forward's budget: with several sequences running, each
extra draft row is kept only while it raises the expected tokens per second of the whole
step, from each sequence's recent acceptance and the measured cost of a forward of R rows
(draft_caps). A lone sequence drafts as it would alone. At T>0 a one-hot draft (suffix, n-gram) is
verified with plain decoding's draws, so a seeded request's text is plain decoding's under any load;
under a drafter that samples its drafts the text depends on the load: its distribution is the
target's either way, but the draws its generator makes follow how many tokens each step drafted.

Backpressure: at most `max_queue` requests wait beyond the `max_batch` running (a request
counts as waiting until the thread admits it); beyond that submit() raises QueueFull
(the app answers 503 with Retry-After). A request whose client went away is dropped at the
next step (or the next submit, while it waits), freeing its slot or its place in the queue;
one older than `request_timeout` seconds fails with TimeoutError. Shutdown: drain() answers
the waiting requests at once, end_running() the running ones when the grace period is over.

    scheduler = Scheduler(engine, metrics, max_batch=16, max_queue=64)
    scheduler.submit(job)            # job: jobs.Job; events arrive on job.events
    event = await job.events.get()   # Delta(...) per step with new text, then Done(...) or Failed(...)
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from specdec.engine.cost import expected_tokens
from specdec.engine.engine import Engine
from specdec.engine.request import Request
from specdec.engine.stats import SpecStats
from specdec.model.text_stream import TextStream
from specdec.server.jobs import Delta, Done, Failed, Job, StepFailed
from specdec.server.metrics import ServerMetrics

log = logging.getLogger("specdec.server")

DEFAULT_PREFILL_CHUNK = 256  # prompt tokens per sequence per step (fixed: an answer never depends on load)
DEFAULT_MAX_BATCH = 16  # `specdec serve --max-batch`; docs/measurements/server-batching.md has the measurement behind it


class QueueFull(Exception):
    """max_batch requests run and max_queue wait already."""

    def __init__(self, max_queue: int, retry_after_s: int):
        super().__init__(f"the server is busy: its batch is full and {max_queue} requests are waiting "
                         f"already; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class ServerStopping(Exception):
    """The server is shutting down: a request that could not finish in the grace period."""

    def __init__(self):
        super().__init__("the server is stopping: the request could not finish before it stopped; retry elsewhere "
                         "or later")


@dataclass
class _Running:
    job: Job
    req: Request
    text: TextStream
    started_at: float = field(default_factory=time.perf_counter)
    first_at: float | None = None  # when the first token was emitted
    logprobs_sent: int = 0  # a stream's leading tokens whose logprobs went out in a Delta (Job.logprobs)


class Scheduler:
    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None, max_batch: int | None = None,
                 max_queue: int = 64, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 request_timeout: float | None = None):
        """max_batch: sequences running at once (default: the engine's cache slots, never more)."""
        slots = engine.cache.num_slots
        max_batch = slots if max_batch is None else max_batch
        if not 1 <= max_batch <= slots:
            raise ValueError(f"max_batch must be between 1 and the engine's {slots} cache slots, got {max_batch}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be 0 or more, got {max_queue}")
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        self.engine = engine
        self.metrics = metrics or ServerMetrics()
        self.max_batch, self.max_queue, self.prefill_chunk = max_batch, max_queue, prefill_chunk
        self.request_timeout = request_timeout
        self._waiting: deque[Job] = deque()
        self._running: list[_Running] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._draining = False  # shutting down: nothing more is admitted
        self._end_running = False  # shutting down, grace over: running requests end with ServerStopping
        self._recent_latency = 0.0  # seconds from arrival to the end, averaged over recent requests

    # -- the asyncio side ----------------------------------------------------------------------
    def start(self) -> None:
        with self._cv:
            if self._thread is None or not self._thread.is_alive():
                self._stopping = False
                self._thread = threading.Thread(target=self._run, name="specdec-scheduler", daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel every running and waiting request and end the thread."""
        with self._cv:
            thread, self._thread = self._thread, None
            self._stopping = True
            self._cv.notify_all()
        if thread is not None:
            thread.join(timeout)

    def drain(self) -> None:
        """Shutdown's first step: every waiting job is answered "cancelled" now (the app's 503 "the server is
        stopping") and new ones are refused; running ones go on until end_running()."""
        with self._cv:
            self._draining = True
            waiting, self._waiting = list(self._waiting), deque()
            self.metrics.queued.set(0)
        for job in waiting:
            self._cancelled(job)

    def end_running(self) -> None:
        """Shutdown's grace period is over: each running job is answered ServerStopping now (a stream: its error
        event and [DONE]), before the server cancels its handler, even while a long step is under way; the
        thread drops them at its next step."""
        with self._cv:
            self._end_running = True
            jobs = [r.job for r in self._running]
            self._cv.notify_all()
        for job in jobs:
            job.put(Failed(ServerStopping()))

    def submit(self, job: Job) -> None:
        """Queue a job; raises QueueFull when max_queue jobs wait already, ServerStopping after drain()."""
        self.start()
        with self._cv:
            if self._draining:
                raise ServerStopping()
            self._drop_gone_waiting()  # a client that gave up while queued holds no place
            if len(self._waiting) + len(self._running) >= self.max_batch + self.max_queue:
                self.metrics.rejected.inc()
                raise QueueFull(self.max_queue, self._retry_after())
            self._waiting.append(job)
            self.metrics.queued.set(len(self._waiting))
            self._cv.notify()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    def _retry_after(self) -> int:
        """Seconds a client should wait: the mean time of the recent requests, at least 1."""
        return max(1, math.ceil(self._recent_latency))

    # -- the scheduler thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._running and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    break
                self._drop_gone_waiting()
                joining = []
                while self._waiting and len(self._running) + len(joining) < self.max_batch:
                    joining.append(self._waiting.popleft())
                self.metrics.queued.set(len(self._waiting))
            for job in joining:
                self._admit(job)
            self._drop_gone()
            if self._running:
                try:
                    self._step()
                except BaseException as exc:  # never let one step end the server: fail what ran in it
                    log.exception("scheduler: a batched step failed")
                    for r in list(self._running):
                        self._end(r, error=StepFailed(exc))
            self.metrics.running.set(len(self._running))
        self._shutdown()

    def _drop_gone_waiting(self) -> None:
        """Answer and forget the waiting jobs whose client went away (called holding the lock), so that
        they take no place in the queue and /health counts only clients that are there."""
        gone = [job for job in self._waiting if job.cancelled.is_set()]
        if not gone:
            return
        self._waiting = deque(job for job in self._waiting if not job.cancelled.is_set())
        self.metrics.queued.set(len(self._waiting))
        for job in gone:
            self._cancelled(job)

    def _cancelled(self, job: Job) -> None:
        self.metrics.queue_wait.observe(time.perf_counter() - job.arrived)
        self.metrics.record_generation(job.endpoint, "cancelled", 0, 0, None)
        job.put(Done("", "cancelled", len(job.prompt), 0, SpecStats(method=job.spec.method)))

    def _admit(self, job: Job) -> None:
        if job.cancelled.is_set():  # the client went away between the queue and here
            self._cancelled(job)
            return
        self.metrics.queue_wait.observe(time.perf_counter() - job.arrived)
        try:
            req = self.engine.admit(job.prompt, job.sampling, job.max_tokens, job.stop, job.spec, job.skip_special,
                                    job.logprobs)
        except Exception as exc:
            self.metrics.record_generation(job.endpoint, "error", len(job.prompt), 0, None)
            job.put(Failed(exc))
            return
        self.metrics.prefix_hits.inc(req.cached_tokens)
        stream = TextStream(self.engine.model.tokenizer, job.stop, job.skip_special,
                            track_tokens=job.sources or job.logprobs is not None)
        self._running.append(_Running(job, req, stream))

    def _drop_gone(self) -> None:
        now = time.perf_counter()
        for r in list(self._running):
            if self._end_running:
                self._end(r, error=ServerStopping())
            elif r.job.cancelled.is_set():
                self._end(r, cancelled=True)
            elif self.request_timeout is not None and now - r.job.arrived > self.request_timeout:
                self._end(r, error=TimeoutError(f"the request ran longer than the server's request timeout "
                                                f"({self.request_timeout:g} s)"))

    def _step(self) -> None:
        running = self._running
        reqs = [r.req for r in running]
        caps = self.draft_caps(reqs) if len(reqs) > 1 else None
        news = self.engine.step_batch(reqs, self.prefill_chunk, caps)
        m = self.metrics
        m.batch_size.observe(len(reqs))
        m.tokens_per_step.observe(sum(len(n) for n in news))
        for r, new in zip(list(running), news):
            try:
                self._deliver(r, new)
            except Exception as exc:  # this request's text or its end failed: it alone, not the batch
                log.exception("scheduler: a request failed after its step")
                if r in self._running:
                    self._end(r, error=StepFailed(exc))
                else:  # _end itself failed after taking it out: its client still gets an answer
                    r.job.put(Failed(StepFailed(exc)))

    def _deliver(self, r: _Running, new: list[int]) -> None:
        """Send a request the text its step settled (TTFT at its first token); end it when it finished."""
        m = self.metrics
        if r.first_at is None and r.req.output:
            r.first_at = time.perf_counter()
            m.ttft.observe(r.first_at - r.job.arrived)
            if r.job.stream and not r.req.finished:
                piece = r.text.advance(r.req.output)
                r.job.put(Delta(piece, _sources(r) if piece else None, _logprobs(r) if piece else None))
        elif new and r.job.stream and not r.req.finished:
            piece = r.text.advance(r.req.output)
            if piece:
                r.job.put(Delta(piece, _sources(r), _logprobs(r)))
        if r.req.finished:
            self._end(r)

    def draft_caps(self, reqs: list[Request]) -> list[int]:
        """Draft tokens each sequence may bring to this step: rows are added one at a time where
        they raise the step's expected tokens per second, from each sequence's acceptance and the
        measured forward cost (linear in the rows beyond those it measured)."""
        spec_on = [r.spec.enabled and r.prefilled == len(r.prompt) and r.drafters for r in reqs]
        if not any(spec_on):
            return [0] * len(reqs)
        cost = self.engine.forward_cost(max(r.spec.draft_n_max for r in reqs) + 1)
        per_row = max((cost[-1] - cost[1]) / max(len(cost) - 2, 1), 1e-9)

        def cost_of(rows: int) -> float:
            return cost[rows] if rows < len(cost) else cost[-1] + (rows - len(cost) + 1) * per_row

        caps = [0] * len(reqs)
        rows = len(reqs)
        tokens = float(len(reqs))  # each sequence's last token yields one token for sure
        while True:
            best, gain = -1, 0.0
            for i, r in enumerate(reqs):
                if spec_on[i] and caps[i] < r.draft_policy.length:
                    a = r.draft_policy.acceptance
                    g = expected_tokens(caps[i] + 1, a) - expected_tokens(caps[i], a)
                    if g > gain:
                        best, gain = i, g
            if best < 0 or (tokens + gain) / cost_of(rows + 1) <= tokens / cost_of(rows):
                return caps
            caps[best] += 1
            rows += 1
            tokens += gain

    def _end(self, r: _Running, cancelled: bool = False, error: BaseException | None = None) -> None:
        """Take a sequence out of the batch, free its slot and send its last event."""
        self._running.remove(r)
        req, job, m = r.req, r.job, self.metrics
        self.engine.finish(req)
        if error is not None:
            m.record_generation(job.endpoint, "error", len(req.prompt), len(req.output), req.stats)
            job.put(Failed(error))
            return
        result = self.engine.result(req)
        reason = "cancelled" if cancelled else result.finish_reason
        n = result.completion_tokens  # the EOS that ended it included, as vLLM's and llama-server's usage count
        now = time.perf_counter()
        if n > 1 and r.first_at is not None:
            m.tpot.observe((now - r.first_at) / (n - 1))
        m.latency.observe(now - job.arrived)
        self._recent_latency = 0.8 * self._recent_latency + 0.2 * (now - job.arrived)
        m.record_generation(job.endpoint, reason, result.prompt_tokens, n, result.stats)
        piece = r.text.finish(result.text, req.output) if job.stream else result.text
        rest = result.logprobs[r.logprobs_sent :] if result.logprobs is not None else None  # streamed: those not sent
        job.put(Done(piece, reason, result.prompt_tokens, n, result.stats, _sources(r) if piece else None,
                     cached_tokens=result.cached_tokens, logprobs=rest))

    def _shutdown(self) -> None:
        with self._cv:
            waiting, self._waiting = list(self._waiting), deque()
        for job in waiting:
            job.cancel()
            self._cancelled(job)  # counted in requests_total as drain() counts the waiting ones it answers
        for r in list(self._running):
            r.job.cancel()
            self._end(r, cancelled=True)
        self.metrics.queued.set(0)
        self.metrics.running.set(0)


def _sources(r: _Running) -> dict | None:
    """Where the characters the stream sent last came from, for a job that asked (Job.sources): runs of
    [source, characters] (one per token; "target" or the name of the drafter whose draft was accepted),
    and the request's counts so far."""
    if not r.job.sources:
        return None
    req = r.req
    names = ("target", *(d.name for d in req.drafters))
    return {"sources": [[names[req.sources[i]], n] for i, n in r.text.pieces(*r.text.last)],
            "tokens": len(req.output), "drafted": req.stats.drafted, "accepted": req.stats.accepted}


def _logprobs(r: _Running) -> list | None:
    """A stream's logprobs for its next Delta, for a job that asked (Job.logprobs): those of the tokens whose
    text is now wholly sent and went out in no Delta before (the rest go in Done)."""
    if r.job.logprobs is None:
        return None
    n = max(r.logprobs_sent, r.text.sent_tokens())
    entries, r.logprobs_sent = r.req.logprobs[r.logprobs_sent : n], n
    return entries
