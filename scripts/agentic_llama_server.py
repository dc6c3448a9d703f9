"""The agentic sessions (src/specdec/bench/sets/agentic.jsonl) through llama-server with its prompt cache, beside
`python -m specdec.bench.sessions` on the same model: time to first token per turn, the prompt tokens it had
to evaluate, and decode tok/s. The prompts are specdec's rendering of each turn (the same token ids), sent to
llama-server's /completion as ids with cache_prompt, greedy. docs/measurements/prefix-cache.md.

    LLAMA_CPP_BIN=/path/to/llama.cpp/build/bin python scripts/agentic_llama_server.py -m qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path

import httpx

from specdec.bench.local_server import free_port
from specdec.bench.sessions import DEFAULT_SESSIONS, load_sessions, render
from specdec.model.catalogue import resolve
from specdec.model.load import load_model


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-m", "--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--sessions", default=str(DEFAULT_SESSIONS))
    p.add_argument("--session", default=None, help="one session id (default: all)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("-t", "--threads", type=int, default=2)
    args = p.parse_args()
    path = str(resolve(args.model))
    tokenizer = load_model(path, "gguf", progress=False).tokenizer
    sessions = [s for s in load_sessions(args.sessions) if args.session in (None, s.id)]
    server = Path(os.environ.get("LLAMA_CPP_BIN", "")) / "llama-server"
    if not server.is_file():
        raise SystemExit("set LLAMA_CPP_BIN to a llama.cpp build/bin folder holding llama-server")
    port = free_port()
    proc = subprocess.Popen([str(server), "-m", path, "-t", str(args.threads), "-c", "4096", "-np", "1",
                             "--cache-reuse", "256", "--host", "127.0.0.1", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=600) as client:
            for _ in range(300):  # bounded: 150 s for the model to load
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.5)
            else:
                raise SystemExit("llama-server did not answer /health within 150 s")
            print(f"{'session':14} turn prompt evaluated  ttft_s  tok/s")
            for session in sessions:
                for t, history in enumerate(session.turns(), 1):
                    ids = render(tokenizer, history)
                    body = {"prompt": ids, "n_predict": args.max_tokens, "cache_prompt": True, "temperature": 0,
                            "top_k": 1, "seed": 0}
                    timings = client.post(f"{url}/completion", json=body).json()["timings"]
                    first = timings["predicted_ms"] / max(timings["predicted_n"], 1)
                    ttft = (timings["prompt_ms"] + first) / 1000
                    print(f"{session.id:14} {t:4} {len(ids):6} {timings['prompt_n']:9} {ttft:7.3f} "
                          f"{timings['predicted_per_second']:6.1f}")
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
