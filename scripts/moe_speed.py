"""specdec beside llama.cpp on one mixture-of-experts GGUF file (scripts/synthetic_moe_gguf.py makes one):

- decode speed: plain greedy decoding of --tokens tokens, specdec's gguf format (Engine.generate's decode_s) and
  llama-bench's tg, taking turns for --rounds rounds at the same thread count; the medians and their ratio;
- verify cost: one exact forward of 4 rows beside one of 1 row (median ms);
- top-1 agreement: over one token sequence (BOS, then the text's tokens), the argmax of specdec's logits at
  each position (one exact forward) against the token llama-server picks greedily after that prefix
  (n_predict 1, temperature 0: an independent implementation of the same mixture).

    python scripts/moe_speed.py /tmp/moe-1b.gguf --llama-bin /path/to/llama.cpp/build/bin --threads 2

--without-moe-kernel adds, in each round, specdec with model/kernels/moe.c turned off in the same process (torch's
routing, the Python loop over experts, the per-op layers: what SPECDEC_NO_MOE_KERNEL=1 runs), so that before and
after are measured side by side with llama-bench under the same load.

Prints one JSON object. Short by design (a few minutes on two cores): run it under nice on a shared machine and
say the load average it ran under.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

import torch

from specdec.engine.engine import Engine
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

TEXT = ("def merge_sort(items):\n    \"\"\"Sort a list with merge sort.\"\"\"\n"
        "    if len(items) <= 1:\n        return items\n")


def llama_bench(bin_dir: Path, path: Path, threads: int, tokens: int) -> float:
    out = subprocess.run([str(bin_dir / "llama-bench"), "-m", str(path), "-t", str(threads), "-p", "0", "-n",
                          str(tokens), "-r", "1", "-o", "json"], capture_output=True, text=True, check=True,
                         env={**os.environ, "LD_LIBRARY_PATH": str(bin_dir)})
    return float(json.loads(out.stdout)[0]["avg_ts"])


def server_top1(bin_dir: Path, path: Path, threads: int, sequence: list[int], port: int = 18093) -> list[int]:
    """llama-server's greedy next token after each prefix sequence[:i], i = 1 .. len."""
    server = subprocess.Popen([str(bin_dir / "llama-server"), "-m", str(path), "-t", str(threads), "--port",
                               str(port), "-c", "512", "--host", "127.0.0.1"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "LD_LIBRARY_PATH": str(bin_dir)})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
                    break
            except OSError:
                time.sleep(1)
        picks = []
        for i in range(1, len(sequence) + 1):
            body = json.dumps({"prompt": sequence[:i], "n_predict": 1, "temperature": 0, "cache_prompt": True,
                               "return_tokens": True}).encode()
            req = urllib.request.Request(url + "/completion", body, {"Content-Type": "application/json"})
            picks.append(json.loads(urllib.request.urlopen(req, timeout=600).read())["tokens"][0])
        return picks
    finally:
        server.terminate()
        server.wait(30)


def forward_ms(tr, prefix: list[int], rows: list[int], repeats: int = 7) -> float:
    """The median milliseconds of one exact forward of `rows` after `prefix` (a verify of len(rows) tokens)."""
    cache = tr.new_cache(512)
    slot = cache.allocate()
    with torch.no_grad():
        tr.forward(torch.tensor([prefix]), cache, [slot], exact=False)
        times = []
        for _ in range(repeats):
            cache.truncate(slot, len(prefix))
            t0 = time.perf_counter()
            tr.forward(torch.tensor([rows]), cache, [slot], exact=True)
            times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def moe_kernel(model, on: bool, saved: dict) -> None:
    """Turn moe.c off (saving what each mixture layer held) or back on, as SPECDEC_NO_MOE_KERNEL=1 would at load."""
    tr = model.transformer
    for layer in tr.layers:
        moe = getattr(layer, "moe", None)
        if moe is None:
            continue
        moe._route(torch.zeros(1))  # builds its moe.c routing, if any, before it is saved
        if on:
            moe.experts.native, moe._c_route = saved[id(moe)]
        else:
            saved[id(moe)] = moe.experts.native, moe._c_route
            moe.experts.native, moe._c_route = None, None
    if hasattr(tr, "_step"):
        del tr._step  # step.c's layers are built again: without moe.c a mixture layer runs op by op
    tr._step_layers()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--llama-bin", type=Path, default=Path(os.environ.get("LLAMA_CPP_BIN", ".")))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--without-moe-kernel", action="store_true", help="also measure specdec with moe.c off, each round")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(str(a.path), "gguf", progress=False, weight_cache=False)
    engine = Engine(model, max_len=512)
    bos = model.tokenizer.bos_id if getattr(model.tokenizer, "bos_id", None) is not None else 1
    sequence = [bos, *model.tokenizer.encode(TEXT)][: a.positions]
    engine.generate(sequence, SamplingParams(), max_tokens=3)  # warm: kernels built, weights touched
    ours, theirs, loads, loop, saved = [], [], [], [], {}
    for _ in range(a.rounds):
        loads.append(os.getloadavg()[0])
        if a.without_moe_kernel:
            moe_kernel(model, False, saved)
            loop.append(engine.generate(sequence, SamplingParams(), max_tokens=a.tokens + 1).decode_tokens_per_s)
            moe_kernel(model, True, saved)
        r = engine.generate(sequence, SamplingParams(), max_tokens=a.tokens + 1)
        ours.append(r.decode_tokens_per_s)
        theirs.append(llama_bench(a.llama_bin, a.path, a.threads, a.tokens))
    tr = model.transformer
    verify = {"forward_1_ms": forward_ms(tr, sequence[:16], sequence[16:17]),
              "forward_4_ms": forward_ms(tr, sequence[:16], sequence[16:20])}
    if a.without_moe_kernel:
        moe_kernel(model, False, saved)
        verify |= {"without_forward_1_ms": forward_ms(tr, sequence[:16], sequence[16:17]),
                   "without_forward_4_ms": forward_ms(tr, sequence[:16], sequence[16:20])}
        moe_kernel(model, True, saved)
    cache = tr.new_cache(512)
    with torch.no_grad():
        logits = tr.forward(torch.tensor([sequence]), cache, [cache.allocate()], exact=True).logits[0]
    top1 = logits.argmax(-1).tolist()
    picks = server_top1(a.llama_bin, a.path, a.threads, sequence)
    agree = sum(x == y for x, y in zip(top1, picks))
    print(json.dumps({
        "file": str(a.path), "threads": a.threads, "tokens": a.tokens, "rounds": a.rounds,
        "specdec_decode_tok_s": ours, "llama_bench_tg_tok_s": theirs,
        "ratio_of_medians": statistics.median(ours) / statistics.median(theirs),
        **({"without_moe_kernel_tok_s": loop, "without_ratio_of_medians": statistics.median(loop) /
            statistics.median(theirs)} if loop else {}),
        "top1_agreement": f"{agree}/{len(sequence)}", "load_avg_1min": loads,
        # a verify's cost: one exact forward of 4 rows and of 1 after 16 tokens (the experts read once per step)
        **{k: round(v, 2) for k, v in verify.items()},
        # (position, specdec's token, llama.cpp's, specdec's logit of its own minus of llama.cpp's: a near tie is small)
        "disagreements": [(i, x, y, round(float(logits[i, x] - logits[i, y]), 4))
                          for i, (x, y) in enumerate(zip(top1, picks)) if x != y]}))


if __name__ == "__main__":
    main()
