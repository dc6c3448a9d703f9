"""llama-server on the agentic sessions (`specdec bench --sessions --peers llama-server`): the same token ids
specdec renders for each turn, sent to its /completion with cache_prompt (its prompt cache: a turn evaluates
only what the last one lacked), greedy, under the session's JSON schema in its json_schema field (its tools' call in its grammar field). As specdec's
fresh engine per session, each session starts cold: the slot is erased before it (/slots/0?action=erase) and
the server keeps no other prompt cache (--cache-ram 0), so only the conversation's own turns are reused.

    with LlamaServerSessions.start(tokenizer, "model.gguf", threads=2, log_path="out/llama-server.log") as peer:
        turns = peer.run_session(session, max_tokens=48, constrained=True)

Timings are the server's own: TTFT is prompt_ms (llama.cpp samples the first token inside it), decode is
predicted_ms, which covers the steps after the first token. A tool turn goes under its grammar field: the GBNF
of bench/tool_gbnf.py, the language of specdec's own call grammar (a Lark grammar llama.cpp cannot read).
The binary: $LLAMA_CPP_BIN/llama-server, else llama-server on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from specdec.bench.peers import optional_module
from specdec.bench.runner import PeerError
from specdec.bench.sessions import Session, Turn, render
from specdec.bench.tool_gbnf import call_gbnf

PEER = "llama-server"


def find_llama_server() -> Path | None:
    """$LLAMA_CPP_BIN/llama-server, else llama-server on PATH; None where neither is there."""
    folder = os.environ.get("LLAMA_CPP_BIN")
    if folder and (Path(folder) / "llama-server").is_file():
        return Path(folder) / "llama-server"
    found = shutil.which("llama-server")
    return Path(found) if found else None


class LlamaServerSessions:
    """One llama-server (-np 1, so one slot holds the conversation) for every session of a bench run."""

    label = PEER

    def __init__(self, tokenizer, url: str, proc: subprocess.Popen | None = None, command: list[str] | None = None,
                 client=None, scratch: str | None = None):
        httpx = optional_module("httpx", "--peers llama-server")
        self.tokenizer = tokenizer
        self.url = url.rstrip("/")
        self.proc = proc
        self.command = command or []
        self.scratch = scratch  # the started server's empty --slot-save-path folder, removed by close()
        self.client = client or httpx.Client(timeout=600)

    @classmethod
    def start(cls, tokenizer, model_path, threads: int = 2, ctx_size: int = 4096, log_path=None,
              start_timeout_s: float = 300.0) -> LlamaServerSessions:
        from specdec.bench.local_server import free_port  # imports httpx, an optional dependency

        binary = find_llama_server()
        if binary is None:
            raise ValueError("--peers llama-server needs llama.cpp's llama-server: set LLAMA_CPP_BIN to its "
                             "build/bin folder or put it on PATH")
        port = free_port()
        slots = tempfile.mkdtemp(prefix="specdec-llama-slots-")  # erase needs a save path; nothing is saved there
        command = [str(binary), "-m", str(model_path), "-t", str(threads), "-c", str(ctx_size), "-np", "1",
                   "--cache-reuse", "256", "--cache-ram", "0", "--slot-save-path", slots,
                   "--host", "127.0.0.1", "--port", str(port)]
        log = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        peer = cls(tokenizer, f"http://127.0.0.1:{port}", proc, command, scratch=slots)
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise PeerError(f"llama-server exited with {proc.returncode} before answering /health "
                                f"(its log: {log_path or 'not kept'})")
            try:
                if peer.client.get(f"{peer.url}/health").status_code == 200:
                    return peer
            except Exception:  # noqa: BLE001 - httpx's connection errors while it loads
                pass
            time.sleep(0.25)
        peer.close()
        raise PeerError(f"llama-server did not answer /health within {start_timeout_s:g} s")

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def describe(self) -> dict:
        props = {}
        try:
            props = self.client.get(f"{self.url}/props").json()
        except Exception:  # noqa: BLE001 - an older server without /props: its build is then unknown
            pass
        return {"runtime": f"llama-server {props.get('build_info', '(build unknown)')}",
                "command_line": " ".join(self.command), "method": "server default (no speculation flags)"}

    def run_session(self, session: Session, max_tokens: int, constrained: bool = False) -> list[Turn]:
        """Every turn of `session` in order, from an erased slot."""
        response = self.client.post(f"{self.url}/slots/0", params={"action": "erase"})
        if response.status_code != 200:
            raise PeerError(f"llama-server could not erase its slot before {session.id}: {response.text[:200]}")
        out = []
        for t, history in enumerate(session.turns(), 1):
            ids = render(self.tokenizer, history)
            body = {"prompt": ids, "n_predict": max_tokens, "cache_prompt": True, "temperature": 0, "top_k": 1,
                    "seed": 0, "return_tokens": True}
            c = session.constraint(t) if constrained else None
            if c is not None and c[0] == "json_schema":
                body["json_schema"] = json.loads(c[1])
            elif c is not None:  # a tool turn: the same call language as specdec's, in GBNF
                body["grammar"] = call_gbnf(list(session.tools))
            try:
                response = self.client.post(f"{self.url}/completion", json=body)
                data = response.json()
                timings = data["timings"]
                tokens = [int(x) for x in data["tokens"]]
            except Exception as exc:  # noqa: BLE001 - the server's failure, said in one line
                raise PeerError(f"llama-server /completion failed on {session.id} turn {t}: "
                                f"{type(exc).__name__}: {exc}") from None
            while tokens and tokens[-1] in self.tokenizer.eos_ids:  # its tokens end with the EOS, specdec's do not
                tokens.pop()
            out.append(Turn(session.id, t, len(ids), len(ids) - int(timings["prompt_n"]),
                            timings["prompt_ms"] / 1000, timings["predicted_ms"] / 1000, tuple(tokens), c is not None))
        return out
