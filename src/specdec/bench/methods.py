"""What `specdec bench` measures: --methods parsed into SpecConfigs, and the engine it runs them on.

Method syntax (comma list): a spec type (suffix), several tried together (ngram-simple+suffix),
drafter options after colons (ngram-map-k:min_hits=1000:key_size=4; for model drafters
topk, budget and adaptive), "none" (the baseline), and "auto".

Drafter state: model-free drafters that remember earlier requests (suffix's global tree,
ngram-cache's dynamic tier) would see every prompt again on each repeat and draft the
previous answer verbatim; the bench gives each run a fresh drafter unless asked to keep it.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.drafters import registry
from specdec.drafters.base import DrafterBase
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH, DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.engine.spec_request import AutoTarget, SpecRequest, build_spec
from specdec.sampling import SamplingParams

BASELINE = "none"


# -- methods -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Method:
    """One configuration to measure: a label and the SpecConfig it runs."""

    label: str
    spec: SpecConfig
    base: str = ""  # the --methods entry it came from (sweep points share it)
    reasons: tuple[str, ...] = ()  # auto's reasons


def parse_methods(text: str, draft_model: str | None = None, draft_n_max: int = DEFAULT_DRAFT_LENGTH, model=None,
                  draft_lengths: list[int] | None = None) -> list[Method]:
    """Methods from --methods; the baseline 'none' is always first. `model` is needed for 'auto'.
    Each entry is read by SpecRequest.from_method and checked by build_spec, as every other surface is."""
    methods: list[Method] = []
    for entry in [e.strip() for e in text.split(",") if e.strip()]:
        if entry == BASELINE:
            continue
        request = SpecRequest.from_method(entry, draft_model, draft_n_max)
        if request.auto:
            if model is None:
                raise ValueError("method 'auto' needs the target model")
            spec, reasons = build_spec(request, AutoTarget.of_model(model))
            methods.append(Method(f"auto ({spec.method})", spec, "auto", tuple(reasons)))
            continue
        spec, _notes = build_spec(request)
        methods.append(Method(entry, spec, entry))
    if len({m.label for m in methods}) != len(methods):
        raise ValueError(f"--methods lists a method twice: {text}")
    out = [Method(BASELINE, SpecConfig(), BASELINE)] + methods
    for k in draft_lengths or []:
        for m in methods:
            if k != m.spec.draft_n_max and m.spec.enabled:
                out.append(Method(f"{m.label} k={k}", m.spec.with_overrides(draft_n_max=k), m.base, m.reasons))
    return out


# -- drafters: fresh state per run ---------------------------------------------------------------
class FreshEachRequest(DrafterBase):
    """A model-free drafter rebuilt at every begin(), so no run learns from an earlier one."""

    def __init__(self, make):
        self.make = make
        self.inner = make()
        self.name = self.inner.name

    def begin(self, prompt, sampling=SamplingParams(), generator=None):
        self.inner = self.make()
        self.inner.begin(prompt, sampling, generator)

    def propose(self, context, draft_length):
        return self.inner.propose(context, draft_length)

    def on_accept(self, num_accepted):
        self.inner.on_accept(num_accepted)

    def end(self, output):
        self.inner.end(output)


class BenchEngine(Engine):
    """The engine the bench measures: model-free drafters start fresh at every run unless
    `fresh_drafters` is False. Model drafters are built as usual (their begin() already forgets
    the previous request, and rebuilding them would reallocate their KV cache)."""

    def __init__(self, model, max_len: int = 4096, fresh_drafters: bool = True):
        super().__init__(model, SpecConfig(), max_len=max_len)
        self.fresh_drafters = fresh_drafters

    def build_drafter(self, drafter: DrafterSpec, spec: SpecConfig):
        if not self.fresh_drafters or registry.entry(drafter.kind).model:
            return super().build_drafter(drafter, spec)
        return FreshEachRequest(lambda: super(BenchEngine, self).build_drafter(drafter, spec))


def bench_engine(model, ctx_size: int = 4096, fresh_drafters: bool = True) -> BenchEngine:
    return BenchEngine(model, ctx_size, fresh_drafters)
