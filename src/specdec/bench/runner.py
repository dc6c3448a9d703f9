"""The measuring loop of `specdec bench` (docs/bench.md, "Measuring honestly").

One Engine per model (weights load once); every method is a SpecConfig passed per request.
The plain baseline and each method run on the same prompts in one process, interleaved: a
round is (repeat, prompt, temperature), and within a round every configuration runs once, in
an order rotated from one round of a temperature to the next, so that at each temperature every
configuration runs in every position equally often (when the rounds allow). Speed-up is the ratio of
decode tokens/s of a method to its baseline in the same round; medians are taken over rounds.

    engine = bench_engine(model, ctx_size=2048)
    methods = parse_methods("none,suffix,ngram-map-k:min_hits=1000", model=model)
    results = run_bench(engine, load_prompts("quick"), methods, temperatures=[0.0], max_tokens=64)

Methods and the engine they run on: bench/methods.py.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from specdec.bench import memory
from specdec.bench.methods import BASELINE, Method
from specdec.bench.verdicts import estimate_error, summary_fields
from specdec.engine.stats import SpecStats
from specdec.model.errors import SpecdecError
from specdec.sampling import SamplingParams

SCHEMA = "specdec-bench/1"
PEER_GIVE_UP = 3  # failed requests in a row after which a peer's later runs are not sent (each may wait minutes)


class PeerError(SpecdecError):
    """A peer server that failed, or answered something that is not an OpenAI completion."""


# -- one run -----------------------------------------------------------------------------------
@dataclass
class RunOutput:
    token_ids: list[int] | None
    text: str
    prefill_s: float | None
    decode_s: float
    output_tokens: int
    engaged: str  # "yes", "no", "unknown"
    drafted: int | None = None
    accepted: int | None = None
    stats: SpecStats | None = None
    timing_source: str = "engine"
    extra: dict = field(default_factory=dict)
    prefill_tokens: int = 1  # output tokens that came with the prefill (transformers' assisted generation: several)

    @property
    def decode_tokens_per_s(self) -> float | None:
        n = self.output_tokens - self.prefill_tokens  # those are timed in prefill_s, not decode_s
        if n < 1 or self.decode_s <= 0:
            return None
        return n / self.decode_s


def interleaved_rounds(repeats: int, n_prompts: int, temperatures, configs: list) -> list[tuple]:
    """The bench's rounds in run order: (repeat, prompt index, temperature, configs in their order).

    Within a temperature the order rotates by one from round to round, so that every configuration
    runs in every position equally often there (when the rounds are a multiple of the configurations),
    and each prompt meets a new order at each repeat: a repeat starts one further on where the prompts
    are a multiple of the configurations. Rotating by the round's overall index instead gave every
    round of one temperature the same order whenever the temperatures were as many as the
    configurations (at T=0 plain decoding always ran first and auto second, a bias in every T=0 ratio);
    rotating by the round's index alone gave each prompt the same order in every repeat with the
    default 15 prompts and 5 methods, so each category kept its positions.

    >>> [(t, order) for _, _, t, order in interleaved_rounds(1, 2, [0.0, 0.7], ["none", "auto"])]
    [(0.0, ['none', 'auto']), (0.7, ['none', 'auto']), (0.0, ['auto', 'none']), (0.7, ['auto', 'none'])]
    """
    rounds = []
    step = n_prompts % len(configs) or 1  # how far a prompt's order moves from one repeat to the next
    for rep in range(repeats):
        for pi in range(n_prompts):
            shift = (rep * step + pi) % len(configs)
            for t in temperatures:
                rounds.append((rep, pi, t, configs[shift:] + configs[:shift]))
    return rounds


def run_specdec(engine, method: Method, prompt_ids: list[int], sampling: SamplingParams, max_tokens: int) -> RunOutput:
    result = engine.generate(prompt_ids, sampling, max_tokens, spec=method.spec)
    stats = result.stats
    return RunOutput(result.token_ids, result.text, result.prefill_s, result.decode_s, result.completion_tokens,
                     "yes" if stats.engaged else "no", stats.drafted, stats.accepted, stats)


# -- the loop ----------------------------------------------------------------------------------
@dataclass
class _Config:
    label: str
    kind: str  # "specdec" or "peer"
    method: Method | None = None
    peer: object = None
    baseline: str = BASELINE

    def describe(self, engine) -> dict:
        if self.kind == "specdec":
            m = self.method
            return {"label": self.label, "kind": "specdec", "method": m.spec.method, "base": m.base,
                    "types": list(m.spec.types), "drafters": [d.label() for d in m.spec.drafters],
                    "draft_n_max": m.spec.draft_n_max,
                    "draft_model": m.spec.draft_model, "baseline": self.baseline,
                    "runtime": "specdec", "in_memory_format": engine.model.info.weights_dtype,
                    "speculation_path": "yes" if m.spec.enabled else "no",
                    "auto_reasons": list(m.reasons)}
        d = self.peer.describe()
        d.update({"label": self.label, "kind": "peer", "baseline": self.baseline})
        return d


def run_bench(engine, prompts, methods: list[Method], temperatures=(0.0,), max_tokens: int = 128,
              repeats: int = 3, warmup: bool = True, peers=(), seed: int = 0, progress: bool = True,
              settings: dict | None = None, auto_tolerance: float = 0.02, grammar=None) -> dict:
    """Measure every method (and peer) on every prompt; returns the results.json dict. grammar: a compiled
    sampling.grammar.Grammar every specdec request follows (the baseline's too), or None."""
    configs = [_Config(m.label, "specdec", m) for m in methods]
    if not configs or configs[0].label != BASELINE:
        raise ValueError("the first method must be the baseline 'none'")
    labels = {c.label for c in configs}
    for p in peers:
        if p.label in labels:
            raise ValueError(f"peer label {p.label!r} clashes with a method")
        labels.add(p.label)
        configs.append(_Config(p.label, "peer", peer=p, baseline=p.baseline if p.baseline in labels else BASELINE))
    tok = engine.model.tokenizer
    rendered = [(p, p.render(tok)) for p in prompts]
    for p, ids in rendered:
        if len(ids) + max_tokens + 2 > engine.cache.max_len:
            raise ValueError(f"prompt {p.id} ({len(ids)} tokens) + --max-tokens {max_tokens} does not fit the "
                             f"context of {engine.cache.max_len} (--ctx-size)")
    # a URL peer gets text, and its server puts the BOS in front itself: the text leaves out the BOS of the ids,
    # so that server's prompt holds one BOS, as specdec's does
    texts = {p.id: tok.decode(ids[1:] if tok.add_bos and ids[:1] == [tok.bos_id] else ids) for p, ids in rendered}

    def run_one(cfg: _Config, prompt, ids, temperature, n, run_seed) -> RunOutput:
        sampling = SamplingParams(temperature=temperature, seed=run_seed, grammar=grammar)
        if cfg.kind == "specdec":
            return run_specdec(engine, cfg.method, ids, sampling, n)
        return cfg.peer.generate(ids, texts[prompt.id], temperature, n, run_seed)

    if warmup:
        p0, ids0 = rendered[0]
        bar = tqdm(configs, desc="warm-up", unit="config", disable=not progress, file=sys.stderr, leave=False)
        for cfg in bar:
            run_one(cfg, p0, ids0, temperatures[0], min(8, max_tokens), seed)

    rounds = interleaved_rounds(repeats, len(rendered), temperatures, configs)
    failing: dict[str, int] = {}  # a peer's failed requests in a row
    runs: list[dict] = []
    stats_of: dict[int, SpecStats] = {}
    kv_per_token = memory.kv_bytes_per_token(engine.model.config, engine.model.info.kv_cache)
    drafter_mem: dict[str, tuple[int, str]] = {}
    bar = tqdm(total=len(rounds) * len(configs), desc="bench", unit="run", disable=not progress, file=sys.stderr)
    for r, (rep, pi, temperature, order) in enumerate(rounds):
        prompt, ids = rendered[pi]
        run_seed = seed + 1000 * rep + pi
        round_runs = {}
        for position, cfg in enumerate(order):
            bar.set_postfix_str(f"{cfg.label} | {prompt.id}")
            if cfg.kind == "specdec":
                out = run_one(cfg, prompt, ids, temperature, max_tokens, run_seed)
            elif failing.get(cfg.label, 0) >= PEER_GIVE_UP:
                out = _failed_run(f"not sent: the peer failed {PEER_GIVE_UP} requests in a row")
            else:  # one failed request of a peer is that run's result, not the end of hours of measurement
                try:
                    out = run_one(cfg, prompt, ids, temperature, max_tokens, run_seed)
                    failing[cfg.label] = 0
                except PeerError as exc:
                    failing[cfg.label] = failing.get(cfg.label, 0) + 1
                    out = _failed_run(str(exc))
            rec = {
                "config": cfg.label, "prompt": prompt.id, "category": prompt.category, "temperature": temperature,
                "repeat": rep, "round": r, "position": position, "prompt_tokens": len(ids),
                "output_tokens": out.output_tokens, "prefill_s": out.prefill_s, "decode_s": out.decode_s,
                "decode_tokens_per_s": out.decode_tokens_per_s, "timing_source": out.timing_source,
                "engaged": out.engaged, "drafted": out.drafted, "accepted": out.accepted,
                "speedup": None, "identical_to_baseline": None,
                "spec": out.stats.to_dict() if out.stats is not None else None,
                "rss_bytes": memory.rss_bytes(),
                "kv_used_bytes": (len(ids) + out.output_tokens) * kv_per_token if cfg.kind == "specdec" else None,
            }
            rec.update(out.extra)
            if out.stats is not None:
                stats_of[len(runs)] = out.stats
            round_runs[cfg.label] = (rec, out)
            runs.append(rec)
            if cfg.kind == "specdec" and cfg.method.spec.enabled:
                sizes = [memory.drafter_bytes(d) for d in engine.drafters_for(cfg.method.spec)]
                total = (sum(b for b, _ in sizes), " + ".join(how for _, how in sizes))
                drafter_mem[cfg.label] = max(drafter_mem.get(cfg.label, (0, "")), total)
            bar.update(1)
        for cfg in configs:  # pair each run with its baseline in this round
            rec, out = round_runs[cfg.label]
            base_rec, base_out = round_runs[cfg.baseline]
            if cfg.label != cfg.baseline and rec["decode_tokens_per_s"] and base_rec["decode_tokens_per_s"]:
                rec["speedup"] = rec["decode_tokens_per_s"] / base_rec["decode_tokens_per_s"]
            if cfg.kind == "specdec" and cfg.label != cfg.baseline:  # the verdict's yardstick against the plain run
                rec["plain_estimate_error"] = estimate_error(rec, base_rec)
            if temperature == 0.0 and cfg.label != cfg.baseline:
                rec["identical_to_baseline"] = _identical(out, base_out)
                if rec["identical_to_baseline"] is not None:
                    rec["compared_by"] = "token ids" if out.token_ids is not None and base_out.token_ids is not None \
                        else "text"
    bar.close()

    described = {c.label: c.describe(engine) for c in configs}
    weights = memory.transformer_bytes(engine.model.transformer)
    for c in configs:
        if c.kind == "specdec":
            dm, how = drafter_mem.get(c.label, (0, "none"))
            used = max((r["kv_used_bytes"] for r in runs if r["config"] == c.label), default=0)
            described[c.label]["memory"] = {
                "weights_bytes": weights, "kv_allocated_bytes": engine.cache.nbytes(), "kv_used_bytes": used,
                "drafter_bytes": dm, "drafter_bytes_measured_by": how,
                "total_bytes": weights + engine.cache.nbytes() + dm,
            }
    summary = summarize(runs, stats_of, configs, temperatures)
    for s in summary:
        s["memory"] = described[s["config"]].get("memory")
    results = {
        "schema": SCHEMA,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {**(settings or {}), "temperatures": list(temperatures), "max_tokens": max_tokens,
                     "repeats": repeats, "warmup": warmup, "seed": seed,
                     "order": "interleaved: every configuration once per (repeat, prompt, temperature) round, "
                              "order rotated by one each round of the same temperature",
                     "auto_tolerance": auto_tolerance},
        "prompts": [{"id": p.id, "category": p.category, "prompt_tokens": len(ids)} for p, ids in rendered],
        "configs": list(described.values()),
        "runs": runs,
        "summary": summary,
        "sweep": sweep(summary, methods),
        "auto": auto_check(summary, methods, auto_tolerance),
    }
    return results


def _failed_run(error: str) -> RunOutput:
    """A peer's run that has no result: no tokens, no rate, the error in the run's record."""
    return RunOutput(None, None, None, 0.0, 0, "unknown", timing_source="none (no answer)", extra={"error": error})


def _identical(out: RunOutput, base: RunOutput) -> bool | None:
    if out.token_ids is not None and base.token_ids is not None:
        return list(out.token_ids) == list(base.token_ids)
    if out.text is not None and base.text is not None:
        return out.text == base.text
    return None


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict], stats_of: dict[int, SpecStats], configs, temperatures) -> list[dict]:
    """Per configuration, temperature and category (and 'all'): medians, acceptance, engagement."""
    out = []
    categories = list(dict.fromkeys(r["category"] for r in runs))
    for cfg in configs:
        for t in temperatures:
            for cat in categories + ["all"]:
                every = [i for i, r in enumerate(runs) if r["config"] == cfg.label and r["temperature"] == t
                         and (cat == "all" or r["category"] == cat)]
                if not every:
                    continue
                idx = [i for i in every if runs[i].get("error") is None]  # a peer's failed runs have no numbers
                sel = [runs[i] for i in idx]
                base_sel = [r for r in runs if r["config"] == cfg.baseline and r["temperature"] == t
                            and (cat == "all" or r["category"] == cat)]
                ratios = [r["speedup"] for r in sel if r["speedup"] is not None]
                row = {
                    "config": cfg.label, "kind": cfg.kind, "temperature": t, "category": cat, "runs": len(sel),
                    "failed_runs": len(every) - len(idx), "baseline": cfg.baseline,
                    "decode_tokens_per_s_median": _median(r["decode_tokens_per_s"] for r in sel),
                    "baseline_tokens_per_s_median": _median(r["decode_tokens_per_s"] for r in base_sel),
                    "speedup_median": _median(ratios) if cfg.label != cfg.baseline else 1.0,
                    "speedup_min": min(ratios) if ratios else None,
                    "speedup_max": max(ratios) if ratios else None,
                    "output_tokens_median": _median(r["output_tokens"] for r in sel),
                }
                if cfg.kind == "specdec":
                    merged = SpecStats(method=cfg.method.spec.method)
                    for i in idx:
                        merged.merge(stats_of[i])
                    busy = merged.draft_s + merged.verify_s
                    row.update({
                        "engaged": "yes" if merged.engaged else "no",
                        "configured": merged.configured,
                        "drafted": merged.drafted, "accepted": merged.accepted, "steps": merged.steps,
                        "acceptance_rate": merged.acceptance_rate,
                        "mean_acceptance_length": merged.mean_acceptance_length,
                        "per_position_acceptance": merged.per_position_acceptance,
                        "draft_s": merged.draft_s, "verify_s": merged.verify_s,
                        "draft_fraction": merged.draft_s / busy if busy > 0 else None,
                        "lossy": merged.lossy,
                        "by_drafter": {k: vars(v).copy() for k, v in merged.by_drafter.items()},
                    })
                    row.update(summary_fields(sel, merged))
                else:
                    engaged = {r["engaged"] for r in sel}
                    drafted = [r["drafted"] for r in sel]
                    known = all(d is not None for d in drafted)
                    d_sum = sum(drafted) if known else None
                    a_sum = sum(r["accepted"] or 0 for r in sel) if known else None
                    row.update({
                        "engaged": "yes" if "yes" in engaged else "no" if engaged == {"no"} else "unknown",
                        "configured": None, "drafted": d_sum, "accepted": a_sum, "steps": None,
                        "acceptance_rate": (a_sum / d_sum) if known and d_sum else None,
                        "mean_acceptance_length": None, "per_position_acceptance": [],
                        "draft_s": None, "verify_s": None, "draft_fraction": None, "lossy": None,
                        "by_drafter": {},
                    })
                    row.update(summary_fields(sel, None))
                compared = [r["identical_to_baseline"] for r in sel if r["identical_to_baseline"] is not None]
                row["greedy_identical"] = ({"identical": sum(compared), "compared": len(compared)}
                                           if t == 0.0 and cfg.label != cfg.baseline else None)
                out.append(row)
    return out


def sweep(summary: list[dict], methods: list[Method]) -> list[dict]:
    """Speed-up against draft length, per method entry (all categories)."""
    rows = []
    by_label = {m.label: m for m in methods}
    for s in summary:
        m = by_label.get(s["config"])
        if m is None or s["category"] != "all" or not m.spec.enabled:
            continue
        rows.append({"method": m.base, "draft_n_max": m.spec.draft_n_max, "temperature": s["temperature"],
                     "config": m.label, "speedup_median": s["speedup_median"],
                     "acceptance_rate": s["acceptance_rate"], "mean_acceptance_length": s["mean_acceptance_length"]})
    rows.sort(key=lambda r: (r["method"], r["temperature"], r["draft_n_max"]))
    return rows


def auto_check(summary: list[dict], methods: list[Method], tolerance: float) -> dict | None:
    """Was auto's choice no slower than plain decoding in every category (median ratio >= 1 - tolerance)?"""
    auto = next((m for m in methods if m.base == "auto" and " k=" not in m.label), None)
    if auto is None:
        return None
    rows = [s for s in summary if s["config"] == auto.label]
    slower = [s for s in rows if s["speedup_median"] is not None and s["speedup_median"] < 1.0 - tolerance]
    unknown = [s for s in rows if s["speedup_median"] is None]
    return {
        "config": auto.label, "types": list(auto.spec.types), "reasons": list(auto.reasons),
        "no_slower_than_plain": None if unknown and not slower else not slower,
        "slower_in": [{"category": s["category"], "temperature": s["temperature"],
                       "speedup_median": s["speedup_median"]} for s in slower],
        "tolerance": tolerance,
    }
