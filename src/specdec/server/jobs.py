"""What travels between the HTTP handlers and the scheduler thread (scheduler.py).

Every request becomes a Job. Tokens travel back to the asyncio side through the Job's
asyncio.Queue, filled from the scheduler thread with loop.call_soon_threadsafe (the
thread-safe hand-off). A handler whose client disconnects sets the Job's cancel flag;
the scheduler drops the sequence at its next step and frees its cache slot.

    job = Job(prompt_ids, SamplingParams(), max_tokens=16, stop=(), spec=engine.spec, stream=True,
              endpoint="completions", loop=asyncio.get_running_loop())
    scheduler.submit(job)
    event = await job.events.get()   # Delta(...) (the first one when the first token is out), Done or Failed
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from specdec.engine.config import SpecConfig
from specdec.engine.logprobs import TokenLogprob
from specdec.engine.stats import SpecStats
from specdec.model.errors import SpecdecError
from specdec.sampling import SamplingParams


@dataclass
class Delta:
    """New text of a streamed request (may be empty: the first Delta says generation started)."""

    text: str
    sources: dict | None = None  # with Job.sources: {"sources": [[source, characters], ...], "tokens", ...}
    logprobs: list[TokenLogprob] | None = None  # with Job.logprobs: the tokens whose text this Delta completes


@dataclass
class Done:
    text: str  # the text not yet sent in a Delta (for a non-streamed request: all of it)
    finish_reason: str  # "stop", "length" or "cancelled"
    prompt_tokens: int
    completion_tokens: int
    stats: SpecStats
    sources: dict | None = None  # as Delta's, for `text`
    cached_tokens: int = 0  # leading prompt tokens the prefix cache gave (usage.prompt_tokens_details)
    logprobs: list[TokenLogprob] | None = None  # with Job.logprobs: each answer token's (streamed: those not sent)


class StepFailed(SpecdecError):
    """A batched step failed: the server's fault, not the request's, whatever the exception's type (a
    ValueError deep in a step is not a bad request), so it is answered 500 with the cause named."""

    def __init__(self, cause: BaseException):
        super().__init__(f"generation failed: the batched step this request ran in raised {type(cause).__name__}: "
                         f"{cause}")


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
    skip_special: bool = True  # the answer's text leaves special tokens out (skip_special_tokens)
    sources: bool = False  # a stream that asked where each token came from (stream_options.include_sources)
    logprobs: int | None = None  # None: none asked; n: each token's logprob and its n most likely
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    arrived: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled.set()

    def put(self, event) -> None:
        """Hand an event to the asyncio side (called from the scheduler thread)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            self.cancel()
