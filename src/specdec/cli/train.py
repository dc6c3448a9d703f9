"""`specdec train mtp|eagle3|dflash|dspark`: train a drafter for a target by self-distillation.

    specdec train mtp --model smollm2-135m --out DIR            (CPU, one process)
    torchrun --nproc-per-node 8 -m specdec.cli train eagle3 --model M --out DIR   (data parallel)

Data: the target continues prompts (--prompts FILE, one per line; default a built-in list)
and a plain corpus is added (--data FILE ..., paragraphs; default Python stdlib docstrings).
Sequences are cached in DIR/data.rank0.npz, so a resumed run (--resume) trains on the same
text; --sequences FILE trains on a saved set instead (the shipped heads' data is in
specdec/heads/<model>/train_data.npz).
Heads are written in the formats the loaders read: MTP as config.json + model.safetensors in
the DeepSeek-V3 layout (default DIR: beside the model, `<model>.mtp/`, where auto finds it),
EAGLE-3 in the published format (fc, midlayer.*, norm, lm_head, d2t, t2d), DFlash / DSpark in
theirs (drafters/block/io.py: config.json with dflash_config / DSpark's keys, model.safetensors).
"""

from __future__ import annotations

import argparse

from specdec.model.device import pick_device
from specdec.model.files import out_dir
from specdec.train.data import GEN_TEMPERATURE
from specdec.train.distributed import finish_distributed, init_distributed
from specdec.train.run import run_training


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train an MTP, EAGLE-3, DFlash or DSpark drafter for a model (self-distillation)")
    add_arguments(p)
    p.set_defaults(func=cmd_train)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=["mtp", "eagle3", "dflash", "dspark"])
    p.add_argument("--model", "-m", default="smollm2-135m", help="target: model name, GGUF file or HF folder")
    p.add_argument("--name", default=None, help="the target's registry name recorded in the head (default --model)")
    p.add_argument("--out", default=None, help="output folder (mtp default: <model path>.mtp beside the model; "
                   "the others: $SPECDEC_HOME/train/<model file>/<kind>)")
    p.add_argument("--prompts", default=None, help="prompts file, one per line or JSON Lines of {\"text\"} (python -m "
                   "specdec.train.recipe build writes the recipe's; default: built-in prompts)")
    p.add_argument("--data", nargs="*", default=None, help="plain-text corpus files (default: stdlib docstrings)")
    p.add_argument("--sequences", default=None,
                   help="train on these token sequences (.npz from an earlier run) instead of generating")
    p.add_argument("--generate", type=int, default=512, help="sequences the target generates from prompts")
    p.add_argument("--gen-tokens", type=int, default=192, help="tokens generated per prompt")
    p.add_argument("--gen-temperature", type=float, default=GEN_TEMPERATURE,
                   help="temperature the target writes its answers at (0: greedy, the text drafting at T=0 sees)")
    p.add_argument("--gen-engine", choices=["specdec", "dense"], default=None,
                   help="what writes the answers: specdec's engine on the model as it runs at inference (default on "
                        "a CPU), or the float training copy (default on a GPU)")
    p.add_argument("--gen-slots", type=int, default=16, help="sequences the engine generates at once (default 16)")
    p.add_argument("--corpus-seqs", type=int, default=256, help="corpus chunks added")
    p.add_argument("--seq-len", type=int, default=384)
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps (0: build the training sequences only)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ttt", type=int, default=None,
                   help="training-time-test steps (head fed its own outputs; default 7 for eagle3 as SpecForge, 3 for mtp)")
    p.add_argument("--draft-vocab", type=int, default=6144,
                   help="EAGLE-3 draft vocabulary size (the answers' most frequent tokens)")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help="eagle3: go on training the head in DIR (e.g. a shipped one) on this run's data, with its "
                        "draft vocabulary, instead of a fresh head")
    p.add_argument("--val", type=int, default=32,
                   help="validation sequences (continuations of prompts held out of training)")
    block = p.add_argument_group("dflash / dspark")
    block.add_argument("--block-size", type=int, default=4, help="block: the last token + MASK x (B-1) (default 4)")
    block.add_argument("--draft-layers", type=int, default=1, help="decoder layers of the drafter (default 1)")
    block.add_argument("--target-layers", default=None,
                       help="target layer ids it reads, comma-separated, counted from 0 "
                            "(default: spread from 1 to N-3)")
    block.add_argument("--mask-token-id", type=int, default=None, help="the MASK token (default: the last id)")
    block.add_argument("--anchors", type=int, default=16, help="blocks per training sequence (default 16)")
    block.add_argument("--loss-decay", type=float, default=4.0, help="position weight exp(-d / decay) (default 4)")
    block.add_argument("--markov-rank", type=int, default=32, help="dspark: rank of the Markov bias (0 = none)")
    block.add_argument("--markov-head", default="vanilla", choices=["vanilla", "gated", "rnn"], help="dspark")
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from DIR/state.pt")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="fit the step count (and its learning-rate schedule) into this much training time")
    p.add_argument("--feature-cache", type=float, default=4.0, metavar="GB",
                   help="keep the frozen target's outputs per training sequence, up to this many GB, so that later "
                        "epochs skip the target's forward (0: compute them every time; default 4)")


# the least each count may be (flags left at None keep their meaning: "the default")
# (seq_len: sequences of fewer than 8-9 tokens are dropped as too short to teach anything)
_LEAST = {"generate": 0, "gen_tokens": 1, "gen_slots": 1, "corpus_seqs": 0, "seq_len": 9, "steps": 0, "batch": 1,
          "ttt": 1,
          "draft_vocab": 1, "val": 0, "block_size": 2, "draft_layers": 1, "anchors": 1, "markov_rank": 0,
          "save_every": 1, "threads": 1, "feature_cache": 0}


def check_train_args(args) -> None:
    """A bad count or rate, or an --out that cannot be written, is one clear error before the target loads or
    any data is generated."""
    if args.init_from and args.kind != "eagle3":
        raise ValueError(f"--init-from goes on training EAGLE-3 heads; a {args.kind} head starts fresh")
    if getattr(args, "out", None) is not None:
        out_dir(args.out)
    if getattr(args, "device", None) is not None:
        pick_device(args.device)  # a device torch cannot use: one line, not a traceback after loading
    for name, least in _LEAST.items():
        value = getattr(args, name, None)
        if value is not None and value < least:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {value}")
    if not -(2**62) <= args.seed < 2**62:  # torch's generators take 64 bits, and runs add the step and rank to it
        raise ValueError(f"--seed must be between -2**62 and 2**62, got {args.seed}")
    if not 0 <= args.gen_temperature < float("inf"):
        raise ValueError(f"--gen-temperature must be 0 (greedy) or a positive number, got {args.gen_temperature}")
    for name in ("lr", "loss_decay", "max_minutes"):
        value = getattr(args, name, None)
        if value is not None and not 0 < value < float("inf"):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {value}")


def cmd_train(args) -> int:
    check_train_args(args)
    rank, world, dist_device = init_distributed()
    ok = False
    try:
        code = run_training(args, rank, world, dist_device)
        ok = True
    finally:
        finish_distributed(world, ok)
    return code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="specdec train")
    add_arguments(p)
    args = p.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    return cmd_train(args)
