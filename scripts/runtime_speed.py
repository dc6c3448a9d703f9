"""The runtime's speed beside llama.cpp on the same GGUF files; writes docs/runtime-speed.md.

    python scripts/runtime_speed.py --out docs/runtime-speed.md --fidelity smollm2-135m,qwen2.5-coder-0.5b
    python scripts/runtime_speed.py --models smollm2-135m --formats gguf,w8a8 --llama-cpp none

Per model and weight format: plain greedy decode (tokens/s), prefill of a 256-token prompt (tokens/s),
the cost of one forward of t = 1, 2, 4, 8 new tokens after 100 tokens of context (t = 1 is a decode
step; t is what verifying a draft of t - 1 tokens costs) and the start-up time (a second start: caches
warm); for the first format and llama.cpp, also a forward of 1 and of 4 tokens after --long-contexts
tokens of context (default 1000 and 3000: attention and the KV cache's reads grow with it). Each figure
is the median over --rounds rounds, the runtimes taking turns within a round.

llama.cpp beside it, never a dependency of specdec (for the python peer: `python -m venv /tmp/lcpp &&
/tmp/lcpp/bin/pip install llama-cpp-python==0.3.36`, which builds llama.cpp from source in ~5 minutes),
from one of:
  --llama-cpp PYTHON     an interpreter with the llama-cpp-python package (the same measurements, in a
                         child process of that interpreter, one per round); "auto" (default) uses this
                         interpreter when it imports llama_cpp, "none" measures specdec alone
  --llama-bench PATH     llama-bench's JSON (-o json): decode (tg) and prefill (pp) only
  --llama-server URL     a running llama-server on the model named first: its own timings, decode and prefill
--fidelity MODELS adds each format's top-1 agreement and KL against the file's weights dequantized to
fp32 (scripts/fidelity.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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
        # AMX: SIGILL at its AMX kernel's first tile instruction, docs/runtime-speed-xeon.md)
        how = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit status {done.returncode}")
        raise RuntimeError(f"llama-cpp-python worker failed ({how}): {done.stderr.strip()[-500:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["curve"] = {int(k): v for k, v in out["curve"].items()}
    out["long"] = {int(c): {int(k): v for k, v in per.items()} for c, per in out["long"].items()}
    return out


def llama_bench(binary: str, path: str, tokens: int, threads: int) -> dict:
    cmd = [binary, "-m", path, "-p", "256", "-n", str(tokens), "-t", str(threads), "-o", "json"]
    rows = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900).stdout)
    out = {"version": f"llama-bench {rows[0].get('build_commit', '?')}"}
    for row in rows:
        out["decode" if row.get("n_gen") else "prefill"] = row["avg_ts"]
    return out


def llama_server(url: str, tokens: int) -> dict:
    import urllib.request

    body = json.dumps({"prompt": LONG_TEXT.read_text()[:1200], "n_predict": tokens, "temperature": 0,
                       "cache_prompt": False}).encode()
    req = urllib.request.Request(url.rstrip("/") + "/completion", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        timings = json.loads(resp.read())["timings"]
    return {"decode": timings["predicted_per_second"], "prefill": timings["prompt_per_second"],
            "version": f"llama-server at {url}"}


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


def report(args, results: dict, peer_version: str | None, fidelity: list[str], threads: int,
           bandwidth: list[float]) -> str:
    import torch

    from specdec.bench.provenance import cpu_model
    from specdec.model import kernels
    from specdec.model.catalogue import resolve

    formats = args.formats.split(",")
    lines = [
        "# Runtime speed beside llama.cpp",
        "",
        f"Generated by `python scripts/runtime_speed.py {shlex.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d')} "
        f"(commit {_commit()}): {cpu_model()}, {os.cpu_count()} cores reading memory at "
        f"{' then '.join(f'{b:.1f}' for b in bandwidth)} GiB/s (a torch sum of 1 GiB before and after the runs), "
        "specdec's kernels built for "
        f"{kernels.kernel_isa()}, {threads} threads for every runtime, torch "
        f"{torch.__version__}; llama.cpp: {peer_version or 'not measured'}. Medians of {args.rounds} rounds; "
        "the runtimes take turns within each round. Decode: greedy tokens/s after a short code prompt "
        f"({args.tokens} tokens, the median of {DECODE_RUNS} generations a round). Prefill: a 256-token prompt in one forward (specdec's path here: "
        f"{kernels.prefill_path()}, `kernels.prefill_path`). Verify cost: one forward of "
        f"t new tokens after {CONTEXT} tokens of context, the median of 8, the widths taking turns (what verifying "
        "a draft of t - 1 tokens costs; "
        "llama.cpp's batch asks for the logits of every row, as its speculative decoding does). Formats: "
        "gguf = the file's own quantized blocks computed as stored (specdec's default for a GGUF file); int8 "
        "and w8a8 requantize the file per output channel (model/linear.py).",
        "",
        "## Decode and prefill (tokens/s)",
        "",
        "| model (file) | " + " | ".join(f"specdec {f}" for f in formats) + " | llama.cpp | best specdec / llama.cpp |",
        "|---|" + "---|" * (len(formats) + 2),
    ]
    for kind in ("decode", "prefill"):
        if kind == "prefill":
            lines += ["", "| prefill, model | " + " | ".join(f"specdec {f}" for f in formats) +
                      " | llama.cpp | best specdec / llama.cpp |", "|---|" + "---|" * (len(formats) + 2)]
        for name, per in results.items():
            ours = [_med([r[kind] for r in per[f]]) for f in formats]
            peer = _med([r.get(kind) for r in per.get("llama.cpp", [])])
            best = max(v for v in ours if v is not None)
            ratio = f"{best / peer:.2f}x" if peer else ""
            label = f"{name} ({Path(resolve(name)).name})" if kind == "decode" else name
            lines.append(f"| {label} | " + " | ".join(_fmt(v) for v in ours) + f" | {_fmt(peer)} | {ratio} |")
    lines += ["", "## Verify cost: one forward of t new tokens (ms)", "",
              "| model | runtime | " + " | ".join(f"t={t}" for t in WIDTHS) + " | forward(4) / forward(1) |",
              "|---|---|" + "---|" * (len(WIDTHS) + 1)]
    for name, per in results.items():
        for who, runs in per.items():
            if not runs or "curve" not in runs[0]:
                continue
            curve = {t: _med([r["curve"][t] for r in runs]) for t in WIDTHS}
            label = who if who == "llama.cpp" else f"specdec {who}"
            lines.append(f"| {name} | {label} | " + " | ".join(_fmt(curve[t]) for t in WIDTHS) +
                         f" | {curve[4] / curve[1]:.2f} |")
    contexts = _long_contexts(args.long_contexts)
    if contexts:
        lines += ["", "## Decode and verify after a long context (ms)", "",
                  f"One forward of 1 and of 4 new tokens after {' and '.join(map(str, contexts))} tokens of context "
                  f"(specdec {formats[0]}; the median of 4, the widths taking turns).", "",
                  "| model | runtime | " + " | ".join(f"t={t} at {c}" for c in contexts for t in LONG_WIDTHS) +
                  " | " + " | ".join(f"forward(4) / forward(1) at {c}" for c in contexts) + " |",
                  "|---|---|" + "---|" * (len(contexts) * (len(LONG_WIDTHS) + 1))]
        for name, per in results.items():
            for who in (formats[0], "llama.cpp"):
                runs = [r for r in per.get(who, []) if r.get("long")]
                if not runs:
                    continue
                cells = {(c, t): _med([r["long"][c][t] for r in runs]) for c in contexts for t in LONG_WIDTHS}
                label = who if who == "llama.cpp" else f"specdec {who}"
                lines.append(f"| {name} | {label} | " + " | ".join(_fmt(cells[c, t]) for c in contexts for t in LONG_WIDTHS)
                             + " | " + " | ".join(f"{cells[c, 4] / cells[c, 1]:.2f}" for c in contexts) + " |")
    lines += ["", "## Start-up: a second start, ready to generate (s)", "",
              "| model | " + " | ".join(f"specdec {f}" for f in formats) + " | llama.cpp |",
              "|---|" + "---|" * (len(formats) + 1)]
    for name, per in results.items():
        peer = _med([r.get("load_s") for r in per.get("llama.cpp", [])])
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
    p.add_argument("--llama-cpp", default="auto", help="python interpreter with llama-cpp-python, auto, or none")
    p.add_argument("--llama-bench", default=None, help="path of llama-bench")
    p.add_argument("--llama-server", default=None, help="URL of a running llama-server on the first model")
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
    python = args.llama_cpp
    if python == "auto":
        try:
            import llama_cpp  # noqa: F401

            python = sys.executable
        except ImportError:
            python = "none"
    results: dict = {}
    peer_version = None
    contexts = _long_contexts(args.long_contexts)
    bandwidth = [memory_gib_s(args.threads)]  # before and after: a shared machine's varies within the hour
    for n, name in enumerate(args.models.split(",")):
        path = str(resolve(name))
        formats = args.formats.split(",")
        ours = {f: Ours(name, f, args.tokens, contexts if f == formats[0] else ()) for f in formats}
        per: dict = {f: [] for f in ours}
        per["llama.cpp"] = []
        for _ in range(args.rounds):
            for f, o in ours.items():
                per[f].append(o.measure())
            if python != "none":
                per["llama.cpp"].append(run_worker(python, path, args.tokens, args.threads, contexts))
        if args.llama_bench:
            per["llama.cpp"] = [llama_bench(args.llama_bench, path, args.tokens, args.threads)]
        elif args.llama_server and n == 0:
            per["llama.cpp"] = [llama_server(args.llama_server, args.tokens) for _ in range(args.rounds)]
        if per["llama.cpp"]:
            peer_version = per["llama.cpp"][0].get("version")
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
    text = report(args, results, peer_version, fidelity, args.threads, bandwidth)
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
