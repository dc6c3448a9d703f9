"""Prometheus metrics of one server, in their own registry (so several apps in one process never collide).

Counters only count; rates are derived by the reader, e.g. the acceptance rate is
specdec_spec_accepted_tokens_total / specdec_spec_drafted_tokens_total, and the
acceptance at draft position i is
specdec_spec_position_accepted_total{position="i"} / specdec_spec_position_drafted_total{position="i"}
(positions count from 0: the first drafted token of a step is position 0).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from specdec.engine.stats import SpecStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
_STEP_TOKEN_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
_TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("specdec_requests", "Generation requests that ran, by endpoint and finish reason "
                                "(stop, length, cancelled = client went away, error)",
                                ["endpoint", "finish_reason"], registry=r)
        self.errors = Counter("specdec_request_errors", "Requests answered with an error object, by HTTP status "
                              "and error code", ["status", "code"], registry=r)
        self.prompt_tokens = Counter("specdec_prompt_tokens", "Prompt tokens (the prefix cache's hits included)",
                                     registry=r)
        self.prefix_hits = Counter("specdec_prefix_cache_hit_tokens", "Prompt tokens whose KV rows the prefix "
                                   "cache gave (not prefilled)", registry=r)
        self.completion_tokens = Counter("specdec_completion_tokens", "Tokens generated", registry=r)
        self.drafted = Counter("specdec_spec_drafted_tokens", "Drafted tokens sent to verification", registry=r)
        self.accepted = Counter("specdec_spec_accepted_tokens", "Drafted tokens kept", registry=r)
        self.draft_steps = Counter("specdec_spec_draft_steps", "Verify steps that carried at least one drafted "
                                   "token", registry=r)
        self.decode_steps = Counter("specdec_decode_steps", "Target forward passes after prefill", registry=r)
        self.position_drafted = Counter("specdec_spec_position_drafted", "Verify steps that drafted a token at "
                                        "this position (0 = first drafted token)", ["position"], registry=r)
        self.position_accepted = Counter("specdec_spec_position_accepted", "Verify steps whose drafted token at "
                                         "this position was accepted", ["position"], registry=r)
        self.ttft = Histogram("specdec_time_to_first_token_seconds", "From request arrival (queue wait included) "
                              "to the first generated token", buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("specdec_time_per_output_token_seconds", "Mean time per generated token after the "
                              "first, per request", buckets=_TOKEN_BUCKETS, registry=r)
        self.latency = Histogram("specdec_request_latency_seconds", "From request arrival to its last token",
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_wait = Histogram("specdec_queue_wait_seconds", "From request arrival until the worker took it",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.queued = Gauge("specdec_requests_waiting", "Requests waiting for a place in the batch", registry=r)
        self.running = Gauge("specdec_requests_running", "Sequences in the running batch", registry=r)
        self.rejected = Counter("specdec_queue_rejections", "Requests refused with 503 because the waiting "
                                "queue was full", registry=r)
        self.batch_size = Histogram("specdec_batch_size", "Sequences in one batched target forward",
                                    buckets=_BATCH_BUCKETS, registry=r)
        self.tokens_per_step = Histogram("specdec_tokens_per_step", "Tokens emitted by one batched target forward "
                                         "(all sequences together)", buckets=_STEP_TOKEN_BUCKETS, registry=r)

    def record_generation(self, endpoint: str, finish_reason: str, prompt_tokens: int, completion_tokens: int,
                          stats: SpecStats | None) -> None:
        self.requests.labels(endpoint, finish_reason).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.completion_tokens.inc(completion_tokens)
        if stats is None:
            return
        self.drafted.inc(stats.drafted)
        self.accepted.inc(stats.accepted)
        self.draft_steps.inc(stats.steps)
        self.decode_steps.inc(stats.decode_steps)
        for position, (drafted, accepted) in enumerate(zip(stats.drafted_at, stats.accepted_at)):
            self.position_drafted.labels(str(position)).inc(drafted)
            self.position_accepted.labels(str(position)).inc(accepted)

    def record_error(self, status: int, code: str | None) -> None:
        self.errors.labels(str(status), code or "none").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
