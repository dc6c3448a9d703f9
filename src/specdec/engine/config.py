"""SpecConfig: the speculation that runs, every setting checked against the others when it is made.
What people ask for (flags, JSON, a bench method, a server override) becomes one through
engine/spec_request.build_spec.

    SpecConfig(drafters=("ngram-simple",), draft_n_max=4)
    SpecConfig(drafters=(DrafterSpec.of("ngram-map-k", min_hits=3), "draft-simple"), draft_model="small")
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specdec.drafters import registry
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH, DrafterSpec
from specdec.sampling import is_whole

# Bounds that keep a setting meaningful: a verify pass of more rows than this costs more than it can
# return on any hardware specdec runs on, and adaptive mode measures every length up to the maximum.
MAX_DRAFT_LENGTH = 32
MAX_TREE_NODES = 64


@dataclass(frozen=True)
class SpecConfig:
    """Frozen speculative settings for an engine or one request.

    drafters: the drafters to try each step; plain kind names are accepted and turned into
        DrafterSpecs. They are kept in the order the engine tries them: the grammar drafter first, then
        model-free kinds (in the order given), the one model drafter last, when they found nothing. () = none.
    draft_n_max: most tokens drafted per step (llama.cpp --spec-draft-n-max, default 3).
    draft_n_min: drafts shorter than this are not verified (0 = any length); a sampled draft of a model
        drafter is verified whatever its length (Engine._propose says why).
    draft_p_min: a model drafter stops when its top probability drops below this.
    adaptive: choose the draft length (0..draft_n_max) with the most expected tokens per second,
        from recent acceptance and the measured cost of verifying k tokens (engine/cost.py); at 0
        (no length pays) drafting pauses, with a 1-token probe after PROBE_EVERY steps, the wait doubling
        after each rejected probe up to MAX_PROBE_EVERY (engine/draft_length.py).
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
        # the grammar's forced tokens first, then the n-gram kinds, the model drafter when they found nothing
        # (stable otherwise)
        specs = tuple(sorted(specs, key=lambda s: (not registry.entry(s.kind).first, registry.entry(s.kind).model)))
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
            raise ValueError(f"token trees (--spec-tree-topk/--spec-tree-budget) are drafted by "
                             f"{' and '.join(registry.with_flag('trees'))}; {self.method} drafts none; name the "
                             "drafter with --spec-type")
        if self.acceptance == "typical" and self.tree_topk > 1:
            raise ValueError("typical acceptance (--spec-typical) verifies chains; drop --spec-tree-topk")
        for e in entries:
            if e.draft_model and not self.draft_model:
                raise ValueError(f"--spec-type {e.kind} needs a draft model (-md/--model-draft)")
        if self.draft_p_min and specs and not models:
            raise ValueError(f"--spec-draft-p-min (draft_p_min) is where a model drafter stops drafting for want of "
                             f"confidence; {self.method} drafts without one, so it would do nothing")
        if self.cross_tokenizer and specs and not any(e.draft_model for e in entries):
            raise ValueError(f"--spec-cross-tokenizer lets {' and '.join(registry.with_flag('draft_model'))}'s draft "
                             f"model have another tokenizer; {self.method} has no draft model of that kind, so it "
                             "would do nothing")

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
