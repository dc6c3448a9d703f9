"""SpecConfig: what speculation to run, from llama.cpp-style flags or vLLM-style JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

# vLLM --speculative-config "method" -> our spec-type names
VLLM_METHODS = {
    "ngram": "ngram-simple",
    "suffix": "suffix",
    "draft_model": "draft-simple",
    "eagle3": "draft-eagle3",
    "mtp": "draft-mtp",
    "dflash": "draft-dflash",
    "dspark": "draft-dspark",
}
MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
TREE_TYPES = ("draft-mtp", "draft-eagle3")  # drafters that can propose token trees


@dataclass(frozen=True)
class SpecConfig:
    """Frozen speculative settings for an engine or one request.

    types: drafter names tried in order each step (n-gram kinds first, a model
        drafter when they found nothing); () = no speculation.
    draft_n_max: most tokens drafted per step (llama.cpp --spec-draft-n-max, default 3).
    draft_n_min: drafts shorter than this are not verified (0 = any length).
    draft_p_min: a model drafter stops when its top probability drops below this.
    adaptive: choose the draft length (1..draft_n_max) with the most expected tokens per second,
        from recent acceptance and the measured cost of verifying k tokens (engine/cost.py).
    draft_model: path or name of the draft model (draft-simple).
    cross_tokenizer: allow a draft model with another tokenizer (drafts pass through text).
    acceptance: "exact" (lossless) or "typical" (relaxed, lossy, opt-in).
    tree_topk: hidden-state drafters (draft-mtp, draft-eagle3): children per expanded node;
        1 = a chain, more = an EAGLE-2 token tree (SGLang --speculative-eagle-topk).
    tree_budget: most nodes in such a tree (SGLang --speculative-num-draft-tokens minus the
        root); 0 = tree_topk * draft_n_max.
    """

    types: tuple[str, ...] = ()
    draft_n_max: int = 3
    draft_n_min: int = 0
    draft_p_min: float = 0.0
    adaptive: bool = False
    draft_model: str | None = None
    cross_tokenizer: bool = False
    acceptance: str = "exact"
    tree_topk: int = 1
    tree_budget: int = 0

    def __post_init__(self) -> None:
        if self.draft_n_max < 1:
            raise ValueError(f"draft length (--spec-draft-n-max) must be at least 1, got {self.draft_n_max}")
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
        if self.tree_budget < 0:
            raise ValueError(f"--spec-tree-budget must be >= 0, got {self.tree_budget}")
        bases = {t.split(":")[0] for t in self.types}  # the bench adds options: draft-eagle3:topk=2
        if (self.tree_topk > 1 or self.tree_budget) and self.types and not bases & set(TREE_TYPES):
            raise ValueError(f"token trees (--spec-tree-topk/--spec-tree-budget) are drafted by "
                             f"{' and '.join(TREE_TYPES)}; --spec-type is {','.join(self.types)}")
        if len(set(self.types)) != len(self.types):
            raise ValueError(f"--spec-type lists a type twice: {','.join(self.types)}")
        models = [t for t in self.types if t.split(":")[0] in MODEL_TYPES]
        if len(models) > 1:
            raise ValueError(f"only one model drafter at a time; got {', '.join(models)}")
        if "draft-simple" in self.types and not self.draft_model:
            raise ValueError("--spec-type draft-simple needs a draft model (-md/--model-draft)")

    @property
    def enabled(self) -> bool:
        return bool(self.types)

    @property
    def effective_tree_budget(self) -> int:
        return self.tree_budget or self.tree_topk * self.draft_n_max

    @property
    def method(self) -> str:
        return ",".join(self.types) or "none"

    def with_overrides(self, **changes) -> "SpecConfig":
        return replace(self, **changes)


def parse_spec_types(value: str | None) -> tuple[str, ...]:
    from specdec.drafters import registry

    if value is None or value.strip() in ("", "none"):
        return ()
    types = tuple(t.strip() for t in value.split(",") if t.strip())
    if "none" in types:
        raise ValueError("--spec-type 'none' cannot be combined with other types")
    known = set(registry.names()) | set(MODEL_TYPES)
    for t in types:
        if t not in known:
            raise ValueError(f"unknown --spec-type {t!r}; valid types: none, {', '.join(sorted(known))}")
    return types


def spec_config_from_flags(spec_type: str | None = None, model_draft: str | None = None,
                           draft_n_max: int | None = None, draft_n_min: int | None = None,
                           draft_p_min: float | None = None, speculative_config: str | None = None,
                           adaptive: bool = False, cross_tokenizer: bool = False,
                           acceptance: str = "exact", tree_topk: int | None = None,
                           tree_budget: int | None = None) -> tuple[SpecConfig, list[str]]:
    """Merge llama.cpp-style flags and a vLLM-style JSON into one SpecConfig.

    Returns the config and notes for the user (e.g. "draft model given: draft-simple turned on").
    Contradictions are errors, never silently resolved.
    """
    notes: list[str] = []
    types = parse_spec_types(spec_type)
    n_max, n_min, p_min = draft_n_max, draft_n_min, draft_p_min
    if speculative_config:
        try:
            cfg = json.loads(speculative_config)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--speculative-config is not valid JSON: {exc}") from None
        if not isinstance(cfg, dict):
            raise ValueError("--speculative-config must be a JSON object")
        unknown = set(cfg) - {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
                              "draft_p_min", "adaptive", "tree_topk", "tree_budget"}
        if unknown:
            raise ValueError(f"--speculative-config has unknown keys: {', '.join(sorted(unknown))}")
        method = cfg.get("method")
        if method not in VLLM_METHODS:
            raise ValueError(f"--speculative-config method {method!r} is not one of {', '.join(VLLM_METHODS)}")
        vtype = VLLM_METHODS[method]
        if types and types != (vtype,):
            raise ValueError(f"--spec-type {','.join(types)} contradicts --speculative-config method {method!r}")
        types = (vtype,)
        parse_spec_types(vtype)
        if "model" in cfg:
            if model_draft and model_draft != cfg["model"]:
                raise ValueError("--model-draft and --speculative-config 'model' name different draft models")
            model_draft = cfg["model"]
        k = cfg.get("num_speculative_tokens")
        if k is not None:
            if not isinstance(k, int) or isinstance(k, bool):
                raise ValueError("num_speculative_tokens must be an integer")
            if n_max is not None and n_max != k:
                raise ValueError(f"--spec-draft-n-max {n_max} contradicts num_speculative_tokens {k}")
            n_max = k
        p_min = cfg.get("draft_p_min", p_min)
        adaptive = bool(cfg.get("adaptive", adaptive))
        for key, flag, value in (("tree_topk", "--spec-tree-topk", tree_topk),
                                 ("tree_budget", "--spec-tree-budget", tree_budget)):
            if key in cfg:
                if not isinstance(cfg[key], int) or isinstance(cfg[key], bool):
                    raise ValueError(f"{key} must be an integer")
                if value is not None and value != cfg[key]:
                    raise ValueError(f"{flag} {value} contradicts {key} {cfg[key]}")
        tree_topk = cfg.get("tree_topk", tree_topk)
        tree_budget = cfg.get("tree_budget", tree_budget)
    if model_draft and not any(t in MODEL_TYPES for t in types):
        types = types + ("draft-simple",)
        notes.append("a draft model was given without a model --spec-type: draft-simple turned on")
    if model_draft is None and "draft-simple" in types:
        raise ValueError("--spec-type draft-simple needs a draft model (-md/--model-draft)")
    config = SpecConfig(
        types=types, draft_n_max=3 if n_max is None else n_max, draft_n_min=n_min or 0, draft_p_min=p_min or 0.0,
        adaptive=adaptive, draft_model=model_draft, cross_tokenizer=cross_tokenizer, acceptance=acceptance,
        tree_topk=1 if tree_topk is None else tree_topk, tree_budget=tree_budget or 0,
    )
    return config, notes
