"""Plain greedy decode speed of the named models in each weight format, beside transformers.

    python scripts/runtime_speed.py --models smollm2-135m,qwen2.5-coder-0.5b --formats fp32,bf16,int8,int4

Prints a Markdown table: decode tokens/s (median of --repeats runs), weight bytes read per
token, the bandwidth limit (measured here with a 1 GiB numpy read) and our share of it.
transformers runs `generate` on the same GGUF (it dequantizes to the dtype named).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch


def bandwidth_gb_s() -> float:
    a = np.ones(1 << 28, dtype=np.float32)  # 1 GiB
    a.sum()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        a.sum()
        times.append(time.perf_counter() - t)
    return a.nbytes / min(times) / 1e9


def ours(name: str, fmt: str, prompt: str, tokens: int, repeats: int) -> tuple[float, int]:
    from specdec.engine.engine import Engine
    from specdec.model.load import load_model
    from specdec.sampling import SamplingParams

    model = load_model(name, fmt, progress=False)
    engine = Engine(model, max_len=512)
    ids = model.tokenizer.encode(prompt)
    engine.generate(ids, SamplingParams(), max_tokens=4)
    rates = [engine.generate(ids, SamplingParams(), max_tokens=tokens).decode_tokens_per_s for _ in range(repeats)]
    return statistics.median(rates), model.info.weight_bytes_per_token


def transformers_rate(name: str, dtype: str, prompt: str, tokens: int, repeats: int) -> float:
    from transformers import AutoModelForCausalLM

    from specdec.model.load import load_model
    from specdec.model.registry import resolve

    path = str(resolve(name))
    tok = load_model.__globals__["open_checkpoint"](path)[1]
    ids = torch.tensor([tok.encode(prompt)])
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=getattr(torch, dtype))
    rates = []
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, do_sample=False)
        for _ in range(repeats):
            t = time.perf_counter()
            model.generate(ids, max_new_tokens=1, min_new_tokens=1, do_sample=False)
            prefill = time.perf_counter() - t
            t = time.perf_counter()
            out = model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
            total = time.perf_counter() - t
            rates.append((out.shape[1] - ids.shape[1] - 1) / (total - prefill))
    return statistics.median(rates)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="smollm2-135m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    p.add_argument("--formats", default="fp32,bf16,int8,int4")
    p.add_argument("--hf-dtypes", default="float32,bfloat16")
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    prompt = "def merge_sort(items):\n    \"\"\"Sort a list with merge sort.\"\"\"\n"
    bw = bandwidth_gb_s()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; memory bandwidth (numpy 1 GiB sum): "
          f"{bw:.1f} GB/s\n")
    print("| model | runtime | weights in memory | decode tok/s | weight bytes/token | bandwidth limit tok/s | share |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for fmt in args.formats.split(","):
            rate, nbytes = ours(name, fmt, prompt, args.tokens, args.repeats)
            limit = bw * 1e9 / nbytes
            print(f"| {name} | specdec | {fmt} | {rate:.1f} | {nbytes / 1e6:.0f} MB | {limit:.0f} | "
                  f"{rate / limit:.0%} |", flush=True)
        for dtype in filter(None, args.hf_dtypes.split(",")):  # --hf-dtypes "" skips transformers
            rate = transformers_rate(name, dtype, prompt, args.tokens, args.repeats)
            print(f"| {name} | transformers {__import__('transformers').__version__} generate | {dtype} | "
                  f"{rate:.1f} | | | |", flush=True)


if __name__ == "__main__":
    main()
