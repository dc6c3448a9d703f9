"""The bench's verdicts (engine/verdict.py), and a check of their yardstick against a measurement.

Every speculative run carries its request's verdict (results.json: runs[i]["spec"]["verdict"]), and every
summary row the verdict of its runs merged (SpecStats.merge adds their times and plain estimates). The
check: a speculative run's estimated plain step (verdict["plain_step_s"]: the estimate over its decode
tokens) against the plain run of the same round, measured (its decode_s over its decode tokens):

    runs[i]["plain_estimate_error"] = estimated step / measured step - 1     (None where either is missing)

Per token, so that a sampled run that made other tokens than the plain one still compares; the summary
rows carry the median and range, and the report a table per temperature.
"""

from __future__ import annotations

import statistics


def estimate_error(rec: dict, base: dict) -> float | None:
    """rec: a speculative run's record, base: the plain run of its round (both specdec runs, results.json's
    shape). None unless rec has a plain estimate and base decoded at least one token after its first."""
    spec, plain = rec.get("spec"), base.get("spec")
    if not spec or not plain or not spec["configured"] or plain["configured"]:
        return None
    step = spec["verdict"]["plain_step_s"]
    n = base["output_tokens"] - 1  # the first token comes with the prefill; the rest are decode steps
    if step is None or n < 1 or not base["decode_s"]:
        return None
    return step / (base["decode_s"] / n) - 1


def summary_fields(runs: list[dict], merged) -> dict:
    """A summary row's verdict fields: merged, the row's SpecStats merged (None for a peer)."""
    if merged is None:
        return {"rollback_s": None, "verdict": None, "plain_estimate_error": None}
    errors = [r["plain_estimate_error"] for r in runs if r.get("plain_estimate_error") is not None]
    sources: dict[str, int] = {}
    for r in runs:
        if r.get("plain_estimate_error") is not None:
            source = r["spec"]["verdict"]["estimate_from"]
            sources[source] = sources.get(source, 0) + 1
    check = None if not errors else {
        "median": statistics.median(errors), "min": min(errors), "max": max(errors), "runs": len(errors),
        "within_15_percent": sum(abs(e) <= 0.15 for e in errors), "estimate_from": sources}
    return {"rollback_s": merged.rollback_s, "verdict": merged.verdict().to_dict(), "plain_estimate_error": check}


def _pct(x: float) -> str:
    return f"{100 * x:+.0f}%"


def markdown(summary: list[dict]) -> list[str]:
    """The report's verdict section: per configuration and category, what speculation was worth by the
    verdict, why not when it did not pay, and how far its plain estimate was from the plain runs."""
    rows = [s for s in summary if s.get("verdict") and s["verdict"]["reason"] != "not_configured"]
    if not rows:
        return []
    lines = ["## Verdicts", "",
             "Per request, the engine estimates what plain decoding would have taken for the same tokens (one plain "
             "step per token after the first, priced from measured plain steps) and judges the speed-up; rows "
             "merge their runs. *estimate vs plain run*: the estimated plain step against the plain run of the "
             "same round, median (min to max) over runs, and how many were within 15%.", ""]
    for t in dict.fromkeys(s["temperature"] for s in rows):
        lines += [f"### T = {t:g}", "",
                  "| config | category | verdict | reason | draft / verify / rollback s | estimate vs plain run |",
                  "|---|---|---|---|---|---|"]
        for s in (s for s in rows if s["temperature"] == t):
            v, e = s["verdict"], s["plain_estimate_error"]
            said = "–" if v["speedup"] is None else f"{v['speedup']:.2f}x" + (" (paid)" if v["pays"] else "")
            times = f"{v['draft_s']:.2f} / {v['verify_s']:.2f} / {v['rollback_s']:.3f}"
            check = "–" if e is None else (f"{_pct(e['median'])} ({_pct(e['min'])} to {_pct(e['max'])}), "
                                           f"{e['within_15_percent']}/{e['runs']} within 15%")
            lines.append(f"| {s['config']} | {s['category']} | {said} | {v['reason'] or '–'} | {times} | {check} |")
        lines.append("")
    return lines
