"""Servers for the server tests: the app in-process on uvicorn, 127.0.0.1, a free port, a background thread.

`smollm_server` (session): the real smollm2-135m (int8) with ngram-simple speculation, no API key.
`tiny_server` (session): the tiny random model with an API key, for the cheap checks (auth, bad input)
that run in the fast suite too.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import httpx
import pytest

SMOLLM_CONTEXT = 1024
API_KEY = "test-key-123"


@dataclass
class Served:
    base_url: str  # http://127.0.0.1:PORT
    app: object
    engine: object
    model_name: str
    api_key: str | None

    def client(self, **kwargs):
        """An official OpenAI client for this server (no retries, bounded timeout)."""
        from openai import OpenAI

        kwargs.setdefault("api_key", self.api_key or "unused")
        return OpenAI(base_url=self.base_url + "/v1", max_retries=0, timeout=120.0, **kwargs)

    def http(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, timeout=120.0, **kwargs)


class ServerThread:
    """uvicorn.Server running `app` in a daemon thread; stop() ends it."""

    def __init__(self, app, grace: float | None = None):
        """grace: serve as `specdec serve` does (GracefulServer), with this shutdown grace period."""
        import uvicorn

        from specdec.cli.serve import GracefulServer

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=grace)
        self.server = uvicorn.Server(config) if grace is None else GracefulServer(config, app.state.worker)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self, timeout: float = 30.0) -> str:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()


def _serve(engine, model_name: str, api_key: str | None):
    from specdec.server.app import create_app

    app = create_app(engine, model_name, api_key=api_key)
    thread = ServerThread(app)
    base_url = thread.start()
    return thread, Served(base_url, app, engine, model_name, api_key)


@pytest.fixture(scope="session")
def smollm_server(smollm):
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    engine = Engine(smollm, SpecConfig(drafters=("ngram-simple",)), max_len=SMOLLM_CONTEXT, max_sequences=16)
    engine.generate(smollm.tokenizer.encode("Warm up"), SamplingParams(), max_tokens=2)  # before serving
    thread, served = _serve(engine, "smollm2-135m", None)
    yield served
    thread.stop()


class Reference:
    """Expected outputs from a second Engine on the same model (its own cache and drafters), memoized.

    Call it only while the server is idle: the two engines share the model's weights and CPU.
    """

    def __init__(self, model, max_len: int = SMOLLM_CONTEXT):
        from specdec.engine.engine import Engine

        self.model = model
        self.engine = Engine(model, max_len=max_len)
        self._memo: dict = {}

    def prompt_ids(self, prompt: str) -> list[int]:
        return self.model.tokenizer.encode(prompt)

    def chat_ids(self, messages: list[dict]) -> list[int]:
        tok = self.model.tokenizer
        return tok.encode(tok.apply_chat_template(messages), add_bos=False)

    def generate(self, ids: list[int], max_tokens: int, spec=None, stop=(), sampling=None):
        """engine.generate(ids, sampling or greedy, max_tokens, stop, spec) -> GenerationResult."""
        from specdec.engine.config import SpecConfig
        from specdec.sampling import SamplingParams

        spec = spec or SpecConfig()
        sampling = sampling or SamplingParams()
        key = (tuple(ids), max_tokens, spec, tuple(stop), sampling)
        if key not in self._memo:
            self._memo[key] = self.engine.generate(ids, sampling, max_tokens, stop, spec=spec)
        return self._memo[key]


@pytest.fixture(scope="session")
def reference(smollm):
    return Reference(smollm)


class Samples(dict):
    """/metrics parsed with prometheus_client's parser: {(sample name, ((label, value), ...)): value}."""

    def get_value(self, name: str, **labels) -> float:
        return self.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape_metrics(served) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(served.base_url + "/metrics", timeout=30).text
    out = Samples()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


@pytest.fixture
def scrape():
    return scrape_metrics


TINY_CONTEXT = 256


@pytest.fixture(scope="session")
def tiny_server(tiny_model):
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine

    engine = Engine(tiny_model, SpecConfig(drafters=("ngram-simple",)), max_len=TINY_CONTEXT, max_sequences=4)
    thread, served = _serve(engine, "tiny", API_KEY)
    yield served
    thread.stop()


@pytest.fixture(scope="session")
def tiny_reference(tiny_model):
    return Reference(tiny_model, TINY_CONTEXT)
