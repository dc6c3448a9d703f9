"""What a --resume continues: the training state in DIR/state.pt, read back and checked against this run's
settings; and an --out that holds a head (or a model) is written only by resuming its training."""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.model.catalogue import sha256_file
from specdec.model.load import checkpoint_digest


def check_out(out: Path, resume: bool, data_only: bool = False) -> None:
    """A head (or a model) already in --out is replaced only by continuing its training (--resume): a new
    run would write over it at its first checkpoint (the target's own weights, with --out its folder).
    data_only (--steps 0, which writes the data only) is refused there too: it would replace the text a
    --resume of that head trains on."""
    held = next((name for name in ("model.safetensors", "config.json", "state.pt") if (out / name).exists()), None)
    if held is None:
        return
    if data_only:
        raise ValueError(f"--steps 0 writes training data, and --out {out} holds {held} (a trained head, or a "
                         "model) whose data it would replace: write the data into another --out")
    if not resume:
        raise ValueError(f"--out {out} holds {held} already (a trained head, or a model): --resume continues the "
                         "training of a head there; else train into another --out, or remove it")
    if not (out / "state.pt").is_file():
        raise ValueError(f"--resume: {out} holds {held} but no state.pt, so there is no training to continue; "
                         "train into another --out")


def read_state(path: Path) -> dict | None:
    """DIR/state.pt as checkpoint wrote it, None when there is none; a clear error for anything else."""
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is not a file: remove it, or train into another --out")
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        state["head"], state["opt"], int(state["step"])
    except Exception as exc:  # truncated, or not torch's format
        raise ValueError(f"{path} is not a readable training state ({type(exc).__name__}: {exc}); remove it to "
                         "train from the start") from None
    return state


def check_resume(path: Path, kind: str, settings: dict) -> dict | None:
    """Before any data is generated: the state a --resume continues (None: none yet), refused when it was
    trained as another kind of head or with other settings (its data, world size, --seq-len, the head's
    shape and taps), which a resumed run would otherwise change silently half-way (an EAGLE-3 head's
    draft vocabulary comes from its data). States written before settings were saved are not checked."""
    state = read_state(path)
    if state is None:
        return None
    theirs = state.get("kind", kind)
    if theirs != kind:
        raise ValueError(f"{path} was written by another head ({theirs}): resume it with specdec train {theirs}, "
                         "or train into another --out")
    saved = state.get("settings")
    if saved:  # the settings the state recorded (one written before a setting was recorded is not held to it)
        differ = [f"{k} {saved.get(k)!r} then, {settings.get(k)!r} now" for k in sorted(saved)
                  if saved.get(k) != settings.get(k)]
        if differ:
            raise ValueError(f"{path} was trained with other settings ({'; '.join(differ)}): resume with the "
                             "settings it was trained with, or train into another --out")
    return state


def resume_settings(args, path, world: int, seq_len: int, sequences: Path | None, layer_ids, mask) -> dict:
    """What a resumed run must repeat (check_resume holds it to them), from `specdec train`'s flags: its target
    (a head trained half against another model), its data, and everything that shapes the head or the loss
    (another --ttt or --anchors would change the loss half-way)."""
    settings = {"target": checkpoint_digest(path), "world": world, "seq_len": seq_len,
                "val": args.val,  # --val moves sequences between the sets
                "data": f"--sequences sha256 {sha256_file(sequences)}" if sequences else "generated",
                "batch": args.batch, "lr": args.lr}
    if args.kind in ("mtp", "eagle3"):
        settings["ttt"] = args.ttt
    if args.kind == "eagle3":
        settings["draft_vocab"] = args.draft_vocab
        if args.init_from:  # the head it went on training (and its draft vocabulary)
            settings["init_from"] = checkpoint_digest(args.init_from)
    elif args.kind in ("dflash", "dspark"):
        settings.update(block_size=args.block_size, draft_layers=args.draft_layers, target_layers=list(layer_ids),
                        mask_token_id=mask, markov_rank=args.markov_rank if args.kind == "dspark" else 0,
                        markov_head=args.markov_head if args.kind == "dspark" else None, anchors=args.anchors,
                        loss_decay=args.loss_decay)
    return settings


def resumed_state(args, out: Path, settings: dict, data_file: Path, generating: bool, log) -> dict | None:
    """The state.pt in `out` that --resume continues (None: none, or no --resume); refused when its data
    file is gone and new text would be generated in its place."""
    resumed = check_resume(out / "state.pt", args.kind, settings) if args.resume else None
    if args.resume and resumed is None:
        log(f"--resume: {out} holds no state.pt yet: training from the start")
    elif resumed is not None and generating:  # its data file is gone: new text would be trained on silently
        raise ValueError(f"--resume: {data_file}, the text {out / 'state.pt'} was trained on, is gone: resume "
                         "with --sequences FILE of that text, or train into another --out")
    return resumed
