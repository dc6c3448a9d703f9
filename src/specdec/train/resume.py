"""What a --resume continues: the training state in DIR/state.pt, read back and checked against this run."""

from __future__ import annotations

from pathlib import Path

import torch


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
