"""Cost of one exact forward of t new tokens, per weight format, measured interleaved in one process.

    python scripts/forward_cost.py --model smollm2-135m --formats int8,w8a8 --rounds 5 --threads 1

One forward of t tokens after a 100-token context is what verifying a draft of t-1 tokens costs
(t=1 is plain decoding): engine/cost.measure_forward_cost, the median of 8 per round, then the median
over rounds.
"""

from __future__ import annotations

import argparse

import torch

from specdec.engine.cost import measure_forward_cost
from specdec.model.load import load_model

WIDTHS = (1, 2, 4, 8)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--formats", default="int8,w8a8")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    fmts = args.formats.split(",")
    models = {f: load_model(args.model, f, progress=False).transformer for f in fmts}
    caches = {f: tr.new_cache(512) for f, tr in models.items()}
    times: dict = {(f, t): [] for f in fmts for t in WIDTHS}
    for _ in range(args.rounds):
        for f in fmts:  # the curve adaptive mode measures (engine/cost.py), one round per format in turn
            cost = measure_forward_cost(models[f], caches[f], max(WIDTHS), context=100, repeats=8)
            for t in WIDTHS:
                times[(f, t)].append(cost[t])
    for f in fmts:
        ms = {t: sorted(times[(f, t)])[args.rounds // 2] * 1e3 for t in WIDTHS}
        cells = "  ".join(f"t={t} {v:.1f} ms" for t, v in ms.items())
        print(f"{args.model} {f} ({args.threads} threads): {cells}  -> {1000 / ms[1]:.1f} tok/s, "
              f"forward(4)/forward(1) {ms[4] / ms[1]:.2f}")


if __name__ == "__main__":
    main()
