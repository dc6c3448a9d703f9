"""The one way into speculation: a SpecRequest says what someone asked, build_spec checks it once and
turns it into the SpecConfig that runs (deciding auto where asked).

Every surface fills the same request:

    SpecRequest.from_flags(spec_type="suffix", draft_n_max=4)         llama.cpp-style flags, and
    SpecRequest.from_flags(speculative_config='{"method": "ngram"}')  vLLM's JSON beside them
    SpecRequest.from_vllm({"method": "mtp", "num_speculative_tokens": 1})
    SpecRequest.from_method("ngram-map-k:min_hits=3+draft-simple", draft_model="small")   bench --methods
    SpecRequest.from_override(enabled=False)                           the server's "speculative" object

    spec, notes = build_spec(request)                       explicit settings
    spec, notes = build_spec(request, AutoTarget.of_model(model))   auto needs the target's files
    spec, notes = build_spec(request, base=served_spec)     a server override: what it leaves out stays

A request keeps how each setting was spelled (`names`), so that an error names the flag, key or field
the user wrote.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from specdec.drafters import registry
from specdec.drafters.describe import block_draft_length, drafter_facts, head_kind
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH, DrafterSpec
from specdec.engine.auto import choose_auto
from specdec.engine.calibration import CalibrationKey, load_calibration
from specdec.engine.config import MAX_DRAFT_LENGTH, SpecConfig
from specdec.model import catalogue
from specdec.model.checkpoint_facts import target_facts
from specdec.model.load import checkpoint_digest

# how each setting is spelled on the command line (messages use these unless the request says otherwise)
FLAG_NAMES = {"drafters": "--spec-type", "draft_model": "-md/--model-draft", "draft_n_max": "--spec-draft-n-max",
              "draft_n_min": "--spec-draft-n-min", "draft_p_min": "--spec-draft-p-min", "adaptive": "--spec-adaptive",
              "cross_tokenizer": "--spec-cross-tokenizer", "typical": "--spec-typical",
              "tree_topk": "--spec-tree-topk", "tree_budget": "--spec-tree-budget"}
# vLLM-style keys (--speculative-config, the server's override) -> request fields
_VLLM_KEYS = {"model": "draft_model", "num_speculative_tokens": "draft_n_max", "draft_p_min": "draft_p_min",
              "adaptive": "adaptive", "tree_topk": "tree_topk", "tree_budget": "tree_budget"}
_VLLM_ONLY = {"method", "prompt_lookup_min", "prompt_lookup_max"}
# options a model drafter takes in a bench method string, and the fields they set
_METHOD_OPTIONS = {"topk": "tree_topk", "budget": "tree_budget", "adaptive": "adaptive"}


@dataclass(frozen=True)
class SpecRequest:
    """What someone asked of speculation, before it is checked. None: not said.

    drafters: the kinds asked for (with their options); () = speculation off.
    auto: --spec-type auto (also what a request that names no drafter and no draft model gets).
    names: (field, how it was spelled) for the settings given, for messages.
    """

    drafters: tuple[DrafterSpec, ...] | None = None
    auto: bool = False
    draft_model: str | None = None
    draft_n_max: int | None = None
    draft_n_min: int | None = None
    draft_p_min: float | None = None
    adaptive: bool | None = None
    cross_tokenizer: bool | None = None
    typical: bool | None = None
    tree_topk: int | None = None
    tree_budget: int | None = None
    names: tuple[tuple[str, str], ...] = ()

    def name(self, field: str) -> str:
        return dict(self.names).get(field, FLAG_NAMES.get(field, field))

    def given(self) -> list[str]:
        """The settings given, other than the drafters and auto, in field order."""
        return [f.name for f in fields(self) if f.name not in ("drafters", "auto", "names")
                and getattr(self, f.name) not in (None, False)]

    @property
    def wants_auto(self) -> bool:
        """--spec-type auto, or nothing said about which drafters run (no type, no draft model)."""
        return self.auto or (self.drafters is None and self.draft_model is None)

    # -- the surfaces ------------------------------------------------------------------------------
    @staticmethod
    def from_flags(spec_type: str | None = None, model_draft: str | None = None, draft_n_max: int | None = None,
                   draft_n_min: int | None = None, draft_p_min: float | None = None,
                   speculative_config: str | None = None, adaptive: bool = False, cross_tokenizer: bool = False,
                   typical: bool = False, tree_topk: int | None = None, tree_budget: int | None = None) -> SpecRequest:
        """llama.cpp-style flags, and vLLM's --speculative-config JSON text beside them (contradictions are errors)."""
        auto, drafters = _parse_spec_type(spec_type)
        flags = SpecRequest(drafters=drafters, auto=auto, draft_model=model_draft, draft_n_max=draft_n_max,
                            draft_n_min=draft_n_min, draft_p_min=draft_p_min, adaptive=adaptive or None,
                            cross_tokenizer=cross_tokenizer or None, typical=typical or None, tree_topk=tree_topk,
                            tree_budget=tree_budget)
        if drafters == () and speculative_config:
            raise ValueError("--spec-type none turns speculation off, so --speculative-config would not be used; drop "
                             "one of them")
        if not speculative_config:
            return flags
        if auto:
            raise ValueError("--spec-type auto contradicts --speculative-config; give one of them")
        try:
            cfg = json.loads(speculative_config)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not valid JSON: {exc}") from None
        given = SpecRequest.from_vllm(cfg)
        if drafters is not None and tuple(d.kind for d in drafters) != tuple(d.kind for d in given.drafters):
            raise ValueError(f"--spec-type {spec_type} contradicts --speculative-config method {cfg['method']!r}")
        return _with_vllm(flags, given)

    @staticmethod
    def from_vllm(cfg: Any, where: str = "--speculative-config") -> SpecRequest:
        """A vLLM-style speculative_config object: method, model, num_speculative_tokens, prompt_lookup_min/max
        (ngram's n-gram orders), and specdec's draft_p_min, adaptive, tree_topk, tree_budget."""
        if not isinstance(cfg, dict):
            raise ValueError(f"{where} must be a JSON object")
        unknown = set(cfg) - set(_VLLM_KEYS) - _VLLM_ONLY
        if unknown:
            raise ValueError(f"{where} has unknown keys: {', '.join(sorted(unknown))}")
        kind = registry.from_vllm(cfg.get("method"))
        values = {"draft_model": _typed(cfg, "model", str, "a string (a model name, file or folder)", where),
                  "draft_n_max": _typed(cfg, "num_speculative_tokens", int, "an integer", where),
                  "draft_p_min": _typed(cfg, "draft_p_min", (int, float), "a number", where),
                  "adaptive": _typed(cfg, "adaptive", bool, "true or false", where),
                  "tree_topk": _typed(cfg, "tree_topk", int, "an integer", where),
                  "tree_budget": _typed(cfg, "tree_budget", int, "an integer", where)}
        low = _typed(cfg, "prompt_lookup_min", int, "an integer", where)
        high = _typed(cfg, "prompt_lookup_max", int, "an integer", where)
        options = {}
        if low is not None or high is not None:
            if registry.from_vllm("ngram") != kind:
                raise ValueError(f"prompt_lookup_min/prompt_lookup_max set the n-gram sizes of method 'ngram'; "
                                 f"the method is {cfg['method']!r}")
            # one given: the other is the same, as vLLM's SpeculativeConfig sets it
            options = {"order_min": high if low is None else low, "order_max": low if high is None else high}
        names = tuple((field, key) for key, field in _VLLM_KEYS.items() if cfg.get(key) is not None)
        return SpecRequest(drafters=(DrafterSpec.of(kind, **options),), names=(("drafters", "method"),) + names,
                           **values)

    @staticmethod
    def from_method(text: str, draft_model: str | None = None, draft_n_max: int | None = None) -> SpecRequest:
        """A bench --methods entry: kinds joined by '+', options after ':' (a model drafter's: topk, budget,
        adaptive), or 'auto'. draft_model / draft_n_max: the bench's --draft-model and --spec-draft-n-max."""
        text = text.strip()
        if text == "auto":
            return SpecRequest(auto=True, draft_model=draft_model, draft_n_max=draft_n_max)
        drafters, settings = [], {}
        for part in text.split("+"):
            d = DrafterSpec.parse(part)
            try:
                e = registry.entry(d.kind)
            except ValueError:
                raise ValueError(f"unknown method {d.kind!r} in --methods; valid: none, auto, "
                                 f"{', '.join(registry.kinds())}") from None
            if e.model:
                allowed = {"adaptive"} | ({"topk", "budget"} if e.trees else set())
                if set(dict(d.options)) - allowed:
                    raise ValueError(f"{e.kind} takes the options {', '.join(sorted(allowed))} in --methods (got "
                                     f"{part!r})")
                settings.update({_METHOD_OPTIONS[k]: (bool(v) if k == "adaptive" else v) for k, v in d.options})
                d = DrafterSpec(d.kind)
            else:  # a bad option is an error before the model loads, not after the baseline
                registry.check_options(d)
            drafters.append(d)
        uses_model = next((d.kind for d in drafters if registry.entry(d.kind).draft_model), None)
        if uses_model and draft_model is None:
            raise ValueError(f"method {uses_model} needs --draft-model")
        return SpecRequest(drafters=tuple(drafters), draft_model=draft_model if uses_model else None,
                           draft_n_max=draft_n_max, names=(("draft_model", "--draft-model"),), **settings)

    @staticmethod
    def from_override(enabled: bool | None = None, method: str | None = None, spec_type: str | None = None,
                      num_speculative_tokens: int | None = None, draft_n_min: int | None = None,
                      draft_p_min: float | None = None, adaptive: bool | None = None,
                      model: str | None = None) -> SpecRequest:
        """The server's per-request "speculative" object (vLLM method names or llama.cpp spec_type names); what it
        leaves out is the served setting (build_spec's base)."""
        names = (("draft_n_max", "num_speculative_tokens"), ("draft_model", "model"), ("draft_n_min", "draft_n_min"),
                 ("draft_p_min", "draft_p_min"), ("adaptive", "adaptive"))
        if enabled is False:
            if method is not None or spec_type is not None:
                raise ValueError(f"speculative.enabled is false, so {'method' if method else 'spec_type'} would not "
                                 "be used; send one of them")
            drafters, names = (), names + (("drafters", "speculative.enabled false"),)
        elif method is not None:
            if spec_type is not None:
                raise ValueError("give method (vLLM names) or spec_type (llama.cpp names), not both")
            drafters, names = (DrafterSpec(registry.from_vllm(method)),), names + (("drafters", "method"),)
        else:
            auto, drafters = _parse_spec_type(spec_type, "spec_type")
            if auto:
                raise ValueError("spec_type auto is decided when the server starts; leave spec_type out to get that")
            names += (("drafters", "spec_type"),)
        return SpecRequest(drafters=drafters, draft_model=model, draft_n_max=num_speculative_tokens,
                           draft_n_min=draft_n_min, draft_p_min=draft_p_min, adaptive=adaptive, names=names)


@dataclass(frozen=True)
class AutoTarget:
    """What auto reads about the target: its files (no weights built) and where it runs.

    checkpoint, tokenizer: opened (model/load.open_checkpoint) or a loaded Model's; path: its file or folder
    (an MTP head saved beside it counts); weights_format: in memory; hardware: "cpu" or "cuda".
    """

    checkpoint: Any
    tokenizer: Any
    path: Any
    name: str
    weights_format: str
    hardware: str = "cpu"
    sha256: str | None = None  # the file's digest when known (a loaded model's)

    @staticmethod
    def of_model(model) -> AutoTarget:
        return AutoTarget(model.checkpoint, model.tokenizer, model.info.path, model.info.name,
                          model.info.weights_dtype, model.info.device.split(":")[0], model.info.sha256)

    def digest(self) -> str:
        return self.sha256 or checkpoint_digest(self.path)


def build_spec(request: SpecRequest, target: AutoTarget | None = None,
               base: SpecConfig | None = None) -> tuple[SpecConfig, list[str]]:
    """The SpecConfig a request runs, and notes for people (auto's reasons included). Every rule is here once.

    target: needed when the request asks for auto. base: the served SpecConfig a server override changes
    (settings the request leaves out keep base's; drafters left out keep base's drafters and draft model).
    """
    if request.drafters == ():  # speculation off: nothing else may be said
        said = request.given()
        if said:
            raise ValueError(f"{_off(request)} turns speculation off, so {request.name(said[0])} would not be used; "
                             "drop one of them")
        return (SpecConfig() if base is None else replace(base, drafters=())), []
    if base is not None and request.drafters is None:
        return _tuned(base, request), []
    if request.wants_auto and base is None:
        return _auto(request, target)
    notes: list[str] = []
    drafters = request.drafters or ()
    kinds = [d.kind for d in drafters]
    draft_model = request.draft_model
    if draft_model and not any(registry.entry(k).model for k in kinds):
        kind = head_kind(draft_model) or registry.with_flag("draft_model")[0]
        drafters += (DrafterSpec(kind),)
        what = "a draft model" if registry.entry(kind).draft_model else "an MTP/EAGLE-3/DFlash/DSpark head folder"
        notes.append(f"{what} was given without a model --spec-type: {kind} turned on")
    kinds = [d.kind for d in drafters]
    model_kind = next((k for k in kinds if registry.entry(k).model), None)
    if model_kind and registry.entry(model_kind).head == "mtp" and draft_model and head_kind(draft_model) != model_kind:
        raise ValueError(f"--spec-type {model_kind} with -md {draft_model}: that is not an MTP head folder (what "
                         "`specdec train mtp --out` writes). Without -md draft-mtp reads the model's own MTP "
                         "layers, a head beside the model or one shipped with specdec; to draft with a smaller "
                         "model use --spec-type draft-simple")
    draft_n_max = request.draft_n_max
    if draft_n_max is None and draft_model and model_kind and registry.entry(model_kind).block:
        draft_n_max, note = _block_length(draft_model)
        notes += [note] if note else []
    # what a server override leaves out of a new method is the default, but for how drafts are accepted and
    # (for a draft model) the served --spec-cross-tokenizer
    draft_model_kind = any(registry.entry(k).draft_model for k in kinds)
    served = None if base is None else SpecConfig(cross_tokenizer=base.cross_tokenizer and draft_model_kind,
                                                  acceptance=base.acceptance)
    return _config(request, drafters, draft_model, draft_n_max, served), notes


def _auto(request: SpecRequest, target: AutoTarget | None) -> tuple[SpecConfig, list[str]]:
    """auto: the target's and the given drafter's facts, and what `specdec tune` measured for them here ->
    engine/auto.choose_auto -> the user's settings on top."""
    if target is None:
        raise ValueError("auto reads the target model's files to choose; name a --spec-type")
    facts = target_facts(target.checkpoint, target.path, target.name, target.weights_format)
    draft = (drafter_facts(request.draft_model, target.checkpoint, target.tokenizer, target.name)
             if request.draft_model else None)
    calibration = load_calibration(calibration_key(target, request.draft_model))
    n_max = DEFAULT_DRAFT_LENGTH if request.draft_n_max is None else request.draft_n_max
    spec, reasons = choose_auto(facts, draft, draft_n_max=n_max, calibration=calibration)
    if request.draft_n_max is None and spec.model_kind and registry.entry(spec.model_kind).block:
        block, note = _block_length(spec.draft_model)  # as an explicit --spec-type runs it
        if block is not None:
            spec, reasons = choose_auto(facts, draft, draft_n_max=block, calibration=calibration)
            reasons.append(note)
    try:
        tuned = _config(request, spec.drafters, spec.draft_model, spec.draft_n_max, spec, adaptive=spec.adaptive)
    except ValueError as exc:  # a setting for a drafter auto did not choose
        raise ValueError(f"auto chose {spec.method}: {exc}") from None
    return tuned, [f"auto: {r}" for r in reasons]


def calibration_key(target: AutoTarget, draft_model: str | None) -> CalibrationKey:
    """What a calibration of this target and drafter on this machine, at this process's threads, is saved under."""
    draft_digest = checkpoint_digest(catalogue.resolve(draft_model, auto_pull=False)) if draft_model else None
    return CalibrationKey(target.digest(), target.weights_format, torch.get_num_threads(), target.hardware,
                          draft_digest)


def _tuned(base: SpecConfig, request: SpecRequest) -> SpecConfig:
    """base with the request's settings on top (a server override that names no drafter)."""
    return _config(request, base.drafters, request.draft_model or base.draft_model, request.draft_n_max, base)


def _config(request: SpecRequest, drafters, draft_model, draft_n_max, base: SpecConfig | None,
            adaptive: bool = False) -> SpecConfig:
    """The SpecConfig of these drafters with the request's settings, else base's, else the defaults."""
    def pick(value, field, default):
        return value if value is not None else getattr(base, field) if base is not None else default

    return SpecConfig(
        drafters=tuple(drafters), draft_model=draft_model,
        draft_n_max=pick(draft_n_max, "draft_n_max", DEFAULT_DRAFT_LENGTH),
        draft_n_min=pick(request.draft_n_min, "draft_n_min", 0), draft_p_min=pick(request.draft_p_min, "draft_p_min", 0.0),
        adaptive=adaptive or pick(request.adaptive, "adaptive", False),
        cross_tokenizer=pick(request.cross_tokenizer, "cross_tokenizer", False),
        acceptance=("typical" if request.typical else "exact") if request.typical is not None
        else base.acceptance if base is not None else "exact",
        tree_topk=pick(request.tree_topk, "tree_topk", 1), tree_budget=pick(request.tree_budget, "tree_budget", 0))


def _block_length(folder: str) -> tuple[int | None, str | None]:
    """The draft length that uses all of a DFlash / DSpark folder's block (one drafter pass gives the whole
    block), and a note saying so; (None, None) where the folder does not say."""
    block = block_draft_length(folder)
    if block is None:
        return None, None
    n_max = min(block, MAX_DRAFT_LENGTH)
    return n_max, (f"draft length {n_max}: the drafts of one {head_kind(folder)} block (--spec-draft-n-max "
                   "sets another)")


def _parse_spec_type(value: str | None, name: str = "--spec-type") -> tuple[bool, tuple[DrafterSpec, ...] | None]:
    """(auto, drafters): 'ngram-simple,suffix' -> (False, its kinds); 'none' -> (False, ()); 'auto' -> (True,
    None); None (not given) -> (False, None)."""
    if value is None:
        return False, None
    types = tuple(t.strip() for t in value.split(",") if t.strip())
    if not types:
        raise ValueError(f"{name} {value!r} names no type; give none, auto or a comma list of "
                         f"{', '.join(registry.kinds())}")
    for special in ("none", "auto"):
        if special in types and len(types) > 1:
            raise ValueError(f"{name} {special!r} cannot be combined with other types")
    if types == ("none",):
        return False, ()
    if types == ("auto",):
        return True, None
    for t in types:
        if t not in registry.kinds():
            raise ValueError(f"unknown {name} {t!r}; valid types: none, {', '.join(registry.kinds())}")
    return False, tuple(DrafterSpec(t) for t in types)


def _with_vllm(flags: SpecRequest, given: SpecRequest) -> SpecRequest:
    """Flags and --speculative-config together: a setting both give must agree (draft_p_min and adaptive: the
    JSON's wins, as the more specific)."""
    if flags.draft_model and given.draft_model and flags.draft_model != given.draft_model:
        raise ValueError("--model-draft and --speculative-config 'model' name different draft models")
    for field in ("draft_n_max", "tree_topk", "tree_budget"):
        mine, theirs = getattr(flags, field), getattr(given, field)
        if mine is not None and theirs is not None and mine != theirs:
            raise ValueError(f"{flags.name(field)} {mine} contradicts {given.name(field)} {theirs}")
    merged = {f.name: getattr(given, f.name) if getattr(given, f.name) is not None else getattr(flags, f.name)
              for f in fields(SpecRequest) if f.name not in ("auto", "names")}
    return SpecRequest(**merged, names=given.names)


def _typed(cfg: dict, key: str, kind, what: str, where: str):
    """cfg[key] (None when absent or null) if it is a `kind` (JSON true/false is no number here), else an error."""
    value = cfg.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        raise ValueError(f"{where} {key} must be {what}, got {json.dumps(value)}")
    return value


def _off(request: SpecRequest) -> str:
    spelled = request.name("drafters")
    return spelled if spelled != "--spec-type" else "--spec-type none"
