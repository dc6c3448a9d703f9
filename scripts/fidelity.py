"""How far each weight format is from the file: top-1 agreement and KL(fp32 || format) of the
next-token distribution on a fixed text, against the file's weights dequantized to fp32, with each
format computing as its decode and verify steps do (exact=True).

    python scripts/fidelity.py --model smollm2-135m --formats bf16,int8,int4,w8a8
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specdec.model.load import load_model

TEXT = Path(__file__).resolve().parent.parent / "src" / "specdec" / "engine" / "engine.py"


def logits(model, ids: list[int], exact: bool) -> torch.Tensor:
    """exact=True: the numerics of decode and verify steps (every generated token after the first);
    exact=False: a prefill's (dense paths for long spans)."""
    tr = model.transformer
    cache = tr.new_cache(len(ids) + 1)
    return tr.forward(torch.tensor([ids]), cache, [cache.allocate()], exact=exact).logits[0].double()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--formats", default="bf16,int8,int4,w8a8")
    p.add_argument("--tokens", type=int, default=384)
    args = p.parse_args()
    reference = load_model(args.model, "fp32", progress=False)
    ids = reference.tokenizer.encode(TEXT.read_text()[:6000])[: args.tokens]
    ref = logits(reference, ids, exact=False).log_softmax(-1)
    del reference
    for fmt in args.formats.split(","):
        out = logits(load_model(args.model, fmt, progress=False), ids, exact=True).log_softmax(-1)
        kl = (ref.exp() * (ref - out)).sum(-1)
        agree = (ref.argmax(-1) == out.argmax(-1)).double().mean()
        print(f"{args.model} {fmt}: top-1 agreement {agree:.4f}, KL mean {kl.mean():.5f} max {kl.max():.4f} "
              f"({len(ids)} positions)")


if __name__ == "__main__":
    main()
