"""results.json -> report.md and PNG plots.

Every report names the artifact, the runtime and the settings first; then one table per
temperature; then per-position acceptance, the draft-length sweep, peers, auto's check, and
the caveats (methods never engaged, greedy outputs that differed from the baseline).
`specdec bench --concurrency` adds a "load" section (bench/load.py): write_load puts it into
results.json and report.md, as a table per concurrency level.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from specdec.model.files import write_text

PLOTS = {
    "speedup": "speedup_by_category.png",
    "acceptance": "acceptance_by_position.png",
    "sweep": "speedup_vs_draft_length.png",
}


def write_all(results: dict, out_dir) -> dict[str, Path]:
    """Write results.json, report.md and the plots; returns their paths by kind.

    A load run (`--concurrency`) already in out_dir/results.json is kept, as its report section
    (check_bench_joins refused, before the bench ran, one of another artifact)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    load = _load_results(out)
    if load is not None and "load" not in results:
        results = {**results, "load": load}
    paths = {"json": out / "results.json"}
    write_text(paths["json"], json.dumps(results, indent=1))
    paths.update(write_plots(results, out))
    paths["markdown"] = out / "report.md"
    write_text(paths["markdown"], markdown(results, {k: v.name for k, v in paths.items() if k in PLOTS}))
    return paths


# -- Markdown ----------------------------------------------------------------------------------
def _f(x, fmt="{:.2f}", none="–"):
    return none if x is None else fmt.format(x)


def _mb(n):
    return "–" if n is None else f"{n / 1e6:,.1f}"


def markdown(r: dict, plots: dict[str, str] | None = None) -> str:
    s, rt, art = r["settings"], r["runtime"], r["artifacts"]
    lines = [f"# specdec bench: {art['target']['name']}", "", f"Created {r['created']}.", ""]
    lines += ["## Artifact", "", "| | target | draft |", "|---|---|---|"]
    draft = art.get("draft") or {}
    for key, title in (("path", "file"), ("sha256", "sha256"), ("arch", "architecture"), ("params", "parameters"),
                       ("quant", "quantization in the file"), ("weights_dtype", "in-memory format (specdec)"),
                       ("kv_cache", "KV cache (specdec)"), ("device", "device (specdec)"),
                       ("file_bytes", "file size (bytes)")):
        lines.append(f"| {title} | {art['target'].get(key, '–')} | {draft.get(key, '–') if draft else '–'} |")
    lines += ["", "## Runtime", ""]
    for key in ("specdec_version", "torch_version", "transformers_version", "python", "platform", "cpu_model",
                "cpu_count", "kernel_isa", "threads", "peak_rss_bytes"):
        if key in rt:
            lines.append(f"- {key.replace('_', ' ')}: {rt[key]}")
    lines += ["", "## Settings", ""]
    pm = s.get("prompt_set", {})
    lines.append(f"- prompts: {pm.get('name', '?')} ({pm.get('selection', '')}), source: {pm.get('source', '?')}, "
                 f"license: {pm.get('license', '?')}; {len(r['prompts'])} prompts in categories "
                 + ", ".join(f"{c} ({n})" for c, n in _count(p["category"] for p in r["prompts"]).items()))
    for key in ("methods", "temperatures", "max_tokens", "repeats", "warmup", "draft_n_max", "draft_lengths",
                "ctx_size", "weights", "drafter_state", "seed", "order", "peers"):
        if key in s:
            lines.append(f"- {key.replace('_', ' ')}: {s[key]}")
    lines += ["", "Speed-up is the median over rounds of (decode tokens/s of the configuration) / (decode tokens/s "
              "of its baseline in the same round). Decode tokens/s excludes the prompt and the first token. "
              "Engaged means at least one token was drafted and verified.", ""]

    peers = [c for c in r["configs"] if c["kind"] == "peer"]
    temps = s["temperatures"]
    for t in temps:
        lines += [f"## Results, temperature {t:g}", "",
                  "| config | category | engaged | tok/s | speed-up (min–max) | vs | acceptance | mean acc. len | "
                  "draft / verify s | greedy identical | memory MB (w + kv + drafter) |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for row in [x for x in r["summary"] if x["temperature"] == t]:
            gi = row["greedy_identical"]
            gi_s = "–" if gi is None else f"{gi['identical']}/{gi['compared']}"
            mem = row.get("memory") or {}
            mem_s = (f"{_mb(mem.get('weights_bytes'))} + {_mb(mem.get('kv_allocated_bytes'))} + "
                     f"{_mb(mem.get('drafter_bytes'))}") if mem else "–"
            spd = (f"{_f(row['speedup_median'])}x ({_f(row['speedup_min'])}–{_f(row['speedup_max'])})"
                   if row["config"] != row["baseline"] else "1.00x (baseline)")
            dv = "–" if row["draft_s"] is None else f"{row['draft_s']:.2f} / {row['verify_s']:.2f}"
            lines.append(f"| {row['config']} | {row['category']} | {row['engaged']} | "
                         f"{_f(row['decode_tokens_per_s_median'], '{:.1f}')} | {spd} | {row['baseline']} | "
                         f"{_f(row['acceptance_rate'])} | {_f(row['mean_acceptance_length'])} | {dv} | {gi_s} | "
                         f"{mem_s} |")
        lines.append("")
    if plots and "speedup" in plots:
        lines += [f"![speed-up by method and category]({plots['speedup']})", ""]

    lines += ["## Per-position acceptance (all categories)", "",
              "Position i: steps whose draft position i was accepted / steps that drafted at least i+1 tokens.", ""]
    for row in r["summary"]:
        if row["category"] == "all" and row["per_position_acceptance"]:
            pos = " ".join(f"{a:.2f}" for a in row["per_position_acceptance"])
            lines.append(f"- {row['config']} (T={row['temperature']:g}): {pos}")
    lines.append("")
    if plots and "acceptance" in plots:
        lines += [f"![per-position acceptance]({plots['acceptance']})", ""]

    if r["sweep"] and len({x["draft_n_max"] for x in r["sweep"]}) > 1:
        lines += ["## Speed-up against draft length (all categories)", "",
                  "| method | T | k | speed-up | acceptance | mean acc. len |", "|---|---|---|---|---|---|"]
        for x in r["sweep"]:
            lines.append(f"| {x['method']} | {x['temperature']:g} | {x['draft_n_max']} | {_f(x['speedup_median'])} | "
                         f"{_f(x['acceptance_rate'])} | {_f(x['mean_acceptance_length'])} |")
        lines.append("")
        if plots and "sweep" in plots:
            lines += [f"![speed-up against draft length]({plots['sweep']})", ""]

    if peers:
        lines += ["## Peers", ""]
        for c in peers:
            lines.append(f"- **{c['label']}**: {c['runtime']}; in-memory format: {c['in_memory_format']}; "
                         f"speculation path: {c['speculation_path']}; options: {c.get('options') or {}}; "
                         f"speed-up is against {c['baseline']}.")
        if any(c["label"].startswith("hf-") for c in peers):
            hf_format = next(c["in_memory_format"] for c in peers if c["label"].startswith("hf-"))
            held = hf_format.split(" (")[0]
            if "differs from" in hf_format:
                lines.append(f"- The transformers peers load the same file but hold it as {held}, while specdec holds "
                             f"{art['target'].get('weights_dtype')}: the in-memory formats differ, so this is not a "
                             "same-quantization comparison.")
            else:
                lines.append(f"- The transformers peers hold the weights as {held}, the same format as specdec.")
            lines.append("- transformers does not report accepted drafts: its speculating peers are "
                         "'engaged: unknown'.")
        lines.append("")

    a = r.get("auto")
    if a:
        verdict = {True: "yes", False: "NO", None: "unknown (too few tokens to compare)"}[a["no_slower_than_plain"]]
        lines += ["## auto", "", f"auto chose **{' + '.join(a['types']) or 'none'}** ({a['config']}).", ""]
        lines += [f"- {x}" for x in a["reasons"][1:]]
        lines += ["", f"No slower than plain decoding in every category (median speed-up >= "
                      f"{1 - a['tolerance']:.2f}): **{verdict}**."]
        for x in a["slower_in"]:
            lines.append(f"- slower in {x['category']} at T={x['temperature']:g}: {x['speedup_median']:.2f}x")
        lines.append("")
    if r.get("facts"):
        lines += ["## Facts for engine/auto.py", "", "| method | hardware | weights | verdict | evidence |",
                  "|---|---|---|---|---|"]
        for f in r["facts"]:
            lines.append(f"| {f['method']} | {f['hardware']} | {f['weights']} | {f['verdict']} | {f['evidence']} |")
        lines.append("")

    notes = caveats(r)
    if notes:
        lines += ["## Caveats", ""] + [f"- {n}" for n in notes] + [""]
    if r.get("load"):
        lines += load_markdown(r["load"])
    return "\n".join(lines)


def _count(items) -> dict:
    out: dict = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def caveats(r: dict) -> list[str]:
    notes = []
    for c in r["configs"]:
        rows = [x for x in r["summary"] if x["config"] == c["label"] and x["category"] == "all"]
        never = rows and all(x["engaged"] == "no" for x in rows)
        if c["kind"] == "specdec" and c["speculation_path"] == "yes" and never:
            notes.append(f"{c['label']} was configured but NEVER ENGAGED (drafted 0 tokens): its numbers are plain "
                         "decoding plus the drafter's overhead.")
    for c in r["configs"]:
        rows = [x for x in r["summary"] if x["config"] == c["label"] and x["category"] == "all"]
        for t in c.get("types", []):
            if t.startswith("draft-") and rows and any(x["engaged"] == "yes" for x in rows) \
                    and not any(t in x["by_drafter"] for x in rows):
                notes.append(f"{c['label']}: the {t} drafter was loaded but never drafted (the drafters before it "
                             "always had a draft).")
    for x in r["summary"]:
        gi = x["greedy_identical"]
        if x["category"] == "all" and gi and gi["identical"] < gi["compared"]:
            notes.append(f"{x['config']}: {gi['compared'] - gi['identical']} of {gi['compared']} greedy outputs differ "
                         f"from {x['baseline']} (numerics of batched matmuls, or a bug: see runs in results.json).")
    for x in r["summary"]:
        if x["category"] == "all" and x.get("lossy"):
            notes.append(f"{x['config']} used relaxed (typical) acceptance: LOSSY.")
    for x in r["summary"]:
        if x["category"] == "all" and x.get("failed_runs"):
            first = next(run["error"] for run in r["runs"] if run["config"] == x["config"] and run.get("error")
                         and run["temperature"] == x["temperature"])
            notes.append(f"{x['config']} at T={x['temperature']:g}: {x['failed_runs']} of "
                         f"{x['failed_runs'] + x['runs']} runs FAILED and are left out of its numbers "
                         f"(first: {first}).")
    if any(run["timing_source"].startswith("client wall clock") for run in r["runs"]):
        notes.append("an endpoint reported no timings: its tokens/s is wall clock including prefill and HTTP.")
    return notes


# -- server load (bench/load.py) ---------------------------------------------------------------
def _results(out_dir) -> dict | None:
    """out_dir/results.json as a dict, or None (none there, unreadable, not an object)."""
    file = Path(out_dir) / "results.json"
    try:
        existing = json.loads(file.read_text()) if file.is_file() else None
    except (ValueError, OSError):
        return None
    return existing if isinstance(existing, dict) else None


def _method_results(out_dir) -> dict | None:
    """The results.json of a method bench in out_dir, or None."""
    existing = _results(out_dir)
    if existing is not None and existing.get("schema") == "specdec-bench/1" and "summary" in existing:
        return existing
    return None


def _load_results(out_dir) -> dict | None:
    """The load section of out_dir/results.json (a load run alone, or joined to a method bench), or None."""
    load = (_results(out_dir) or {}).get("load")
    return load if isinstance(load, dict) else None


def _same_artifact(served: dict, target: dict) -> bool:
    """served: {"artifact": path, "sha256": ...} (a load run's server), target: a bench's artifacts.target."""
    if served.get("sha256") and target.get("sha256"):
        return served["sha256"] == target["sha256"]
    return Path(str(served.get("artifact"))).resolve() == Path(str(target.get("path"))).resolve()


def check_load_joins(out_dir, served: dict) -> None:
    """A ValueError, before a load run starts, when out_dir holds the method bench of another artifact than
    the one the server will load (`served`: {"artifact": path, "sha256": ...}; empty when unknown): its
    report would gain a load section about another model under the first one's name."""
    existing = _method_results(out_dir)
    target = ((existing or {}).get("artifacts") or {}).get("target") or {}
    if target and served and not _same_artifact(served, target):
        benched = target.get("name") or target.get("path")
        raise ValueError(f"{Path(out_dir) / 'results.json'} is the bench of {benched}; a load run of "
                         f"{served.get('artifact')} would be joined to it: choose another --out")


def check_bench_joins(out_dir, target: dict) -> None:
    """check_load_joins the other way round: a ValueError, before a method bench starts, when out_dir holds
    a load run whose server loaded another artifact than `target` ({"path": ..., "sha256": ...}); the
    method bench keeps a load run in its --out (write_all), so it would report one about another model."""
    served = (_load_results(out_dir) or {}).get("server") or {}
    if served.get("artifact") and target and not _same_artifact(served, target):
        raise ValueError(f"{Path(out_dir) / 'results.json'} holds a load run of {served['artifact']}; the bench "
                         f"of {target.get('path')} would be joined to it: choose another --out")


def write_load(load: dict, out_dir, runtime: dict | None = None) -> dict[str, Path]:
    """Put the load section into out_dir/results.json and report.md; returns their paths.

    A results.json of a normal bench already there keeps its contents and gains a "load" key (its
    report.md is rewritten with the load section at the end); otherwise both files hold the load run alone.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "markdown": out / "report.md"}
    existing = _method_results(out)
    if existing is not None:
        existing["load"] = load
        write_text(paths["json"], json.dumps(existing, indent=1))
        plots = {k: name for k, name in PLOTS.items() if (out / name).is_file()}
        write_text(paths["markdown"], markdown(existing, plots))
        return paths
    results = {"schema": load["schema"], "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runtime": runtime or {},
               "load": load}
    write_text(paths["json"], json.dumps(results, indent=1))
    lines = ["# specdec bench: server load", "", f"Created {results['created']}.", ""]
    if runtime:
        lines += ["## Client runtime", ""] + [f"- {k.replace('_', ' ')}: {v}" for k, v in runtime.items()] + [""]
    write_text(paths["markdown"], "\n".join(lines + load_markdown(load)) + "\n")
    return paths


def _ms(d: dict, keys) -> str:
    return " / ".join(_f(None if d.get(k) is None else d[k] * 1000, "{:.0f}") for k in keys)


def load_table(load: dict) -> list[str]:
    """The per-level table (markdown), also what `specdec bench --concurrency` prints."""
    lines = ["| concurrency | completed / sent | errors | output tok/s | req/s | TTFT p50 / p90 / p99 ms | "
             "ITL p50 / p99 ms | TPOT p50 / p99 ms | latency p50 / p99 s | greedy mismatches | acceptance |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in load["levels"]:
        errors = ", ".join(f"{k} {v}" for k, v in row["errors"].items()) or "0"
        if row["not_sent"]:
            errors += f" (+{row['not_sent']} not sent: level timeout)"
        g = row["greedy"]
        greedy = "–" if g is None else f"{g['mismatches']} of {g['compared']}"
        sp = row["spec"]
        acc = "–" if sp is None else ("not engaged" if sp["engaged"] == "no" else _f(sp["acceptance_rate"]))
        lat = row["latency_s"]
        lines.append(f"| {row['concurrency']} | {row['completed']} / {row['sent']} | {errors} | "
                     f"{_f(row['output_tokens_per_s'], '{:.1f}')} | {_f(row['requests_per_s'])} | "
                     f"{_ms(row['ttft_s'], ('p50', 'p90', 'p99'))} | {_ms(row['itl_s'], ('p50', 'p99'))} | "
                     f"{_ms(row['tpot_s'], ('p50', 'p99'))} | {_f(lat['p50'])} / {_f(lat['p99'])} | {greedy} | "
                     f"{acc} |")
    return lines


def load_markdown(load: dict) -> list[str]:
    s, srv = load["settings"], load["server"]
    lines = ["## Server load", ""]
    if srv.get("started_by_bench"):
        lines.append(f"- server: specdec's own, started by the bench at {s['base_url']}: `{srv.get('command_line')}`")
    else:
        lines.append(f"- server: {s['base_url']} (given by --url)")
    models = (srv.get("probe") or {}).get("models")
    if models:
        lines.append("- served models (/v1/models): " + ", ".join(
            f"{m.get('id')}" + (f" (speculative: {m['speculative']})" if m.get("speculative") else "") for m in models))
    if (srv.get("probe") or {}).get("error"):
        lines.append(f"- probe: {srv['probe']['error']}")
    for key in ("artifact", "sha256", "weights", "spec_type"):
        if srv.get(key):
            lines.append(f"- {key.replace('_', ' ')}: {srv[key]}")
    lines.append(f"- requests: streaming /v1/{'chat/completions' if s['endpoint'] == 'chat' else 'completions'}, "
                 f"model {s['model'] or '(not sent)'}, max_tokens {s['max_tokens']}, temperature {s['temperature']:g}, "
                 f"{s['requests']} per level over {len(s['prompts_used'])} prompts, per-request timeout "
                 f"{s['request_timeout_s']:g} s, level timeout {s['level_timeout_s']:g} s")
    sources = sorted({row["token_count_source"] for row in load["levels"] if row["token_count_source"]})
    how = {"usage": "the stream's final usage (include_usage)", "chunks": "one per text chunk (no usage sent)",
           "mixed": "usage where sent, else chunks"}
    lines.append("- output tokens counted from: " + ("; ".join(how[x] for x in sources) if sources else "–"))
    lines += ["", "Throughput is over the level's wall clock. TTFT: send to the first chunk with text. ITL: gaps "
              "between text chunks (a chunk may carry several tokens). TPOT: (latency - TTFT) / (tokens - 1) per "
              "request. Greedy mismatches: outputs (as text) that differ from the same prompt sent alone.", ""]
    lines += load_table(load) + [""]
    notes = []
    for row in load["levels"]:
        for kind, message in row["error_examples"].items():
            notes.append(f"concurrency {row['concurrency']}: {row['errors'][kind]} x {kind}: {message}")
        g = row["greedy"]
        if g and g["mismatches"]:
            notes.append(f"concurrency {row['concurrency']}: {g['mismatches']} of {g['compared']} greedy outputs "
                         "differ from the same prompt sent alone (batched numerics, or a bug: see runs in "
                         "results.json).")
        if g and g["compared"] < row["completed"]:
            notes.append(f"concurrency {row['concurrency']}: {row['completed'] - g['compared']} outputs had no "
                         "reference (the prompt failed when sent alone).")
    rates = [(row["concurrency"], row["spec"]["acceptance_rate"]) for row in load["levels"]
             if row["spec"] and row["spec"]["acceptance_rate"] is not None]
    if rates and max(r for _, r in rates) - min(r for _, r in rates) > 0.1:
        notes.append("acceptance moved between levels (" + ", ".join(f"C={c}: {r:.2f}" for c, r in rates) + "): "
                     "every level sends the same prompts, and a drafter that remembers earlier responses (suffix, "
                     "ngram-cache) accepts more on a repeat; compare levels with that in mind.")
    if load["settings"]["temperature"] != 0:
        notes.append("temperature > 0: no greedy comparison.")
    if notes:
        lines += ["Notes:", ""] + [f"- {n}" for n in notes] + [""]
    return lines


# -- plots -------------------------------------------------------------------------------------
def write_plots(r: dict, out: Path) -> dict[str, Path]:
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
    import matplotlib.pyplot as plt

    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
