"""`specdec bench --sessions`: the agentic sessions (bench/sessions.py) under every method, free and under
their constraints, beside llama-server (bench/session_peer.py); one row per (config, session, turn).

    section = run_sessions(model, load_sessions(), parse_methods("none,auto,suffix", model=model),
                           prefix_cache="on", max_tokens=48, constrain="both", peers=[server])

A config is a method (or a peer) with its sessions free or constrained ("+schema"); each config's baseline
is plain decoding in the same constraint state ("none" or "none+schema"), so "speed-up" is a method's decode
tok/s over plain's on the same turn, and "same" is whether its tokens are plain's, turn by turn (greedy: they
must be, bench/sessions.py). A peer's "same" compares its tokens with specdec's plain ones: another runtime's
numerics may pick other tokens where two are close, so for a peer it is information, not a check.
Only sessions that carry a constraint run constrained.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import asdict

from specdec.bench.methods import BASELINE, Method
from specdec.bench.sessions import Session, Turn, run_session
from specdec.engine.constrain import compile_for
from specdec.engine.engine import Engine

SCHEMA = "specdec-sessions/1"
CONSTRAIN_MODES = ("off", "on", "both")  # free runs, constrained runs, or both
SUFFIX = "+schema"  # a constrained config's label ends so


def constraint_states(mode: str) -> list[bool]:
    if mode not in CONSTRAIN_MODES:
        raise ValueError(f"--constrain must be one of {', '.join(CONSTRAIN_MODES)}, got {mode!r}")
    return {"off": [False], "on": [True], "both": [False, True]}[mode]


def session_grammars(model, session: Session) -> list:
    """The compiled grammar of each of `session`'s turns (None where the turn is free)."""
    out = []
    for t in range(1, len(session.turns()) + 1):
        c = session.constraint(t)
        out.append(None if c is None else compile_for(model, *c))
    return out


def run_sessions(model, sessions: list[Session], methods: list[Method], prefix_cache: str = "on",
                 max_tokens: int = 48, constrain: str = "off", peers=(), ctx_size: int = 4096,
                 progress: bool = True, warmup: bool = True) -> dict:
    """Every method (and peer) on every session, each session on a fresh engine; the results.json section.
    warmup: each config first answers the first session's first turn (8 tokens, not recorded), so no config's
    turn 1 pays the process's first forwards or auto's first cost measurement."""
    if not methods or methods[0].label != BASELINE:
        raise ValueError("the first method must be the baseline 'none'")
    states = constraint_states(constrain)
    constrained = [s for s in sessions if any(s.constraint(t) for t in range(1, len(s.turns()) + 1))]
    if True in states and not constrained:
        raise ValueError("--constrain on: none of the sessions carries a response_format or tools to follow")
    grammars = {s.id: session_grammars(model, s) for s in constrained} if True in states else {}
    turns: list[dict] = []
    configs: list[dict] = []
    errors: list[dict] = []  # {"config", "session", "error"}: a session run that failed; its turns are absent
    for state in states:
        todo = constrained if state else sessions
        tag = SUFFIX if state else ""
        for m in methods:
            label = m.label + tag
            configs.append({"label": label, "kind": "specdec", "method": m.spec.method, "constrained": state,
                            "baseline": BASELINE + tag, "auto_reasons": list(m.reasons)})
            if warmup:
                first = Session(todo[0].id, todo[0].category, todo[0].messages[:_first_answer(todo[0]) + 1])
                try:
                    run_session(Engine(model, max_len=ctx_size, prefix_cache=prefix_cache), first, 8, m.spec,
                                grammars.get(first.id, [None])[:1] if state else None)
                except RuntimeError:  # the measured run of that session meets it again and reports it
                    pass
            for s in todo:
                if progress:
                    print(f"sessions: {label} | {s.id}", file=sys.stderr)
                engine = Engine(model, max_len=ctx_size, prefix_cache=prefix_cache)
                try:
                    got = run_session(engine, s, max_tokens, m.spec, grammars.get(s.id) if state else None)
                except RuntimeError as exc:  # an engine failure: said in the report, the other runs still measured
                    errors.append({"config": label, "session": s.id, "error": str(exc).splitlines()[0]})
                    continue
                turns += [_row(label, t) for t in got]
        for peer in peers:
            label = peer.label + tag
            configs.append({"label": label, "kind": "peer", "constrained": state, "baseline": BASELINE + tag,
                            **peer.describe()})
            if warmup:
                first = todo[0]
                peer.run_session(Session(first.id, first.category, first.messages[:_first_answer(first) + 1],
                                         first.response_format, first.tools), 8, state)
            for s in todo:
                if progress:
                    print(f"sessions: {label} | {s.id}", file=sys.stderr)
                turns += [_row(label, t) for t in peer.run_session(s, max_tokens, state)]
    _compare(turns, configs)
    return {"schema": SCHEMA, "settings": {"prefix_cache": prefix_cache, "max_tokens": max_tokens,
                                           "constrain": constrain, "ctx_size": ctx_size,
                                           "sessions": [s.id for s in sessions],
                                           "constrained_sessions": [s.id for s in constrained]},
            "configs": configs, "turns": turns, "errors": errors, "summary": summarize(turns, configs, errors)}


def _first_answer(session: Session) -> int:
    return next(i for i, m in enumerate(session.messages) if m["role"] == "assistant")


def _row(label: str, t: Turn) -> dict:
    row = asdict(t)
    row["token_ids"] = list(t.token_ids)
    n = len(t.token_ids)  # the first token is timed in ttft_s: decode covers the n - 1 after it
    rate = (n - 1) / t.decode_s if n > 1 and t.decode_s > 0 else None
    return {"config": label, **row, "output_tokens": n, "decode_tokens_per_s": rate}


def _compare(turns: list[dict], configs: list[dict]) -> None:
    """Each row's speed-up over its baseline's decode tok/s on the same turn, and whether its tokens are the
    baseline's (None where the baseline has no such turn)."""
    baseline_of = {c["label"]: c["baseline"] for c in configs}
    by_key = {(r["config"], r["session"], r["turn"]): r for r in turns}
    for r in turns:
        base = by_key.get((baseline_of[r["config"]], r["session"], r["turn"]))
        if base is None:
            r["speedup"] = r["identical_to_baseline"] = None
            continue
        r["identical_to_baseline"] = r["token_ids"] == base["token_ids"]
        a, b = r["decode_tokens_per_s"], base["decode_tokens_per_s"]
        r["speedup"] = a / b if a and b else None


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(turns: list[dict], configs: list[dict], errors: list[dict] = ()) -> list[dict]:
    """Per config: median decode tok/s and speed-up over the turns, turn-5 (the last) over turn-1 TTFT per
    session, and whether every turn was the baseline's token for token (False where a session run failed)."""
    out = []
    for c in configs:
        rows = [r for r in turns if r["config"] == c["label"]]
        ratios = {}
        for sid in dict.fromkeys(r["session"] for r in rows):
            mine = sorted((r for r in rows if r["session"] == sid), key=lambda r: r["turn"])
            ratios[sid] = mine[-1]["ttft_s"] / mine[0]["ttft_s"] if mine[0]["ttft_s"] > 0 else None
        same = [r["identical_to_baseline"] for r in rows] + [False for e in errors if e["config"] == c["label"]]
        out.append({"config": c["label"], "kind": c["kind"], "constrained": c["constrained"],
                    "turns": len(rows), "ttft_median_s": _median(r["ttft_s"] for r in rows),
                    "ttft_last_over_first": ratios,
                    "decode_tokens_per_s_median": _median(r["decode_tokens_per_s"] for r in rows),
                    "speedup_median": _median(r["speedup"] for r in rows if r["config"] != c["baseline"]),
                    "identical": None if None in same else all(same)})
    return out
