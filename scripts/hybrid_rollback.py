"""What rolling back a rejected draft costs on a hybrid model (Qwen3.5: Gated DeltaNet layers), three ways:

    ring        what specdec does (cache/recurrent.py): every verified row writes its state to its own ring
                place, so a rollback moves a length pointer; measured: HybridCache.keep after a 1 + 4 row verify
                that keeps 1 row (4 rejected tokens)
    snapshot    copying the state after each verified row (what a runtime with one state per sequence must do
                to roll back exactly): one copy of every linear layer's conv and recurrent state, per row
    recompute   keeping only the state before the verify and running the kept rows again: a forward of a + 1
                rows per rollback (a: accepted tokens), priced here as the 1 + 1 row verify it repeats

Beside them a plain step and verifies of 1 + k rows, for scale. Medians of a few repeats; one torch thread.

    python scripts/hybrid_rollback.py MODEL [--weights gguf]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from specdec.model.load import load_model


def median_s(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Qwen3.5 GGUF file or folder")
    parser.add_argument("--weights", default=None, help="weight format (default: the file's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = load_model(args.model, args.weights, progress=False, weight_cache=False)
    tr = model.transformer
    if tr.config.linear_attention is None:
        raise SystemExit(f"{args.model} has no linear-attention layers: nothing to roll back but keys and values")
    cache = tr.new_cache(512)
    slot = cache.allocate()
    prompt = [(7 * i + 3) % (tr.config.vocab_size - 8) for i in range(64)]
    tr.forward(torch.tensor([prompt]), cache, [slot], exact=False)
    start = cache.lengths[slot]

    def verify(k: int):
        def run():
            tr.forward(torch.tensor([[5] + [6] * k]), cache, [slot])
            cache.truncate(slot, start)
        return run

    step = median_s(verify(0))
    verifies = {k: median_s(verify(k)) for k in (1, 3, 5)}
    keeps = []
    for _ in range(7):
        tr.forward(torch.tensor([[5, 6, 7, 8, 9]]), cache, [slot])
        t0 = time.perf_counter()
        cache.keep(slot, start, [0])
        keeps.append(time.perf_counter() - t0)
        cache.truncate(slot, start)
    ring = statistics.median(keeps)
    ssm, conv = cache.ssm[:, slot, 0].clone(), cache.conv[:, slot, 0].clone()
    ssm_to, conv_to = torch.empty_like(ssm), torch.empty_like(conv)
    snapshot = median_s(lambda: (ssm_to.copy_(ssm), conv_to.copy_(conv)), 21)
    c, la = tr.config, tr.config.linear_attention
    print(f"model {args.model}: {c.num_layers} layers, {len(la.layers)} Gated DeltaNet; one state of every linear "
          f"layer {cache.state_bytes() / 1e6:.2f} MB; ring of {cache.history} places + anchor per slot "
          f"({(cache.history + 1) * cache.state_bytes() / 1e6:.1f} MB)")
    print(f"plain step {step * 1e3:.2f} ms; verify of 1 + k rows: "
          + ", ".join(f"k={k} {s * 1e3:.2f} ms" for k, s in verifies.items()))
    print(f"ring rollback: {ring * 1e6:.1f} us for 4 rejected tokens = {ring / 4 * 1e6:.2f} us per rejected token")
    print(f"snapshot by copy: {snapshot * 1e6:.1f} us per verified row")
    print(f"recompute: {verifies[1] * 1e3:.2f} ms per rollback after 1 accepted token ({verifies[1] / step:.2f}x a "
          "plain step)")


if __name__ == "__main__":
    main()
