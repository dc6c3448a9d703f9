"""`specdec tune`: measure on this machine which speculative configurations pay for a model, for auto.

Every configuration auto could run (engine/auto.candidates: each model-free kind, the model drafter alone
and behind the auto model-free kinds), at adaptive draft length as auto runs them, on the calibration
prompt set (one prompt per category, none of them the bench's), at greedy and sampled temperatures,
interleaved with plain decoding in the same rounds (bench/runner.run_bench). The speed-ups are saved as
a calibration (engine/calibration.py) that auto reads for this file, weights, threads, CPU and drafter.

    calibration = tune(load_model("smollm2-135m"))
"""

from __future__ import annotations

from specdec.bench.methods import BASELINE, Method, bench_engine
from specdec.bench.prompts import load_prompts
from specdec.bench.runner import run_bench
from specdec.drafters.describe import drafter_facts
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH
from specdec.engine.auto import candidates, model_drafter
from specdec.engine.calibration import Calibration, Measured, now, save_calibration
from specdec.engine.config import SpecConfig
from specdec.engine.spec_request import AutoTarget, calibration_key
from specdec.model.checkpoint_facts import target_facts

DEFAULT_TEMPERATURES = (0.0, 0.7)


def tune_methods(model, draft_model: str | None = None, draft_n_max: int = DEFAULT_DRAFT_LENGTH,
                 only: list[str] | None = None) -> list[Method]:
    """The baseline and the configurations to measure (only: keep those whose method label is listed)."""
    target = AutoTarget.of_model(model)
    facts = target_facts(model.checkpoint, target.path, target.name, target.weights_format)
    draft = drafter_facts(draft_model, model.checkpoint, model.tokenizer, target.name) if draft_model else None
    kind, path, _ = model_drafter(facts, draft)
    methods = [Method(BASELINE, SpecConfig(), BASELINE)]
    for types in candidates(facts, draft):
        spec = SpecConfig(drafters=types, draft_n_max=draft_n_max, adaptive=True,
                          draft_model=path if kind in types else None)
        label = "+".join(types)  # the bench's method syntax: kinds tried together
        if only is None or label in only:
            methods.append(Method(label, spec, label))
    if only is not None:
        unknown = sorted(set(only) - {m.label for m in methods})
        if unknown:
            raise ValueError(f"--methods {', '.join(unknown)}: not a configuration auto could run for this model; "
                             f"these are: {', '.join(m.label for m in methods[1:])}")
    return methods


def tune(model, draft_model: str | None = None, prompts: str = "calibration", temperatures=DEFAULT_TEMPERATURES,
         max_tokens: int = 64, repeats: int = 2, draft_n_max: int = DEFAULT_DRAFT_LENGTH,
         only: list[str] | None = None, ctx_size: int = 2048, progress: bool = True) -> tuple[Calibration, dict]:
    """Measure, save and return the calibration (and the bench results it came from)."""
    methods = tune_methods(model, draft_model, draft_n_max, only)
    engine = bench_engine(model, ctx_size)
    for m in methods:
        engine.drafters_for(m.spec)  # every drafter loads before anything is measured
    results = run_bench(engine, load_prompts(prompts), methods, list(temperatures), max_tokens, repeats,
                        progress=progress, settings={"methods": ",".join(m.label for m in methods)})
    measured = []
    for m in methods[1:]:
        rows = [s for s in results["summary"] if s["config"] == m.label and s["speedup_median"] is not None]
        if not rows:
            continue
        speedups = {f"{s['category']}@{s['temperature']:g}": round(s["speedup_median"], 4) for s in rows}
        greedy = next((s for s in rows if s["category"] == "all"), rows[0])
        measured.append(Measured(m.label, m.spec.types, speedups, greedy.get("mean_acceptance_length")))
    key = calibration_key(AutoTarget.of_model(model), draft_model)
    calibration = Calibration(key, now(), prompts, max_tokens, tuple(measured))
    path = save_calibration(calibration)
    return Calibration(key, calibration.created, prompts, max_tokens, tuple(measured), str(path)), results
