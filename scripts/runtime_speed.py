"""The runtime's speed beside llama.cpp on the same GGUF files; writes docs/measurements/runtime-speed.md.

    python scripts/runtime_speed.py --out docs/measurements/runtime-speed.md --fidelity smollm2-135m,qwen2.5-coder-0.5b
    python scripts/runtime_speed.py --models smollm2-135m --formats gguf,w8a8 --llama-server none

Per model and weight format: plain greedy decode (tokens/s), prefill of a 256-token prompt (tokens/s),
the cost of one forward of t = 1, 2, 4, 8 new tokens after 100 tokens of context (t = 1 is a decode
step; t is what verifying a draft of t - 1 tokens costs) and the start-up time (a second start: caches
warm); for the first format and llama.cpp, also a forward of 1 and of 4 tokens after --long-contexts
tokens of context (default 1000 and 3000: attention and the KV cache's reads grow with it). Each figure
is the median over --rounds rounds, the runtimes taking turns within a round.

llama.cpp beside it, as its users run it, never a dependency of specdec (build it by hand outside the
repository: docs/bench.md says how); each peer runs in the same round as specdec:
  --llama-bench PATH     llama-bench (default: found on PATH or in $LLAMA_CPP_BIN; "none" skips it): decode (tg),
                         prefill (pp) and the forward of t tokens after the same contexts (pp t at depth d)
  --llama-server PATH    llama-server (found the same way; "none" skips it), started on 127.0.0.1 with the same
                         threads: its own timings of a greedy completion of the same prompt
  --llama-cpp-python PY  only when asked: an interpreter with llama-cpp-python, timed through the binding's
                         per-token eval (its Python overhead is charged to it: labelled so in the report)
--fidelity MODELS adds each format's top-1 agreement and KL against the file's weights dequantized to
fp32 (scripts/fidelity.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

WIDTHS = (1, 2, 4, 8)
CONTEXT = 100  # tokens before the forwards of the cost curve
LONG_WIDTHS = (1, 4)  # forwards measured after a long context
DECODE_RUNS = 3  # generations a round, their median decode speed taken: one was a few seconds of a noisy VM
PROMPT = "def merge_sort(items):\n    \"\"\"Sort a list with merge sort.\"\"\"\n"
LONG_TEXT = Path(__file__).resolve().parent.parent / "src" / "specdec" / "engine" / "engine.py"


def _median_ms(run, n: int = 8) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


# -- specdec ----------------------------------------------------------------------------------------
class Ours:
    """One model in one weight format, loaded once, measured each round."""

    def __init__(self, name: str, fmt: str, tokens: int, long_contexts: tuple[int, ...] = ()):
        from specdec.engine.engine import Engine
        from specdec.model.load import load_model

        load_model(name, fmt, progress=False)  # a first start writes the converted-weights cache (int8, ...)
        t = time.perf_counter()
        self.model = load_model(name, fmt, progress=False)
        self.load_s = time.perf_counter() - t
        self.engine = Engine(self.model, max_len=1024)
        self.tokens = tokens
        tok = self.model.tokenizer
        self.prompt = tok.encode(PROMPT)
        self.long = tok.encode(LONG_TEXT.read_text())[:256]
        self.long_contexts = long_contexts

    def measure(self) -> dict:
        import torch

        from specdec.engine.cost import measure_forward_cost
        from specdec.sampling import SamplingParams

        decode = statistics.median(self.engine.generate(self.prompt, SamplingParams(), max_tokens=self.tokens)
                                   .decode_tokens_per_s for _ in range(DECODE_RUNS))
        tr = self.model.transformer
        cache = tr.new_cache(512)
        slot = cache.allocate()

        def prefill():
            cache.truncate(slot, 0)
            tr.forward(torch.tensor([self.long]), cache, [slot], exact=False, last_only=True)

        prefill_ms = _median_ms(prefill, 3)
        cache.release(slot)
        cost = measure_forward_cost(tr, cache, max(WIDTHS), context=CONTEXT, repeats=8)  # what adaptive mode uses
        curve = {t: cost[t] * 1e3 for t in WIDTHS}
        long = {}
        if self.long_contexts:
            cache = tr.new_cache(max(self.long_contexts) + max(LONG_WIDTHS) + 2)
            for ctx in self.long_contexts:
                cost = measure_forward_cost(tr, cache, max(LONG_WIDTHS), context=ctx, repeats=4)
                long[ctx] = {t: cost[t] * 1e3 for t in LONG_WIDTHS}
            del cache
        return {"decode": decode, "prefill": len(self.long) / prefill_ms * 1e3, "curve": curve,
                "load_s": self.load_s, "long": long}


# -- llama.cpp --------------------------------------------------------------------------------------
def llama_cpp_worker(path: str, tokens: int, threads: int, long_contexts: tuple[int, ...] = ()) -> dict:
    """The same measurements through llama-cpp-python (run in the interpreter that has it)."""
    import numpy as np
    from llama_cpp import Llama

    t = time.perf_counter()
    llm = Llama(model_path=path, n_ctx=max((1024, *[c + max(LONG_WIDTHS) + 2 for c in long_contexts])), n_batch=512, n_threads=threads, n_threads_batch=threads,
                logits_all=True, verbose=False)
    load_s = time.perf_counter() - t
    n_vocab = llm.n_vocab()

    def last_logits():
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))

    prompt = llm.tokenize(PROMPT.encode(), add_bos=True)
    decodes = []
    for _ in range(DECODE_RUNS):
        llm.reset()
        llm.eval(prompt)
        tok = int(last_logits().argmax())
        t = time.perf_counter()
        for _ in range(tokens - 1):
            llm.eval([tok])
            tok = int(last_logits().argmax())
        decodes.append((tokens - 1) / (time.perf_counter() - t))
    decode = statistics.median(decodes)

    prompt_long = llm.tokenize(LONG_TEXT.read_text().encode(), add_bos=True)[:256]

    def prefill():
        llm.reset()
        llm.eval(prompt_long)

    prefill_ms = _median_ms(prefill, 3)
    def forward_cost(context: list[int], widths, rounds: int) -> dict:
        """ms of one eval of each width after `context`, the widths taking turns (as measure_forward_cost)"""
        llm.reset()
        llm.eval(context)
        times = {width: [] for width in widths}
        for _ in range(rounds):
            for width in widths:
                llm.n_tokens = len(context)  # eval drops the cache past n_tokens first
                t = time.perf_counter()
                llm.eval([5] * width)
                times[width].append(time.perf_counter() - t)
        return {width: statistics.median(ts) * 1e3 for width, ts in times.items()}

    curve = forward_cost(prompt_long[:CONTEXT], WIDTHS, 8)
    long = {ctx: forward_cost([5 + i % 1000 for i in range(ctx)], LONG_WIDTHS, 4) for ctx in long_contexts}
    import llama_cpp

    return {"decode": decode, "prefill": len(prompt_long) / prefill_ms * 1e3, "curve": curve, "load_s": load_s,
            "long": long, "version": f"llama-cpp-python {llama_cpp.__version__}"}


def run_worker(python: str, path: str, tokens: int, threads: int, long_contexts: tuple[int, ...] = ()) -> dict:
    cmd = [python, __file__, "--worker", path, "--tokens", str(tokens), "--threads", str(threads),
           "--long-contexts", ",".join(map(str, long_contexts))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        # a worker killed by a signal says nothing on stderr (a native llama.cpp build on an Intel Xeon with
        # AMX: SIGILL at its AMX kernel's first tile instruction, docs/measurements/runtime-speed-xeon.md)
        how = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit status {done.returncode}")
        raise RuntimeError(f"llama-cpp-python worker failed ({how}): {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["curve"] = {int(k): v for k, v in out["curve"].items()}
    out["long"] = {int(c): {int(k): v for k, v in per.items()} for c, per in out["long"].items()}
    return out


def find_tool(given: str | None, name: str) -> str | None:
    """The llama.cpp program to run: the path given, else `name` on PATH or in $LLAMA_CPP_BIN; None for "none"."""
    if given == "none":
        return None
    if given:
        return given
    found = shutil.which(name) or shutil.which(name, path=os.environ.get("LLAMA_CPP_BIN", ""))
    if found is None:
        raise SystemExit(f"{name} not found: give --{name} PATH (a llama.cpp build), or --{name} none")
    return found


class LlamaBench:
    """llama-bench on one file, one repetition a round (the rounds interleave with specdec's)."""

    def __init__(self, binary: str, path: str, tokens: int, threads: int, long_contexts: tuple[int, ...]):
        self.binary, self.path, self.tokens, self.threads, self.long_contexts = binary, path, tokens, threads, long_contexts

    def _run(self, *flags: str) -> list[dict]:
        cmd = [self.binary, "-m", self.path, "-t", str(self.threads), "-r", "1", "-o", "json", *flags]
        return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900).stdout)

    def _forward_ms(self, widths, depths) -> dict:
        """{depth: {t: ms of one forward of t tokens}} from pp t at depth d (the last row's logits only)."""
        rows = self._run("-p", ",".join(map(str, widths)), "-n", "0", "-d", ",".join(map(str, depths)))
        out: dict = {}
        for row in rows:
            out.setdefault(row["n_depth"], {})[row["n_prompt"]] = row["n_prompt"] / row["avg_ts"] * 1e3
        return out

    def measure(self) -> dict:
        rows = self._run("-p", "256", "-n", str(self.tokens))
        out = {"version": f"llama-bench {rows[0].get('build_commit', '?')}"}
        for row in rows:
            out["decode" if row.get("n_gen") else "prefill"] = row["avg_ts"]
        out["curve"] = self._forward_ms(WIDTHS, (CONTEXT,))[CONTEXT]
        if self.long_contexts:
            out["long"] = self._forward_ms(LONG_WIDTHS, self.long_contexts)
        return out


class LlamaServer:
    """llama-server on one file, started on 127.0.0.1 with the same threads; a greedy completion a round."""

    def __init__(self, binary: str, path: str, tokens: int, threads: int):
        self.port = _free_port()
        self.tokens = tokens
        t = time.perf_counter()
        self.proc = subprocess.Popen([binary, "-m", path, "-t", str(threads), "-c", "2048", "--host", "127.0.0.1",
                                      "--port", str(self.port), "-np", "1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 300
        while not self._healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"llama-server did not start on {path}")
            time.sleep(0.2)
        self.load_s = time.perf_counter() - t

    def _healthy(self) -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def measure(self) -> dict:
        import urllib.request

        body = json.dumps({"prompt": PROMPT, "n_predict": self.tokens, "temperature": 0, "cache_prompt": False,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", body,
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            timings = json.loads(resp.read())["timings"]
        # predicted_ms starts at the first token (timed in prompt_ms): n - 1 steps, as specdec counts decode
        return {"decode": (timings["predicted_n"] - 1) / timings["predicted_ms"] * 1e3, "load_s": self.load_s}

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the report --------------------------------------------------------------------------------------
def _med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def memory_gib_s(threads: int) -> float:
    """What this machine reads from memory, GiB/s: the best of 3 torch sums of 1 GiB of float32 on `threads`
    threads (a decode step of a model bigger than the caches reads its weights at about this speed at best)."""
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(1 << 28)
    x.sum()
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return 1.0 / best


def _long_contexts(text: str) -> tuple[int, ...]:
    return tuple(int(c) for c in text.split(",") if c.strip())


def _fmt(v, digits=1):
    return "" if v is None else f"{v:.{digits}f}"


PEERS = ("llama-bench", "llama-server", "llama-cpp-python")
PEER_NOTES = {"llama-bench": "llama.cpp's own benchmark: tg, pp, and pp t at depth d for a forward of t tokens "
                             "(logits of the last row only)",
              "llama-server": "a greedy /completion of the same prompt, its own timings",
              "llama-cpp-python": "through the Python binding's per-token eval (logits_all): the binding's overhead is "
                                  "charged to llama.cpp here, so this column understates llama.cpp"}


def report(args, results: dict, versions: dict, fidelity: list[str], threads: int, bandwidth: list[float]) -> str:
    import torch

    from specdec.bench.provenance import cpu_model
    from specdec.model import kernels
    from specdec.model.catalogue import resolve

    formats = args.formats.split(",")
    peers = [p for p in PEERS if any(per.get(p) for per in results.values())]
    lines = [
        "# Runtime speed beside llama.cpp",
        "",
        f"Generated by `python scripts/runtime_speed.py {shlex.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d')} "
        f"(commit {_commit()}): {cpu_model()}, {os.cpu_count()} cores reading memory at "
        f"{' then '.join(f'{b:.1f}' for b in bandwidth)} GiB/s (a torch sum of 1 GiB before and after the runs), "
        f"specdec's kernels built for {kernels.kernel_isa()}, {threads} threads for every runtime, torch "
        f"{torch.__version__}. Medians of {args.rounds} rounds; the runtimes take turns within each round. "
        f"Decode: greedy tokens/s after a short code prompt ({args.tokens} tokens; specdec: the median of "
        f"{DECODE_RUNS} generations a round). Prefill: a 256-token prompt in one forward (specdec's path here: "
        f"{kernels.prefill_path()}, `kernels.prefill_path`). Verify cost: one forward of t new tokens after "
        f"{CONTEXT} tokens of context (what verifying a draft of t - 1 tokens costs). Formats: gguf = the file's own "
        "quantized blocks computed as stored (specdec's default for a GGUF file); int8 and w8a8 requantize the file "
        "per output channel (model/linear.py).",
        "",
        "llama.cpp, measured as its users run it:",
        "",
        *[f"- {p} ({versions.get(p, '?')}): {PEER_NOTES[p]}" for p in peers],
        "",
        "## Decode and prefill (tokens/s)",
        "",
    ]
    for kind in ("decode", "prefill"):
        cols = [p for p in peers if any(r.get(kind) for per in results.values() for r in per.get(p, []))]
        first = "model (file)" if kind == "decode" else "prefill, model"
        lines += (["", ""] if kind == "prefill" else []) + [
            f"| {first} | " + " | ".join(f"specdec {f}" for f in formats) + " | " + " | ".join(cols) +
            " | best specdec / llama-bench |", "|---|" + "---|" * (len(formats) + len(cols) + 1)]
        for name, per in results.items():
            ours = [_med([r[kind] for r in per[f]]) for f in formats]
            theirs = [_med([r.get(kind) for r in per.get(p, [])]) for p in cols]
            bench = _med([r.get(kind) for r in per.get("llama-bench", [])])
            best = max(v for v in ours if v is not None)
            label = f"{name} ({Path(resolve(name)).name})" if kind == "decode" else name
            lines.append(f"| {label} | " + " | ".join(_fmt(v) for v in ours) + " | " +
                         " | ".join(_fmt(v) for v in theirs) + f" | {f'{best / bench:.2f}x' if bench else ''} |")
    lines += ["", "## Verify cost: one forward of t new tokens (ms)", "",
              "| model | runtime | " + " | ".join(f"t={t}" for t in WIDTHS) + " | forward(4) / forward(1) |",
              "|---|---|" + "---|" * (len(WIDTHS) + 1)]
    for name, per in results.items():
        for who, runs in per.items():
            if not runs or "curve" not in runs[0]:
                continue
            curve = {t: _med([r["curve"][t] for r in runs]) for t in WIDTHS}
            label = who if who in PEERS else f"specdec {who}"
            lines.append(f"| {name} | {label} | " + " | ".join(_fmt(curve[t]) for t in WIDTHS) +
                         f" | {curve[4] / curve[1]:.2f} |")
    contexts = _long_contexts(args.long_contexts)
    if contexts:
        lines += ["", "## Decode and verify after a long context (ms)", "",
                  f"One forward of 1 and of 4 new tokens after {' and '.join(map(str, contexts))} tokens of context "
                  f"(specdec {formats[0]})."
                  "", "",
                  "| model | runtime | " + " | ".join(f"t={t} at {c}" for c in contexts for t in LONG_WIDTHS) +
                  " | " + " | ".join(f"forward(4) / forward(1) at {c}" for c in contexts) + " |",
                  "|---|---|" + "---|" * (len(contexts) * (len(LONG_WIDTHS) + 1))]
        for name, per in results.items():
            for who in (formats[0], *PEERS):
                runs = [r for r in per.get(who, []) if r.get("long")]
                if not runs:
                    continue
                cells = {(c, t): _med([r["long"][c][t] for r in runs]) for c in contexts for t in LONG_WIDTHS}
                label = who if who in PEERS else f"specdec {who}"
                lines.append(f"| {name} | {label} | " + " | ".join(_fmt(cells[c, t]) for c in contexts for t in LONG_WIDTHS)
                             + " | " + " | ".join(f"{cells[c, 4] / cells[c, 1]:.2f}" for c in contexts) + " |")
    lines += ["", "## Start-up: a second start, ready to generate (s)", "",
              "| model | " + " | ".join(f"specdec {f}" for f in formats) + " | llama-server (to /health) |",
              "|---|" + "---|" * (len(formats) + 1)]
    for name, per in results.items():
        peer = _med([r.get("load_s") for r in per.get("llama-server", [])])
        lines.append(f"| {name} | " + " | ".join(_fmt(per[f][0]["load_s"], 2) for f in formats) +
                     f" | {_fmt(peer, 2)} |")
    if fidelity:
        lines += ["", "## Fidelity to the file", "",
                  "Top-1 agreement and mean KL(fp32 || format) of the next-token distribution over 384 positions of "
                  "a Python source file, against the file's weights dequantized to fp32, each format computing as its "
                  "decode and verify steps do (`scripts/fidelity.py`).",
                  "", "```", *fidelity, "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    p.add_argument("--formats", default="gguf,int8,w8a8")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-bench", default=None, help="path of llama-bench (default: on PATH or $LLAMA_CPP_BIN), "
                                                       "or none")
    p.add_argument("--llama-server", default=None, help="path of llama-server (default: on PATH or $LLAMA_CPP_BIN), "
                                                        "or none")
    p.add_argument("--llama-cpp-python", default=None,
                   help="an interpreter with llama-cpp-python: also time llama.cpp through the binding (labelled so)")
    p.add_argument("--fidelity", default="", help="models to add the fidelity table for")
    p.add_argument("--long-contexts", default="1000,3000",
                   help="contexts (tokens) after which forward(1) and forward(4) are measured too; '' for none")
    p.add_argument("--out", default=None, help="write the Markdown report here (default: print it)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(llama_cpp_worker(args.worker, args.tokens, args.threads, _long_contexts(args.long_contexts))))
        return

    import torch

    from specdec.model.catalogue import resolve

    torch.set_num_threads(args.threads)
    bench_bin = find_tool(args.llama_bench, "llama-bench")
    server_bin = find_tool(args.llama_server, "llama-server")
    results: dict = {}
    versions: dict = {}
    contexts = _long_contexts(args.long_contexts)
    bandwidth = [memory_gib_s(args.threads)]  # before and after: a shared machine's varies within the hour
    for name in args.models.split(","):
        path = str(resolve(name))
        formats = args.formats.split(",")
        ours = {f: Ours(name, f, args.tokens, contexts if f == formats[0] else ()) for f in formats}
        bench = LlamaBench(bench_bin, path, args.tokens, args.threads, contexts) if bench_bin else None
        server = LlamaServer(server_bin, path, args.tokens, args.threads) if server_bin else None
        per: dict = {f: [] for f in ours} | {peer: [] for peer in PEERS}
        try:
            for _ in range(args.rounds):
                for f, o in ours.items():
                    per[f].append(o.measure())
                if bench:
                    per["llama-bench"].append(bench.measure())
                if server:
                    per["llama-server"].append(server.measure())
                if args.llama_cpp_python:
                    per["llama-cpp-python"].append(run_worker(args.llama_cpp_python, path, args.tokens, args.threads,
                                                              contexts))
        finally:
            if server:
                server.close()
        versions.update({peer: runs[0]["version"] for peer, runs in per.items() if runs and "version" in runs[0]})
        if server_bin:
            versions["llama-server"] = f"{server_bin}, the build llama-bench reports"
        results[name] = per
        del ours
        print(f"{name}: done", file=sys.stderr, flush=True)
    fidelity = []
    for name in filter(None, args.fidelity.split(",")):
        script = Path(__file__).with_name("fidelity.py")
        done = subprocess.run([sys.executable, str(script), "--model", name, "--formats", args.formats],
                              capture_output=True, text=True, check=True)
        fidelity += done.stdout.strip().splitlines()
    bandwidth.append(memory_gib_s(args.threads))
    text = report(args, results, versions, fidelity, args.threads, bandwidth)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
