"""--spec-type auto: pick the speculative methods for a model from measured facts.

The rule (docs/drafters.md, "Auto (the default)"), each step kept only when this
build can run it and the facts table does not say it slows decoding on this hardware:

    1. the model carries MTP layers (weights present)            -> draft-mtp
    2. an MTP / EAGLE-3 / DFlash / DSpark head for it is given    -> that drafter
    3. a same-tokenizer draft model is given                      -> draft-simple
    4. always                                                     -> + the model-free drafter(s)
                                                                     (tried first each step)

`choose_auto` is a pure function of what is known about the target and the drafter; every command
reaches it through engine/spec_request.build_spec, which reads those facts from the checkpoint
(model/checkpoint_facts.py) and the drafter's files (drafters/describe.py) and puts the user's settings on top.

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

from specdec.drafters import registry
from specdec.drafters.describe import DrafterFacts
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH
from specdec.engine.config import SpecConfig
from specdec.model.checkpoint_facts import TargetFacts

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
         "measured 2026-12-03, docs/measurements/bench/qwen2.5-coder-1.5b-gguf-draft (1.5B Q4_K_M target, 0.5B Q4_K_M draft, "
         "both gguf, AMD EPYC 2 cores, greedy): k=3 1.25x overall (code 1.27x, edit 1.41x) but prose 0.98x and "
         "chat 0.96x; adaptive length 1.17x, every category 1.03x or more, yet below suffix's 1.22x on that set; "
         "T=0.7 unmeasured. On 2026-11-29 with int8 weights (docs/measurements/bench/qwen2.5-coder-1.5b) k=3 1.10x, prose "
         "0.73x, T=0.7 0.93x"),
    Fact("suffix", "*", "*", UNMEASURED,
         "model-free; drafts only where the context repeats and the estimated chance of the whole draft "
         "stays above its floor, so text without repeats costs (almost) nothing; to be confirmed per "
         "category by `specdec bench --methods none,suffix,auto`"),
    Fact("ngram-simple", "*", "*", UNMEASURED,
         "model-free; drafts on any 2-gram match, so it drafts more often (and more wrongly) than suffix"),
    # The MTP and EAGLE-3 rows stay UNMEASURED for a model's own (or a well-trained) head: the only
    # heads measured here are specdec's weak self-trained ones for smollm2, which auto never picks.
    Fact("draft-mtp", "*", "*", UNMEASURED,
         "measured 2026-11-29 only with specdec's shipped smollm2-135m head (docs/measurements/bench/smollm2-135m-heads, int8, "
         "AMD EPYC 2 cores): first-token acceptance 0.34, adaptive draft length 0.88x greedy / 0.85x T=0.7, fixed "
         "k=3 0.63x; each drafted token runs one decoder layer plus the full 49152-row output head (~5 ms). A "
         "model's own MTP layers (DeepSeek-V3 reports 85-90% second-token acceptance) are unmeasured here"),
    Fact("draft-eagle3", "*", "*", UNMEASURED,
         "measured 2026-11-29 only with specdec's shipped smollm2-135m head (docs/measurements/bench/smollm2-135m-heads): "
         "first-token acceptance 0.38, adaptive chain 1.02x greedy (chat 1.19x, summarize 0.84x) / 0.99x T=0.7; "
         "a top-2 tree of 3 nodes 0.64x (verifying 4 tokens costs 1.8x one token on this CPU)"),
    Fact("draft-dflash", "*", "*", UNMEASURED,
         "runs from a published-layout folder given with -md (one drafter pass drafts a whole block); no "
         "drafter is shipped or measured here yet"),
    Fact("draft-dspark", "*", "*", UNMEASURED,
         "runs from a published-layout folder given with -md (anchor-first block, Markov bias, confidence "
         "cut by --spec-draft-p-min); no drafter is shipped or measured here yet"),
)



def runnable_model_drafters() -> frozenset[str]:
    """Model drafter kinds this build can run (the registry's entries with a builder)."""
    return frozenset(e.kind for e in registry.entries() if e.model and e.runnable)


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


def choose_auto(target: TargetFacts, draft_model: DrafterFacts | None = None, *, hardware: str = "cpu", facts=None,
                runnable=None, model_free=None, draft_n_max: int = DEFAULT_DRAFT_LENGTH,
                ) -> tuple[SpecConfig, list[str]]:
    """The SpecConfig auto runs for `model`, and one reason per decision (for people).

    target: TargetFacts (model/checkpoint_facts.py target_facts).
    draft_model: the drafter the user gave, described by `drafter_facts`, or None.
    facts, runnable: default to this module's FACTS and runnable_model_drafters() (read at call time).
    model_free: the model-free kinds auto adds (default: the registry's entries marked auto).
    """
    facts = FACTS if facts is None else facts
    runnable = runnable_model_drafters() if runnable is None else runnable
    model_free = registry.with_flag("auto") if model_free is None else model_free
    mtp = registry.kind_of_head("mtp")
    reasons: list[str] = []

    def allowed(method: str) -> tuple[bool, Fact]:
        fact = lookup_fact(method, hardware, target.weights_format, facts)
        return fact.verdict != SLOWER, fact

    model_type: str | None = None
    given_used = False  # the drafter the user gave drafts
    # 1. MTP layers in the checkpoint (a trained MTP head the user gave goes to 2., when it can run: one that
    # does not fit the model left auto with no MTP at all)
    given_mtp = (draft_model is not None and draft_model.kind == mtp and draft_model.compatible
                 and mtp in runnable and allowed(mtp)[0])
    if target.mtp_weights and not given_mtp:
        ok, fact = allowed(mtp)
        if mtp not in runnable:
            reasons.append(f"model declares {target.mtp_declared or 'its'} MTP layer(s) and carries their weights, "
                           "but specdec cannot run MTP yet")
        elif not ok:
            reasons.append(f"MTP measured slower than plain decoding on {hardware}: {fact.evidence}")
        else:
            model_type = mtp
            where = target.mtp_source or "model carries MTP layers"
            reasons.append(f"{where}: {mtp}, used without being asked ({fact.verdict})")
    elif target.mtp_weights:  # and the user gave a trained MTP head: that one drafts
        reasons.append("the checkpoint's MTP layers are not used: the MTP head given with -md drafts instead")
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
            model_type, given_used = kind, True
            reasons.append(f"{kind}: {draft_model.path} ({fact.verdict} on {hardware})")
    elif draft_model is not None:
        why = draft_model.reason if not draft_model.compatible else f"{model_type} was chosen"
        reasons.append(f"{draft_model.kind} {draft_model.path} not used: {why}")
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
    spec = SpecConfig(drafters=tuple(types), draft_n_max=draft_n_max, adaptive=bool(types),
                      draft_model=draft_model.path if given_used else None)
    reasons.insert(0, f"auto chose {spec.method}")
    if spec.adaptive:
        reasons.append(f"draft length 0..{draft_n_max} chosen each step from the measured verify cost and recent "
                       "acceptance (adaptive; 0: drafting pauses while no length pays, with 1-token probes, fewer "
                       "while they fail)")
    return spec, reasons
