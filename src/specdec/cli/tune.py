"""`specdec tune -m MODEL [-md DRAFT]`: measure which speculation pays for a model on this machine; auto reads it.

    specdec tune -m qwen2.5-coder-1.5b                    # every configuration auto could run
    specdec tune -m qwen2.5-coder-1.5b -md qwen2.5-coder-0.5b --methods suffix,draft-simple
"""

from __future__ import annotations

import sys

import torch

from specdec.bench.tune import DEFAULT_TEMPERATURES, tune
from specdec.cli.options import add_model_args, add_threads_args
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH
from specdec.engine.setup import check_ctx_size, context_size
from specdec.model.device import pick_device
from specdec.model.load import load_model
from specdec.model.threads import set_threads


def cmd_tune(args) -> int:
    check_ctx_size(args.ctx_size)
    temperatures = tuple(float(t) for t in args.temperature.split(","))
    if any(not 0.0 <= t <= 2.0 for t in temperatures):
        raise ValueError(f"--temperature takes a comma list of values in [0, 2], got {args.temperature}")
    if args.repeats < 1 or args.max_tokens < 1:
        raise ValueError("--repeats and --max-tokens must be at least 1")
    only = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else None
    set_threads(args.threads)  # the calibration is kept per thread count: generate -t N reads the one tune -t N made
    model = load_model(args.model, args.weights, device=pick_device(args.device), cache_type=args.cache_type)
    calibration, _ = tune(model, args.model_draft, args.prompts, temperatures, args.max_tokens, args.repeats,
                          args.spec_draft_n_max, only, context_size(args.ctx_size) if args.ctx_size else 2048,
                          progress=not args.no_progress)
    print(f"calibration of {model.info.name} ({model.info.weights_dtype}, {torch.get_num_threads()} threads) saved "
          f"to {calibration.path}", file=sys.stderr)
    best, slower = calibration.best()
    for m in sorted(calibration.measured, key=lambda m: -m.overall):
        mark = "  <- auto" if m is best else "  (slower than plain somewhere)" if m in slower else ""
        print(f"{m.summary()}{mark}")
    if best is None:
        print("auto will decode without speculation here: no configuration paid in every category")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="measure which speculative methods pay for a model on this machine (auto reads "
                                    "the result)")
    add_model_args(p)
    add_threads_args(p)
    p.add_argument("--model-draft", "-md", default=None, help="a draft model or head folder auto may use")
    p.add_argument("--methods", default=None, help="comma list of the configurations to measure (default: every "
                                                   "one auto could run, e.g. suffix,ngram-mod,suffix+draft-mtp)")
    p.add_argument("--prompts", default="calibration", help="prompt set, categories or a .jsonl file (default: the "
                                                            "calibration set, one prompt per category)")
    p.add_argument("--temperature", default=",".join(f"{t:g}" for t in DEFAULT_TEMPERATURES),
                   help="comma list of temperatures measured (default 0,0.7)")
    p.add_argument("--max-tokens", "-n", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--spec-draft-n-max", type=int, default=DEFAULT_DRAFT_LENGTH,
                   help=f"the longest draft, as auto runs it (default {DEFAULT_DRAFT_LENGTH})")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_tune)
