"""SpecConfig: what speculation to run; SpecFlags: what the user said (llama.cpp-style flags,
vLLM-style JSON), before auto; `spec_config_from_flags` turns explicit flags into a SpecConfig.

    SpecConfig(drafters=("ngram-simple",), draft_n_max=4)
    SpecConfig(drafters=(DrafterSpec.of("ngram-map-k", min_hits=3), "draft-simple"), draft_model="small")
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from specdec.drafters import registry
from specdec.drafters.describe import BLOCK_KINDS, block_draft_length, head_kind
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH, DrafterSpec
from specdec.sampling import is_whole

# Bounds that keep a setting meaningful: a verify pass of more rows than this costs more than it can
# return on any hardware specdec runs on, and adaptive mode measures every length up to the maximum.
MAX_DRAFT_LENGTH = 32
MAX_TREE_NODES = 64

_JSON_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "draft_p_min",
              "adaptive", "tree_topk", "tree_budget"}


@dataclass(frozen=True)
class SpecConfig:
    """Frozen speculative settings for an engine or one request.

    drafters: the drafters to try each step; plain kind names are accepted and turned into
        DrafterSpecs. They are kept in the order the engine tries them: model-free kinds first
        (in the order given), the one model drafter last, when they found nothing. () = none.
    draft_n_max: most tokens drafted per step (llama.cpp --spec-draft-n-max, default 3).
    draft_n_min: drafts shorter than this are not verified (0 = any length); a sampled draft of a model
        drafter is verified whatever its length (Engine._propose says why).
    draft_p_min: a model drafter stops when its top probability drops below this.
    adaptive: choose the draft length (0..draft_n_max) with the most expected tokens per second,
        from recent acceptance and the measured cost of verifying k tokens (engine/cost.py); at 0
        (no length pays) drafting pauses, with a 1-token probe after PROBE_EVERY steps, the wait doubling
        after each rejected probe up to MAX_PROBE_EVERY (engine.py).
    draft_model: path or name of the draft model (draft-simple) or head folder (draft-eagle3,
        draft-dflash, draft-dspark).
    cross_tokenizer: allow a draft model with another tokenizer (drafts pass through text).
    acceptance: "exact" (lossless) or "typical" (relaxed, lossy, opt-in; chains only).
    tree_topk: tree-drafting kinds (draft-mtp, draft-eagle3): children per expanded node;
        1 = a chain, more = an EAGLE-2 token tree (SGLang --speculative-eagle-topk).
    tree_budget: most nodes in such a tree (SGLang --speculative-num-draft-tokens minus the
        root); 0 = tree_topk * draft_n_max.
    """

    drafters: tuple[DrafterSpec, ...] = ()
    draft_n_max: int = DEFAULT_DRAFT_LENGTH
    draft_n_min: int = 0
    draft_p_min: float = 0.0
    adaptive: bool = False
    draft_model: str | None = None
    cross_tokenizer: bool = False
    acceptance: str = "exact"
    tree_topk: int = 1
    tree_budget: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.drafters, str):  # its characters read as kinds: "lists a type twice: n,g,r,a,m"
            raise TypeError(f"drafters must be a tuple of kinds, e.g. ({self.drafters!r},)")
        for name in ("draft_n_max", "draft_n_min", "tree_topk", "tree_budget"):
            value = getattr(self, name)
            if not is_whole(value):
                raise TypeError(f"{name} must be a whole number, got {value!r}")
        for name in ("adaptive", "cross_tokenizer"):
            if not isinstance(getattr(self, name), bool):  # "no" was true
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        specs = tuple(DrafterSpec(d) if isinstance(d, str) else d for d in self.drafters)
        kinds = [s.kind for s in specs]
        if len(set(kinds)) != len(kinds):
            raise ValueError(f"--spec-type lists a type twice: {','.join(kinds)}")
        entries = [registry.entry(k) for k in kinds]  # unknown kinds: a clear error
        models = [e.kind for e in entries if e.model]
        if len(models) > 1:
            raise ValueError(f"only one model drafter at a time; got {', '.join(models)}")
        # n-gram kinds first, the model drafter when they found nothing (stable otherwise)
        specs = tuple(sorted(specs, key=lambda s: registry.entry(s.kind).model))
        object.__setattr__(self, "drafters", specs)
        if not 1 <= self.draft_n_max <= MAX_DRAFT_LENGTH:
            raise ValueError(f"draft length (--spec-draft-n-max, num_speculative_tokens) must be between 1 and "
                             f"{MAX_DRAFT_LENGTH}, got {self.draft_n_max}")
        if self.draft_n_min < 0:
            raise ValueError(f"--spec-draft-n-min must be >= 0, got {self.draft_n_min}")
        if self.draft_n_min > self.draft_n_max:
            raise ValueError(f"--spec-draft-n-min ({self.draft_n_min}) is larger than --spec-draft-n-max "
                             f"({self.draft_n_max})")
        if not 0.0 <= self.draft_p_min < 1.0:
            raise ValueError(f"--spec-draft-p-min must be in [0, 1), got {self.draft_p_min}")
        if self.acceptance not in ("exact", "typical"):
            raise ValueError(f"acceptance must be 'exact' or 'typical', got {self.acceptance!r}")
        if self.tree_topk < 1:
            raise ValueError(f"--spec-tree-topk must be at least 1, got {self.tree_topk}")
        if not 0 <= self.tree_budget <= MAX_TREE_NODES or self.effective_tree_budget > MAX_TREE_NODES:
            raise ValueError(f"a draft tree holds at most {MAX_TREE_NODES} nodes (--spec-tree-budget, or topk x draft "
                             f"length when it is 0), got {self.effective_tree_budget}")
        if self.has_tree_settings and specs and not any(e.trees for e in entries):
            tree_kinds = " and ".join(e.kind for e in registry.entries() if e.trees)
            raise ValueError(f"token trees (--spec-tree-topk/--spec-tree-budget) are drafted by {tree_kinds}; "
                             f"--spec-type is {self.method}")
        if self.acceptance == "typical" and self.tree_topk > 1:
            raise ValueError("typical acceptance (--spec-typical) verifies chains; drop --spec-tree-topk")
        if "draft-simple" in kinds and not self.draft_model:
            raise ValueError("--spec-type draft-simple needs a draft model (-md/--model-draft)")

    @property
    def types(self) -> tuple[str, ...]:
        """The drafter kinds, in the order they are tried."""
        return tuple(s.kind for s in self.drafters)

    @property
    def enabled(self) -> bool:
        return bool(self.drafters)

    @property
    def has_tree_settings(self) -> bool:
        return self.tree_topk > 1 or self.tree_budget > 0

    @property
    def effective_tree_budget(self) -> int:
        return self.tree_budget or self.tree_topk * self.draft_n_max

    @property
    def model_kind(self) -> str | None:
        """The model drafter's kind, or None when only model-free kinds run."""
        return next((k for k in self.types if registry.entry(k).model), None)

    @property
    def method(self) -> str:
        """The drafters as people read them: 'suffix,draft-simple', 'ngram-map-k:min_hits=3', 'none'."""
        return ",".join(s.label() for s in self.drafters) or "none"

    def with_overrides(self, **changes) -> "SpecConfig":
        return replace(self, **changes)


@dataclass(frozen=True)
class SpecFlags:
    """The speculative settings a user gave (CLI flags or the same fields from elsewhere), before
    auto resolves them. None = not given. `engine/auto.decide_spec` turns them into a SpecConfig."""

    spec_type: str | None = None
    model_draft: str | None = None
    draft_n_max: int | None = None
    draft_n_min: int | None = None
    draft_p_min: float | None = None
    speculative_config: str | None = None
    adaptive: bool = False
    cross_tokenizer: bool = False
    typical: bool = False
    tree_topk: int | None = None
    tree_budget: int | None = None

    @property
    def auto(self) -> bool:
        """True for --spec-type auto, and when the user said nothing about speculation at all."""
        if self.spec_type is not None:
            types = [t.strip() for t in self.spec_type.split(",")]
            if "auto" in types and len(types) > 1:
                raise ValueError("--spec-type auto cannot be combined with other types")
            if types == ["auto"] and self.speculative_config:
                raise ValueError("--spec-type auto contradicts --speculative-config; give one of them")
            return types == ["auto"]
        return self.model_draft is None and not self.speculative_config


def parse_spec_types(value: str | None) -> tuple[str, ...]:
    """'ngram-simple,suffix' -> ('ngram-simple', 'suffix'); 'none' or None (not given) -> ()."""
    if value is None or value.strip() == "none":
        return ()
    types = tuple(t.strip() for t in value.split(",") if t.strip())
    if not types:
        raise ValueError(f"--spec-type {value!r} names no type; give none, auto or a comma list of "
                         f"{', '.join(registry.kinds())}")
    if "none" in types:
        raise ValueError("--spec-type 'none' cannot be combined with other types")
    for t in types:
        if t not in registry.kinds():
            raise ValueError(f"unknown --spec-type {t!r}; valid types: none, {', '.join(registry.kinds())}")
    return types


def _json_typed(cfg: dict, key: str, kind: type, what: str):
    """cfg[key] (None when absent) if it is a `kind` (JSON true/false is no number here), else a ValueError."""
    value = cfg.get(key)
    if value is not None and (not isinstance(value, kind) or (kind is not bool and isinstance(value, bool))):
        raise ValueError(f"--speculative-config {key} must be {what}, got {json.dumps(value)}")
    return value


def _json_int(cfg: dict, key: str) -> int | None:
    return _json_typed(cfg, key, int, "an integer")


def block_draft_n_max(model_draft: str) -> tuple[int | None, str | None]:
    """The draft length that uses all of a DFlash / DSpark folder's block (one drafter pass gives the whole
    block), and a note saying so; (None, None) where the folder does not say."""
    block = block_draft_length(model_draft)
    if block is None:
        return None, None
    n_max = min(block, MAX_DRAFT_LENGTH)
    return n_max, (f"draft length {n_max}: the drafts of one {head_kind(model_draft)} block (--spec-draft-n-max "
                   "sets another)")


def spec_config_from_flags(flags: SpecFlags) -> tuple[SpecConfig, list[str]]:
    """Merge llama.cpp-style flags and a vLLM-style JSON into one SpecConfig (auto excluded).

    Returns the config and notes for the user (e.g. "draft model given: draft-simple turned on").
    Contradictions are errors, never silently resolved.
    """
    notes: list[str] = []
    types = parse_spec_types(flags.spec_type)
    if flags.spec_type is not None and not types:  # an explicit none
        for given, what in ((flags.model_draft, "-md/--model-draft"),
                            (flags.speculative_config, "--speculative-config"),
                            (flags.draft_n_max is not None, "--spec-draft-n-max"),
                            (flags.draft_n_min is not None, "--spec-draft-n-min"),
                            (flags.draft_p_min is not None, "--spec-draft-p-min"), (flags.adaptive, "--spec-adaptive"),
                            (flags.tree_topk is not None, "--spec-tree-topk"),
                            (flags.tree_budget is not None, "--spec-tree-budget"), (flags.typical, "--spec-typical"),
                            (flags.cross_tokenizer, "--spec-cross-tokenizer")):
            if given:
                raise ValueError(f"--spec-type none turns speculation off, so {what} would not be used; drop one "
                                 "of them")
    model_draft = flags.model_draft
    n_max, p_min, adaptive = flags.draft_n_max, flags.draft_p_min, flags.adaptive
    tree_topk, tree_budget = flags.tree_topk, flags.tree_budget
    options: dict[str, dict] = {}
    if flags.speculative_config:
        try:
            cfg = json.loads(flags.speculative_config)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not valid JSON: {exc}") from None
        if not isinstance(cfg, dict):
            raise ValueError("--speculative-config must be a JSON object")
        unknown = set(cfg) - _JSON_KEYS
        if unknown:
            raise ValueError(f"--speculative-config has unknown keys: {', '.join(sorted(unknown))}")
        kind = registry.from_vllm(cfg.get("method"))
        if types and types != (kind,):
            raise ValueError(f"--spec-type {','.join(types)} contradicts --speculative-config method "
                             f"{cfg['method']!r}")
        types = (kind,)
        if _json_typed(cfg, "model", str, "a string (a model name, file or folder)") is not None:
            if model_draft and model_draft != cfg["model"]:
                raise ValueError("--model-draft and --speculative-config 'model' name different draft models")
            model_draft = cfg["model"]
        k = _json_int(cfg, "num_speculative_tokens")
        if k is not None:
            if n_max is not None and n_max != k:
                raise ValueError(f"--spec-draft-n-max {n_max} contradicts num_speculative_tokens {k}")
            n_max = k
        low, high = _json_int(cfg, "prompt_lookup_min"), _json_int(cfg, "prompt_lookup_max")
        if low is not None or high is not None:
            if kind != "ngram-simple":
                raise ValueError(f"prompt_lookup_min/prompt_lookup_max set the n-gram sizes of method 'ngram'; "
                                 f"the method is {cfg['method']!r}")
            # one given: the other is the same, as vLLM's SpeculativeConfig sets it
            options[kind] = {"order_min": high if low is None else low, "order_max": low if high is None else high}
        given_p_min = _json_typed(cfg, "draft_p_min", (int, float), "a number")
        p_min = p_min if given_p_min is None else given_p_min
        given_adaptive = _json_typed(cfg, "adaptive", bool, "true or false")
        adaptive = adaptive if given_adaptive is None else given_adaptive
        given_topk, given_budget = _json_int(cfg, "tree_topk"), _json_int(cfg, "tree_budget")
        for key, flag, value, given in (("tree_topk", "--spec-tree-topk", tree_topk, given_topk),
                                        ("tree_budget", "--spec-tree-budget", tree_budget, given_budget)):
            if given is not None and value is not None and value != given:
                raise ValueError(f"{flag} {value} contradicts {key} {given}")
        # null is the flag's value (or the default), as for every other key
        tree_topk = tree_topk if given_topk is None else given_topk
        tree_budget = tree_budget if given_budget is None else given_budget
    if model_draft and not any(registry.entry(t).model for t in types):
        kind = head_kind(model_draft) or "draft-simple"
        types = types + (kind,)
        what = "an MTP/EAGLE-3/DFlash/DSpark head folder" if kind != "draft-simple" else "a draft model"
        notes.append(f"{what} was given without a model --spec-type: {kind} turned on")
    if model_draft is None and "draft-simple" in types:
        raise ValueError("--spec-type draft-simple needs a draft model (-md/--model-draft)")
    if p_min and types and not any(registry.entry(t).model for t in types):
        raise ValueError(f"--spec-draft-p-min (draft_p_min) is where a model drafter stops drafting for want of "
                         f"confidence; {','.join(types)} drafts without one, so it would do nothing")
    if flags.cross_tokenizer and types and "draft-simple" not in types:
        raise ValueError(f"--spec-cross-tokenizer lets draft-simple's draft model have another tokenizer; "
                         f"{','.join(types)} has no draft model of that kind, so it would do nothing")
    if model_draft and "draft-mtp" in types and head_kind(model_draft) != "draft-mtp":
        raise ValueError(f"--spec-type draft-mtp with -md {model_draft}: that is not an MTP head folder (what "
                         "`specdec train mtp --out` writes). Without -md draft-mtp reads the model's own MTP "
                         "layers, a head beside the model or one shipped with specdec; to draft with a smaller "
                         "model use --spec-type draft-simple")
    if n_max is None and model_draft and any(t in BLOCK_KINDS for t in types):
        n_max, note = block_draft_n_max(model_draft)
        notes += [note] if note else []
    config = SpecConfig(
        drafters=tuple(DrafterSpec.of(t, **options.get(t, {})) for t in types),
        draft_n_max=DEFAULT_DRAFT_LENGTH if n_max is None else n_max, draft_n_min=flags.draft_n_min or 0,
        draft_p_min=p_min or 0.0, adaptive=adaptive, draft_model=model_draft, cross_tokenizer=flags.cross_tokenizer,
        acceptance="typical" if flags.typical else "exact", tree_topk=1 if tree_topk is None else tree_topk,
        tree_budget=tree_budget or 0,
    )
    return config, notes
