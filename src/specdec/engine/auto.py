"""--spec-type auto: pick the speculative methods for a model from measured facts.

The rule (DESIGN.md, "Which to use, when nothing is said"), each step kept only when this
build can run it and the facts table does not say it slows decoding on this hardware:

    1. the model carries MTP layers (weights present)            -> draft-mtp
    2. an EAGLE-3 / DFlash / DSpark drafter for it is given       -> that drafter
    3. a same-tokenizer draft model is given                      -> draft-simple
    4. always                                                     -> + the model-free drafter(s)
                                                                     (tried first each step)

`choose_auto` is a pure function of what is known about the target and the drafter; the
I/O (opening the drafter's files) happens in `drafter_facts` and `resolve_auto`.

    >>> spec, reasons = choose_auto(TargetFacts("m", weights_format="int8"))
    >>> spec.types
    ('suffix',)

The facts table (FACTS) records, per method, hardware and in-memory weight format, whether
the method was measured faster or slower than plain decoding, and the evidence. Update it from
`specdec bench` results (its report has an "auto" section that says whether auto's choice was
no slower than plain decoding in every prompt category, and a "Facts for engine/auto.py" table
with a suggested row per method); a row whose verdict is "slower" keeps auto from picking that
method there, "faster" and "unmeasured" let it. Auto does not know the task, so the model-free
drafter is always added: it drafts only where the text repeats (code, editing a pasted document).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.engine.config import TREE_TYPES, SpecConfig

FASTER, SLOWER, UNMEASURED = "faster", "slower", "unmeasured"


@dataclass(frozen=True)
class Fact:
    method: str  # a --spec-type name
    hardware: str  # "cpu", "cuda", or "*"
    weights: str  # in-memory weight format (fp32, bf16, int8, int4) or "*"
    verdict: str  # FASTER, SLOWER or UNMEASURED (relative to plain decoding, same prompts)
    evidence: str


# Most specific row wins (exact hardware and weights over "*"). Keep each row's evidence
# pointing at a measurement someone can repeat.
FACTS: tuple[Fact, ...] = (
    Fact("draft-simple", "cpu", "*", SLOWER,
         "measured 2026-11-29, docs/bench/qwen2.5-coder-1.5b (1.5B int8 target, 0.5B int8 draft, k=3, AMD EPYC "
         "2 cores): greedy 1.10x overall (code 1.22x, edit 1.45x, summarize 1.10x) but prose 0.73x and chat 0.92x; "
         "T=0.7 0.93x overall; the draft's 3 steps cost ~70% of a target step, so it loses wherever acceptance "
         "is below ~0.75"),
    Fact("suffix", "*", "*", UNMEASURED,
         "model-free; drafts only where the context repeats and the estimated chance of the whole draft "
         "stays above its floor, so text without repeats costs (almost) nothing; to be confirmed per "
         "category by `specdec bench --methods none,suffix,auto`"),
    Fact("ngram-simple", "*", "*", UNMEASURED,
         "model-free; drafts on any 2-gram match, so it drafts more often (and more wrongly) than suffix"),
    # The MTP and EAGLE-3 rows stay UNMEASURED for a model's own (or a well-trained) head: the only
    # heads measured here are specdec's weak self-trained ones for smollm2, which auto never picks.
    Fact("draft-mtp", "*", "*", UNMEASURED,
         "measured 2026-11-29 only with specdec's shipped smollm2-135m head (docs/bench/smollm2-135m-heads, int8, "
         "AMD EPYC 2 cores): first-token acceptance 0.34, adaptive draft length 0.88x greedy / 0.85x T=0.7, fixed "
         "k=3 0.63x; each drafted token runs one decoder layer plus the full 49152-row output head (~5 ms). A "
         "model's own MTP layers (DeepSeek-V3 reports 85-90% second-token acceptance) are unmeasured here"),
    Fact("draft-eagle3", "*", "*", UNMEASURED,
         "measured 2026-11-29 only with specdec's shipped smollm2-135m head (docs/bench/smollm2-135m-heads): "
         "first-token acceptance 0.38, adaptive chain 1.02x greedy (chat 1.19x, summarize 0.84x) / 0.99x T=0.7; "
         "a top-2 tree of 3 nodes 0.64x (verifying 4 tokens costs 1.8x one token on this CPU)"),
    Fact("draft-dflash", "*", "*", UNMEASURED, "not implemented in specdec yet"),
    Fact("draft-dspark", "*", "*", UNMEASURED, "not implemented in specdec yet"),
)

# The model-free drafters auto adds, in the order the engine tries them.
AUTO_MODEL_FREE = ("suffix",)

# Model drafters drafters/factory.py can build today (it raises for the others);
# tests/test_auto.py checks this against the factory.
RUNNABLE_MODEL_DRAFTERS = frozenset({"draft-simple", "draft-mtp", "draft-eagle3"})


@dataclass(frozen=True)
class TargetFacts:
    """What auto needs to know about the target model."""

    name: str
    mtp_declared: int = 0  # MTP layers named by the config
    mtp_weights: bool = False  # whether the checkpoint holds their weights
    weights_format: str = "int8"  # in-memory format the target runs in
    mtp_source: str = ""  # where the MTP weights are, when not in the checkpoint (a head beside the model)


@dataclass(frozen=True)
class DrafterFacts:
    """A drafter the user pointed at (-md / --model-draft)."""

    path: str
    kind: str  # "draft-simple", "draft-eagle3", "draft-dflash" or "draft-dspark"
    compatible: bool = True  # same tokenizer as the target (draft-simple), or trained for it
    reason: str = ""  # why not compatible


def lookup_fact(method: str, hardware: str, weights: str, facts=FACTS) -> Fact:
    """The most specific fact for (method, hardware, weights); UNMEASURED when the table has none."""
    best, best_score = None, -1
    for f in facts:
        if f.method != method or f.hardware not in (hardware, "*") or f.weights not in (weights, "*"):
            continue
        score = (f.hardware == hardware) * 2 + (f.weights == weights)
        if score > best_score:
            best, best_score = f, score
    return best or Fact(method, hardware, weights, UNMEASURED, "no measurement recorded")


def choose_auto(model, draft_model: DrafterFacts | None = None, *, hardware: str = "cpu", facts=None,
                runnable=None, model_free=AUTO_MODEL_FREE, draft_n_max: int = 3,
                ) -> tuple[SpecConfig, list[str]]:
    """The SpecConfig auto runs for `model`, and one reason per decision (for people).

    model: TargetFacts, or a loaded Model (its checkpoint's tensor names are read, no I/O).
    draft_model: the drafter the user gave, described by `drafter_facts`, or None.
    facts, runnable: default to this module's FACTS and RUNNABLE_MODEL_DRAFTERS (read at call time).
    """
    facts = FACTS if facts is None else facts
    runnable = RUNNABLE_MODEL_DRAFTERS if runnable is None else runnable
    target = model if isinstance(model, TargetFacts) else target_facts(model)
    reasons: list[str] = []

    def allowed(method: str) -> tuple[bool, Fact]:
        fact = lookup_fact(method, hardware, target.weights_format, facts)
        return fact.verdict != SLOWER, fact

    model_type: str | None = None
    # 1. MTP layers in the checkpoint
    if target.mtp_weights:
        ok, fact = allowed("draft-mtp")
        if "draft-mtp" not in runnable:
            reasons.append(f"model declares {target.mtp_declared or 'its'} MTP layer(s) and carries their weights, "
                           "but specdec cannot run MTP yet")
        elif not ok:
            reasons.append(f"MTP measured slower than plain decoding on {hardware}: {fact.evidence}")
        else:
            model_type = "draft-mtp"
            where = target.mtp_source or "model carries MTP layers"
            reasons.append(f"{where}: draft-mtp, used without being asked ({fact.verdict})")
    elif target.mtp_declared:
        reasons.append(f"config declares {target.mtp_declared} MTP layer(s) but the checkpoint lacks their weights "
                       "(GGUF conversions often drop them): no MTP")
    # 2./3. a drafter the user gave
    if draft_model is not None and model_type is None:
        kind = draft_model.kind
        ok, fact = allowed(kind)
        if not draft_model.compatible:
            reasons.append(f"{kind} {draft_model.path} not used: {draft_model.reason}")
        elif kind not in runnable:
            reasons.append(f"{kind} drafter {draft_model.path} given, but specdec cannot run {kind} yet")
        elif not ok:
            reasons.append(f"{kind} {draft_model.path} not used: measured slower than plain decoding on {hardware} "
                           f"({fact.evidence})")
        else:
            model_type = kind
            reasons.append(f"{kind}: {draft_model.path} ({fact.verdict} on {hardware})")
    elif draft_model is not None:
        reasons.append(f"{draft_model.kind} {draft_model.path} not used: {model_type} was chosen")
    # 4. model-free drafters, tried before any model drafter
    types: list[str] = []
    for name in model_free:
        ok, fact = allowed(name)
        if ok:
            types.append(name)
            reasons.append(f"{name}: model-free, drafts from repeated text ({fact.verdict} on {hardware})")
        else:
            reasons.append(f"{name} not used: measured slower than plain decoding on {hardware} ({fact.evidence})")
    if model_type is not None:
        types.append(model_type)
    # Adaptive length: on a CPU, verifying 4 tokens costs ~1.8x one step, so fixed-length drafts that
    # get rejected (prose, sampling) made suffix 4-8% slower than plain decoding in the bench; the cost
    # model drafts 1-2 tokens when acceptance is low, which costs about what one step costs.
    spec = SpecConfig(types=tuple(types), draft_n_max=draft_n_max, adaptive=bool(types),
                      draft_model=draft_model.path if model_type is not None and draft_model is not None
                      and model_type == draft_model.kind else None)
    reasons.insert(0, f"auto chose {spec.method}")
    if spec.adaptive:
        reasons.append(f"draft length 1..{draft_n_max} chosen each step from the measured verify cost and recent "
                       "acceptance (adaptive)")
    return spec, reasons


def target_facts(model) -> TargetFacts:
    """TargetFacts of a loaded Model (reads tensor names already in memory)."""
    from specdec.inspect import mtp_info

    from specdec.drafters.mtp import sidecar_path

    mtp = mtp_info(model.checkpoint)
    present, source = mtp["weights_present"], ""
    sidecar = sidecar_path(model.info.path)
    if not present and (sidecar / "model.safetensors").is_file():
        # a head `specdec train mtp` saved beside the model counts as the model's own MTP layers
        present, source = True, f"MTP head beside the model ({sidecar})"
    return TargetFacts(model.info.name, mtp["declared"], present, model.info.weights_dtype, source)


def drafter_facts(name_or_path: str, target_checkpoint, target_tokenizer, target_name: str = "target"
                  ) -> DrafterFacts:
    """Open a drafter's files (no weights built) and say what kind it is and whether it fits the target."""
    from specdec.inspect import describe_drafter
    from specdec.model.registry import resolve

    d = describe_drafter(resolve(name_or_path), target_checkpoint, target_tokenizer, target_name, name_or_path)
    return DrafterFacts(name_or_path, d["kind"], d["compatible"], d["reason"] or "")


# -- command line ------------------------------------------------------------------------------
def auto_requested(spec_type: str | None, model_draft: str | None, speculative_config: str | None) -> bool:
    """True for --spec-type auto, and when the user said nothing about speculation at all."""
    if spec_type is not None:
        types = [t.strip() for t in spec_type.split(",")]
        if "auto" in types and len(types) > 1:
            raise ValueError("--spec-type auto cannot be combined with other types")
        if types == ["auto"] and speculative_config:
            raise ValueError("--spec-type auto contradicts --speculative-config; give one of them")
        return types == ["auto"]
    return model_draft is None and not speculative_config


def resolve_auto(model, args) -> tuple[SpecConfig, list[str]]:
    """choose_auto for a loaded target and the cli's spec flags (n-max/min, p-min, adaptive, typical)."""
    draft = None
    if args.model_draft:
        draft = drafter_facts(args.model_draft, model.checkpoint, model.tokenizer, model.info.name)
    n_max = args.spec_draft_n_max if args.spec_draft_n_max is not None else 3
    spec, reasons = choose_auto(model, draft, draft_n_max=n_max)
    changes = {"draft_n_min": args.spec_draft_n_min or 0, "draft_p_min": args.spec_draft_p_min or 0.0,
               "adaptive": spec.adaptive or bool(args.spec_adaptive),
               "acceptance": "typical" if args.spec_typical else "exact", **tree_overrides(spec, args)}
    return spec.with_overrides(**changes), reasons


def tree_overrides(spec: SpecConfig, args) -> dict:
    """The tree flags for the spec auto chose: kept for a hidden-state drafter, else an error."""
    topk, budget = getattr(args, "spec_tree_topk", None), getattr(args, "spec_tree_budget", None)
    if topk is None and budget is None:
        return {}
    if not set(spec.types) & set(TREE_TYPES):
        raise ValueError(f"--spec-tree-topk/--spec-tree-budget shape the trees of {' and '.join(TREE_TYPES)}, but auto "
                         f"chose {spec.method}; name the drafter with --spec-type")
    return {"tree_topk": topk or 1, "tree_budget": budget or 0}
