"""`specdec serve` in a subprocess for the load run (`specdec bench --concurrency` without --url).

    with LocalServer(["--model", "smollm2-135m", "--spec-type", "ngram-simple"], log_path) as server:
        section = run_load(replace(settings, url=server.url), prompts)
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from specdec.model.errors import SpecdecError


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
