"""results.json -> report.md (and the PNG plots of plots.py).

Every report names the artifact, the runtime and the settings first; then one table per
temperature; then per-position acceptance, the draft-length sweep, peers, the verdicts
(bench/verdicts.py), auto's check, and the caveats (methods never engaged, greedy outputs that differed from the baseline).
`specdec bench --sessions` adds a "sessions" section (bench/session_report.py renders it, write_sessions
writes it). `specdec bench --concurrency` adds a "load" section (bench/load.py): write_load puts it into
results.json and report.md, as a table per concurrency level. What an --out folder already holds,
and whether a run may join it, is results_file.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from specdec.bench.plots import PLOTS, write_plots
from specdec.bench.results_file import load_results, method_results
from specdec.bench.session_report import sessions_markdown
from specdec.bench.verdicts import markdown as verdict_markdown
from specdec.model.files import write_text


def write_all(results: dict, out_dir) -> dict[str, Path]:
    """Write results.json, report.md and the plots; returns their paths by kind.

    A load run (`--concurrency`) already in out_dir/results.json is kept, as its report section
    (check_bench_joins refused, before the bench ran, one of another artifact)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    load = load_results(out)
    if load is not None and "load" not in results:
        results = {**results, "load": load}
    sessions = (method_results(out) or {}).get("sessions")  # a --sessions run there is kept too
    if sessions is not None and "sessions" not in results:
        results = {**results, "sessions": sessions}
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

    lines += verdict_markdown(r["summary"])
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

    notes = caveats(r)
    if notes:
        lines += ["## Caveats", ""] + [f"- {n}" for n in notes] + [""]
    if r.get("load"):
        lines += load_markdown(r["load"])
    if r.get("sessions"):
        lines += sessions_markdown(r["sessions"])
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


def _section_paths(out_dir) -> dict[str, Path]:
    """out_dir (made if missing)'s results.json and report.md, by kind."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return {"json": out / "results.json", "markdown": out / "report.md"}


def _add_to_method_bench(paths: dict[str, Path], key: str, section: dict) -> bool:
    """Where a normal bench's results.json is already there: it gains `key` and its report.md is rewritten
    with the section at the end (True); False where there is none."""
    out = paths["json"].parent
    existing = method_results(out)
    if existing is None:
        return False
    existing[key] = section
    write_text(paths["json"], json.dumps(existing, indent=1))
    write_text(paths["markdown"], markdown(existing, {k: n for k, n in PLOTS.items() if (out / n).is_file()}))
    return True


# -- server load (bench/load.py) ---------------------------------------------------------------
def write_load(load: dict, out_dir, runtime: dict | None = None) -> dict[str, Path]:
    """Put the load section into out_dir/results.json and report.md; returns their paths.

    A results.json of a normal bench already there keeps its contents and gains a "load" key (its
    report.md is rewritten with the load section at the end); otherwise both files hold the load run alone.
    """
    paths = _section_paths(out_dir)
    if _add_to_method_bench(paths, "load", load):
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


# -- agentic sessions (bench/session_bench.py) --------------------------------------------------
def write_sessions(section: dict, out_dir, runtime: dict | None = None, artifact: dict | None = None) -> dict:
    """Put the section into out_dir/results.json and report.md (a method bench already there gains a
    "sessions" key and its report the section at the end); returns the paths by kind."""
    paths = _section_paths(out_dir)
    if _add_to_method_bench(paths, "sessions", section):
        return paths
    results = {"schema": section["schema"], "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               "runtime": runtime or {}, "artifacts": {"target": artifact or {}}, "sessions": section}
    write_text(paths["json"], json.dumps(results, indent=1))
    lines = ["# specdec bench: agentic sessions", "", f"Created {results['created']}.", ""]
    if artifact:
        lines += [f"Target: {artifact.get('name') or artifact.get('path')} ({artifact.get('sha256', '')[:12]})", ""]
    write_text(paths["markdown"], "\n".join(lines + sessions_markdown(section)) + "\n")
    return paths
