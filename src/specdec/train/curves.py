"""A training run's learning curves: DIR/curves.json (every validation: step, epoch, losses, per-step
agreement, mean acceptance length) and DIR/curves.png drawn from it (loss, and acceptance length, by step)."""

from __future__ import annotations

import json
from pathlib import Path

from specdec.model.files import replaced

JSON_NAME, PLOT_NAME = "curves.json", "curves.png"


def write_curves(out: Path, history: list[dict], title: str) -> None:
    """Both files, each replaced whole; the plot is left out (the JSON kept) when matplotlib cannot draw."""
    out.mkdir(parents=True, exist_ok=True)
    with replaced(out / JSON_NAME) as tmp:
        Path(tmp).write_text(json.dumps({"title": title, "history": history}, indent=1) + "\n")
    if not history:
        return
    try:  # imported here: slow to import, and the Agg backend is chosen before pyplot
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    steps = [h["step"] for h in history]
    fig, (ax_loss, ax_len) = plt.subplots(1, 2, figsize=(10, 4))
    for key, label in (("train_loss", "train"), ("val_loss", "validation")):
        pts = [(s, h[key]) for s, h in zip(steps, history) if h.get(key) is not None]
        if pts:
            ax_loss.plot(*zip(*pts), marker=".", label=label)
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    ax_loss.legend()
    pts = [(s, h["accept_len"]) for s, h in zip(steps, history) if h.get("accept_len") is not None]
    if pts:
        ax_len.plot(*zip(*pts), marker=".", color="tab:green")
    ax_len.set_xlabel("step")
    ax_len.set_ylabel("validation mean acceptance length")
    fig.suptitle(title)
    fig.tight_layout()
    with replaced(out / PLOT_NAME) as tmp:
        with open(tmp, "wb") as f:
            fig.savefig(f, format="png", dpi=80)
    plt.close(fig)
