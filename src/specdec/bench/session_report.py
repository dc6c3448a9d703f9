"""The agentic sessions' section (bench/session_bench.py) in results.json ("sessions") and report.md.

    print("\\n".join(sessions_markdown(section)))

A turn table per constraint state (free, then "+schema"): for each config its TTFT, decode tok/s, speed-up
over plain in the same state and whether its tokens were plain's; then a summary per config.
"""

from __future__ import annotations



def _f(x, fmt="{:.2f}") -> str:
    return "–" if x is None else fmt.format(x)


def _same(x) -> str:
    return "–" if x is None else ("yes" if x else "NO")


def turn_table(section: dict, constrained: bool) -> list[str]:
    configs = [c for c in section["configs"] if c["constrained"] == constrained]
    if not configs:
        return []
    rows = {}
    for r in section["turns"]:
        rows.setdefault((r["session"], r["turn"]), {})[r["config"]] = r
    head = ["session", "turn", "prompt", "reused"]
    for c in configs:
        head += [f"{c['label']} TTFT s", "tok/s", "speed-up", "same"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first = configs[0]["label"]
    for (session, turn), by in rows.items():
        if first not in by:
            continue  # a free session in the constrained table
        cells = [session, str(turn), str(by[first]["prompt_tokens"]), str(by[first]["cached_tokens"])]
        for c in configs:
            r = by.get(c["label"])
            cells += ["–"] * 4 if r is None else [
                _f(r["ttft_s"], "{:.3f}"), _f(r["decode_tokens_per_s"], "{:.1f}"),
                "–" if c["label"] == c["baseline"] else _f(r["speedup"], "{:.2f}x"),
                "–" if c["label"] == c["baseline"] else _same(r["identical_to_baseline"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary_table(section: dict) -> list[str]:
    lines = ["| config | turns | last/first turn TTFT | median TTFT s | median tok/s | median speed-up | identical |",
             "|---|---|---|---|---|---|---|"]
    for s in section["summary"]:
        ratios = ", ".join(f"{sid} {_f(v, '{:.2f}')}" for sid, v in s["ttft_last_over_first"].items())
        lines.append(f"| {s['config']} | {s['turns']} | {ratios} | {_f(s['ttft_median_s'], '{:.3f}')} | "
                     f"{_f(s['decode_tokens_per_s_median'], '{:.1f}')} | {_f(s['speedup_median'], '{:.2f}x')} | "
                     f"{_same(s['identical'])} |")
    return lines


def sessions_markdown(section: dict) -> list[str]:
    st = section["settings"]
    lines = ["## Agentic sessions", "",
             f"Sessions {', '.join(st['sessions'])}; prefix cache `{st['prefix_cache']}`, at most "
             f"{st['max_tokens']} tokens a turn, greedy, each session on a fresh engine per method. "
             "TTFT: admission to the first token (llama-server: its prompt_ms); reused: prompt tokens the prefix "
             "cache gave (plain's). Speed-up: decode tok/s over plain decoding's on the same turn in the same "
             "constraint state; same: the turn's tokens are plain's (for a peer: specdec plain's, information "
             "rather than a check, as its numerics differ).", ""]
    for c in section["configs"]:
        if c["kind"] == "peer":
            lines.append(f"- {c['label']}: {c.get('runtime', '')}, `{c.get('command_line', '')}`")
        elif c.get("auto_reasons"):
            lines.append(f"- {c['label']}: " + "; ".join(c["auto_reasons"]))
    lines.append("")
    lines += ["### Free", ""] + turn_table(section, False) + [""]
    constrained = turn_table(section, True)
    if constrained:
        lines += ["### Under the sessions' constraints (+schema)", "",
                  f"Sessions {', '.join(st['constrained_sessions'])}: a response_format's JSON schema on every "
                  "turn, or the call grammar of its tools on the tool-call turns (llama-server: the schema in its "
                  "json_schema field, the call in its grammar field as GBNF).", ""] + constrained + [""]
    lines += ["### Summary", ""] + summary_table(section) + [""]
    if section.get("errors"):
        lines += ["### Failed runs", "", "Each failed session run is absent from the tables; its config is not "
                  "identical.", ""] + [f"- {e['config']} | {e['session']}: {e['error']}" for e in section["errors"]]
        lines.append("")
    return lines
