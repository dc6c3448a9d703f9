"""DIR/train_summary.json: what a `specdec train` run did (steps, validation, time, the command)."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from specdec.train.loop import mean_accept_length


def write_summary(args, out: Path, step: int, start: int, accs: list[float], sequences: int, t0: float, device,
                  rank: int, log, trainer=None) -> None:
    """Rank 0 writes the summary of a run that trained from step `start` to `step` (t0: its perf_counter start)."""
    if rank == 0 and step == start and (out / "train_summary.json").is_file():
        log(f"nothing trained: the head is at step {start} already (--steps {args.steps}); "
            "train_summary.json is kept")  # the summary of the steps trained stays, not an empty one
    elif rank == 0:
        summary = {"kind": args.kind, "model": args.model, "steps": step, "sequences": sequences,
                   "val_top1_per_step": [round(a, 4) for a in accs],
                   "val_mean_accept_length": round(mean_accept_length(accs), 3) if accs else None,
                   "seconds": round(time.perf_counter() - t0, 1), "device": device,
                   "train_tokens_per_s": round(getattr(trainer, "tokens_per_s", 0.0), 1),
                   "curves": "curves.json" if (out / "curves.json").is_file() else None,
                   "command": "specdec train " + shlex.join(command_args(args))}
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log(json.dumps(summary))


def command_args(args) -> list[str]:
    """The arguments after `specdec train` that asked for this run (main's argv, else the command line)."""
    if getattr(args, "argv", None) is not None:
        return args.argv
    return sys.argv[2:] if sys.argv[1:2] == ["train"] else sys.argv[1:]
