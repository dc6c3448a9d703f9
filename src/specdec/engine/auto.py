"""--spec-type auto: the speculation a model runs when nobody said which.

What can run is read from the files: the checkpoint's own MTP layers (or an MTP head beside the
model), the drafter given with -md when it fits the target and this build runs its kind, and the
model-free kinds. What pays is measured on the user's machine (engine/calibration.py, written by
`specdec tune`):

    with a calibration for this file, weights, threads, CPU and drafter:
        the configuration measured fastest among those no slower than plain decoding in any
        category and temperature of the calibration set; plain decoding when none was
    without one:
        the model's own MTP layers, or a head given for this target (EAGLE-3, DFlash, DSpark, MTP),
        plus the registry's `auto` model-free kinds (they draft only where the text repeats, so text
        without repeats costs almost nothing); a separate draft model (draft-simple) only once it has
        been measured faster here, since each of its drafts costs a sizeable part of a target step

`choose_auto` is a pure function of what is known; engine/spec_request.build_spec reads those facts
(model/checkpoint_facts.py, drafters/describe.py, the calibration) and puts the user's settings on top.

    >>> spec, reasons = choose_auto(TargetFacts("m", weights_format="int8"))
    >>> spec.types
    ('suffix',)
"""

from __future__ import annotations

from specdec.drafters import registry
from specdec.drafters.describe import DrafterFacts
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH
from specdec.engine.calibration import Calibration
from specdec.engine.config import SpecConfig
from specdec.model.checkpoint_facts import TargetFacts


def runnable_model_drafters() -> frozenset[str]:
    """Model drafter kinds this build can run (the registry's entries with a builder)."""
    return frozenset(e.kind for e in registry.entries() if e.model and e.runnable)


def model_drafter(target: TargetFacts, draft_model: DrafterFacts | None = None,
                  runnable=None) -> tuple[str | None, str | None, list[str]]:
    """(the model drafter kind auto may use or None, the folder/model it reads or None, reasons).

    The checkpoint's MTP layers unless a trained MTP head that can run was given; else the drafter given."""
    runnable = runnable_model_drafters() if runnable is None else runnable
    mtp = registry.kind_of_head("mtp")
    reasons: list[str] = []
    kind = path = None
    given_mtp = (draft_model is not None and draft_model.kind == mtp and draft_model.compatible
                 and mtp in runnable)
    if target.mtp_weights and not given_mtp:
        if mtp not in runnable:
            reasons.append(f"model declares {target.mtp_declared or 'its'} MTP layer(s) and carries their weights, "
                           "but specdec cannot run MTP yet")
        else:
            kind = mtp
            reasons.append(f"{target.mtp_source or 'model carries MTP layers'}: {mtp}, used without being asked")
    elif target.mtp_weights:  # and the user gave a trained MTP head: that one drafts
        reasons.append("the checkpoint's MTP layers are not used: the MTP head given with -md drafts instead")
    elif target.mtp_declared:
        reasons.append(f"config declares {target.mtp_declared} MTP layer(s) but the checkpoint lacks their weights "
                       "(GGUF conversions often drop them): no MTP")
    if draft_model is not None and kind is None:
        if not draft_model.compatible:
            reasons.append(f"{draft_model.kind} {draft_model.path} not used: {draft_model.reason}")
        elif draft_model.kind not in runnable:
            reasons.append(f"{draft_model.kind} drafter {draft_model.path} given, but specdec cannot run "
                           f"{draft_model.kind} yet")
        else:
            kind, path = draft_model.kind, draft_model.path
    elif draft_model is not None:
        why = draft_model.reason if not draft_model.compatible else f"{kind} was chosen"
        reasons.append(f"{draft_model.kind} {draft_model.path} not used: {why}")
    return kind, path, reasons


def candidates(target: TargetFacts, draft_model: DrafterFacts | None = None, runnable=None) -> list[tuple[str, ...]]:
    """The configurations `specdec tune` measures for auto: each model-free kind alone, and the model drafter
    auto may use alone and behind each of the registry's `auto` model-free kinds."""
    kind, _, _ = model_drafter(target, draft_model, runnable)
    # not the grammar drafter: it drafts only for a request with a grammar, which adds it itself (engine/constrain.py)
    out = [(k,) for k in registry.model_free_kinds() if registry.entry(k).runnable and not registry.entry(k).first]
    if kind is not None:
        out += [(kind,)] + [(k, kind) for k in registry.with_flag("auto")]
    return out


def choose_auto(target: TargetFacts, draft_model: DrafterFacts | None = None, *, runnable=None,
                draft_n_max: int = DEFAULT_DRAFT_LENGTH, calibration: Calibration | None = None,
                ) -> tuple[SpecConfig, list[str]]:
    """The SpecConfig auto runs, and one reason per decision (for people).

    target: TargetFacts (model/checkpoint_facts.target_facts); draft_model: the drafter given, described by
    drafters/describe.drafter_facts, or None; calibration: what `specdec tune` measured here, or None.
    """
    kind, path, reasons = model_drafter(target, draft_model, runnable)
    if calibration is not None:
        possible = set(candidates(target, draft_model, runnable))
        best, slower = calibration.best(lambda m: m.types in possible)
        where = f"{calibration.path or 'the calibration'} ({calibration.created}, prompt set {calibration.prompts})"
        types = best.types if best is not None else ()
        reasons.append(f"measured on this machine, {where}: " + (best.summary() if best else
                                                                 "no configuration paid in every category"))
        reasons += [f"not chosen: {m.summary()}" for m in slower]
    else:
        types = tuple(registry.with_flag("auto"))
        if kind is not None and registry.entry(kind).draft_model:
            reasons.append(f"{kind} {path} not used yet: a separate draft model costs a sizeable part of a target "
                           "step, so auto runs it only once measured faster here")
        elif kind is not None:
            types += (kind,)
        reasons.append(f"not measured on this machine: `specdec tune -m {target.name}"
                       f"{f' -md {draft_model.path}' if draft_model else ''}` measures which methods pay here")
    spec = SpecConfig(drafters=types, draft_n_max=draft_n_max, adaptive=bool(types),
                      draft_model=path if kind in types else None)
    reasons.insert(0, f"auto chose {spec.method}")
    if spec.adaptive:
        reasons.append(f"draft length 0..{draft_n_max} chosen each step from the measured verify cost and recent "
                       "acceptance (adaptive; 0: drafting pauses while no length pays, with 1-token probes, fewer "
                       "while they fail)")
    return spec, reasons
