"""results.json -> the report's PNG plots: speed-up by category, per-position acceptance, and (when the bench
swept draft lengths) speed-up against draft length.

    paths = write_plots(results, Path("bench-out"))   # {"speedup": ..., "acceptance": ..., "sweep": ...}
"""

from __future__ import annotations

from pathlib import Path

PLOTS = {
    "speedup": "speedup_by_category.png",
    "acceptance": "acceptance_by_position.png",
    "sweep": "speedup_vs_draft_length.png",
}


def write_plots(r: dict, out: Path) -> dict[str, Path]:
    # matplotlib is imported here, not on top: it is slow to import, and the Agg backend is chosen before pyplot
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = {}
    temps = r["settings"]["temperatures"]
    main = [c["label"] for c in r["configs"] if c["kind"] == "peer" or " k=" not in c["label"]]
    main = [c for c in main if c != "none"]
    cats = list(dict.fromkeys(p["category"] for p in r["prompts"])) + ["all"]

    fig, axes = plt.subplots(1, len(temps), figsize=(max(6, 0.6 * len(cats) * max(1, len(main))), 4.8),
                             squeeze=False)
    for ax, t in zip(axes[0], temps):
        width = 0.8 / max(1, len(main))
        for i, label in enumerate(main):
            ys = []
            for cat in cats:
                row = next((x for x in r["summary"] if x["config"] == label and x["category"] == cat
                            and x["temperature"] == t), None)
                ys.append(row["speedup_median"] if row and row["speedup_median"] is not None else 0.0)
            ax.bar([j + i * width for j in range(len(cats))], ys, width, label=label)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + width * (len(main) - 1) / 2 for j in range(len(cats))], cats)
        ax.set_ylabel("speed-up over baseline (median)")
        ax.set_title(f"temperature {t:g}")
    if main:
        handles, names = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, names, loc="lower center", ncol=min(len(main), 4), fontsize="small")
    fig.suptitle(f"{r['artifacts']['target']['name']}: decode speed-up")
    fig.tight_layout(rect=(0, 0.06 * ((len(main) + 3) // 4) + 0.04, 1, 1))
    paths["speedup"] = out / PLOTS["speedup"]
    fig.savefig(paths["speedup"], dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4))
    for row in r["summary"]:
        if row["category"] == "all" and row["per_position_acceptance"] and " k=" not in row["config"]:
            pp = row["per_position_acceptance"]
            ax.plot(range(1, len(pp) + 1), pp, marker="o", label=f"{row['config']} T={row['temperature']:g}")
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance")
    ax.set_ylim(0, 1.05)
    ax.set_title("per-position acceptance (all categories)")
    paths["acceptance"] = _save(fig, ax, out / PLOTS["acceptance"])

    if r["sweep"] and len({x["draft_n_max"] for x in r["sweep"]}) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        for (method, t) in dict.fromkeys((x["method"], x["temperature"]) for x in r["sweep"]):
            pts = [(x["draft_n_max"], x["speedup_median"]) for x in r["sweep"]
                   if x["method"] == method and x["temperature"] == t and x["speedup_median"] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{method} T={t:g}")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("draft length (--spec-draft-n-max)")
        ax.set_ylabel("speed-up over baseline (median)")
        ax.set_title("speed-up against draft length")
        paths["sweep"] = _save(fig, ax, out / PLOTS["sweep"])
    return paths


def _save(fig, ax, path: Path) -> Path:
    """Legend (when anything is labelled), tight layout, write the PNG, free the figure."""
    import matplotlib.pyplot as plt  # loaded by write_plots, with its backend chosen

    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
