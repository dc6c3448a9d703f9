"""--spec-type auto: the pure choice, its facts table, and the command-line wiring."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specdec.drafters import registry
from helpers.spec import spec_for_model
from specdec.engine.auto import DrafterFacts, TargetFacts, candidates, choose_auto, runnable_model_drafters
from specdec.engine.calibration import Calibration, CalibrationKey, Measured, load_calibration, save_calibration
from specdec.engine.spec_request import AutoTarget, SpecRequest, build_spec
from specdec.model.checkpoint_facts import target_facts

PLAIN = TargetFacts("m", weights_format="int8")
ONLY_DRAFT_MODEL = frozenset({"draft-simple"})  # a build that runs no MTP / EAGLE-3 / DFlash / DSpark drafter
KEY = CalibrationKey("ab" * 32, "int8", 2, "cpu", cpu="test cpu")


def calibrated(*measured) -> Calibration:
    return Calibration(KEY, "2026-12-07 10:00", "calibration", 64, tuple(measured), "/tune/x.json")


def measured(types, overall, worst=None, where="chat@0.7"):
    speedups = {"all@0": overall, "code@0": overall, where: overall if worst is None else worst}
    return Measured("+".join(types), tuple(types), speedups)


def test_plain_model_gets_the_model_free_drafter_and_is_told_how_to_measure():
    spec, reasons = choose_auto(PLAIN)
    assert spec.types == ("suffix",) and spec.draft_model is None and spec.draft_n_max == 3 and spec.adaptive
    assert reasons[0] == "auto chose suffix"
    assert any("not measured on this machine: `specdec tune -m m`" in r for r in reasons)


def test_mtp_with_weights_is_not_picked_while_specdec_cannot_run_it():
    spec, reasons = choose_auto(TargetFacts("m", mtp_declared=1, mtp_weights=True), runnable=ONLY_DRAFT_MODEL)
    assert spec.types == ("suffix",)
    assert any("specdec cannot run MTP yet" in r for r in reasons)


def test_mtp_with_weights_is_picked_by_this_build():
    assert "draft-mtp" in runnable_model_drafters()
    spec, reasons = choose_auto(TargetFacts("m", mtp_declared=1, mtp_weights=True))
    assert spec.types == ("suffix", "draft-mtp") and spec.adaptive
    assert any("draft-mtp, used without being asked" in r for r in reasons)


def test_mtp_beats_a_draft_model_given():
    draft = DrafterFacts("d", "draft-simple")
    spec, reasons = choose_auto(TargetFacts("m", 1, True), draft, runnable=ONLY_DRAFT_MODEL | {"draft-mtp"})
    assert spec.types == ("suffix", "draft-mtp") and spec.draft_model is None
    assert any("draft-simple d not used: draft-mtp was chosen" in r for r in reasons)


def test_mtp_declared_without_weights():
    spec, reasons = choose_auto(TargetFacts("m", mtp_declared=2, mtp_weights=False))
    assert spec.types == ("suffix",)
    assert any("declares 2 MTP layer(s) but the checkpoint lacks their weights" in r for r in reasons)


def test_a_draft_model_runs_only_once_measured_faster_here():
    draft = DrafterFacts("small", "draft-simple")
    spec, reasons = choose_auto(PLAIN, draft)
    assert spec.types == ("suffix",)
    assert any("draft-simple small not used yet" in r for r in reasons)
    assert any("`specdec tune -m m -md small`" in r for r in reasons)
    fast = calibrated(measured(("suffix",), 1.10), measured(("suffix", "draft-simple"), 1.35))
    spec, reasons = choose_auto(PLAIN, draft, calibration=fast)
    assert spec.types == ("suffix", "draft-simple") and spec.draft_model == "small"
    assert any("suffix+draft-simple measured 1.35x overall" in r and "/tune/x.json" in r for r in reasons)


def test_the_fastest_configuration_no_slower_anywhere_is_chosen():
    calibration = calibrated(measured(("ngram-mod",), 1.4, worst=0.9),  # fastest, but slower on chat at T=0.7
                             measured(("suffix",), 1.2), measured(("ngram-simple",), 1.15, worst=0.985))
    spec, reasons = choose_auto(PLAIN, calibration=calibration)
    assert spec.types == ("suffix",) and spec.adaptive
    assert any("not chosen: ngram-mod measured 1.40x overall, 0.90x at worst (chat@0.7)" in r for r in reasons)
    spec, reasons = choose_auto(PLAIN, calibration=calibrated(measured(("suffix",), 1.2, worst=0.8)))
    assert spec.types == () and any("no configuration paid in every category" in r for r in reasons)


def test_a_measured_configuration_that_cannot_run_now_is_not_chosen():
    """A calibration that measured a draft model: auto without that draft model given does not run it."""
    calibration = calibrated(measured(("suffix", "draft-simple"), 1.5), measured(("suffix",), 1.1))
    assert choose_auto(PLAIN, calibration=calibration)[0].types == ("suffix",)


def test_incompatible_and_unrunnable_drafters_are_explained():
    spec, reasons = choose_auto(PLAIN, DrafterFacts("d", "draft-simple", False, "token 5 differs"))
    assert spec.types == ("suffix",) and any("token 5 differs" in r for r in reasons)
    spec, reasons = choose_auto(PLAIN, DrafterFacts("e", "draft-eagle3"), runnable=ONLY_DRAFT_MODEL)
    assert spec.types == ("suffix",) and any("specdec cannot run draft-eagle3 yet" in r for r in reasons)
    spec, _ = choose_auto(PLAIN, DrafterFacts("e", "draft-eagle3"), runnable={"draft-eagle3"})
    assert spec.types == ("suffix", "draft-eagle3") and spec.draft_model == "e"


def test_tune_measures_what_auto_could_run():
    # every model-free kind but the grammar drafter, which drafts only under a request's grammar
    assert candidates(PLAIN) == [(k,) for k in registry.model_free_kinds() if k != "grammar"]
    with_mtp = candidates(TargetFacts("m", 1, True))
    assert ("draft-mtp",) in with_mtp and ("suffix", "draft-mtp") in with_mtp


def test_a_calibration_round_trips_and_a_stale_one_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    calibration = calibrated(measured(("suffix",), 1.2))
    path = save_calibration(calibration)
    assert path.parent == tmp_path / "tune"
    back = load_calibration(KEY)
    assert back.measured == calibration.measured and back.path == str(path)
    assert load_calibration(CalibrationKey("ab" * 32, "int8", 1, "cpu", cpu="test cpu")) is None  # other threads
    path.write_text("{not json")
    assert load_calibration(KEY) is None


def test_runnable_model_drafters_are_the_registry_entries_that_build(tiny_model, tiny_hf_dir):
    """Each runnable model drafter given the tiny model's own folder as its draft: draft-simple builds on it;
    the heads read it and refuse it with their own error, saying what the folder is not (never a crash in the
    wiring, nor "not available in this build")."""
    from specdec.drafters.block.config import DFlashError
    from specdec.drafters.draft_model import DraftModelDrafter
    from specdec.drafters.eagle3 import Eagle3Error
    from specdec.drafters.mtp import MTPError
    from specdec.drafters.registry import DrafterSpec
    from specdec.engine.config import SpecConfig
    from specdec.engine.engine import Engine

    refusals = {"draft-dflash": (DFlashError, "is not a DFlash or DSpark drafter"),
                "draft-dspark": (DFlashError, "is not a DFlash or DSpark drafter"),
                "draft-eagle3": (Eagle3Error, "has 2 decoder layers; specdec runs EAGLE-3 heads of one layer"),
                "draft-mtp": (MTPError, "is not an MTP head folder")}
    engine = Engine(tiny_model, max_len=64)
    for e in registry.entries():
        if not e.model:
            continue
        spec = SpecConfig(drafters=(e.kind,), draft_model=str(tiny_hf_dir))
        if e.kind == "draft-simple":
            assert e.kind in runnable_model_drafters()
            assert isinstance(engine.build_drafter(DrafterSpec(e.kind), spec), DraftModelDrafter)
        elif e.kind in runnable_model_drafters():
            assert e.kind in refusals, f"{e.kind}: say here what it does with the tiny model's folder"
            error, message = refusals[e.kind]
            with pytest.raises(error, match=message):
                engine.build_drafter(DrafterSpec(e.kind), spec)
        else:
            with pytest.raises(ValueError, match="not available in this build"):
                engine.build_drafter(DrafterSpec(e.kind), spec)


def test_target_facts_of_a_checkpoint(tiny_model, tmp_path):
    facts = target_facts(tiny_model.checkpoint, tiny_model.info.path, "tiny", "fp32")
    assert facts == TargetFacts("tiny", 0, False, "fp32")
    model_file = tmp_path / "m.gguf"
    (tmp_path / "m.gguf.mtp").mkdir()
    (tmp_path / "m.gguf.mtp" / "model.safetensors").write_bytes(b"")  # damaged: not offered
    assert not target_facts(tiny_model.checkpoint, model_file, "tiny", "fp32").mtp_weights
    save_file({"w": torch.zeros(1)}, str(tmp_path / "m.gguf.mtp" / "model.safetensors"))
    facts = target_facts(tiny_model.checkpoint, model_file, "tiny", "fp32")  # a head `specdec train mtp` saved
    assert facts.mtp_weights and "MTP head beside the model" in facts.mtp_source


@pytest.mark.parametrize("spec_type, draft, config, expected", [
    (None, None, None, True),
    ("auto", None, None, True),
    ("auto", "d", None, True),
    ("none", None, None, False),
    ("suffix", None, None, False),
    (None, "d", None, False),
    (None, None, '{"method": "ngram"}', False),
])
def test_auto_requested(spec_type, draft, config, expected):
    request = SpecRequest.from_flags(spec_type=spec_type, model_draft=draft, speculative_config=config)
    assert request.wants_auto is expected


def test_auto_cannot_be_combined():
    with pytest.raises(ValueError, match="cannot be combined"):
        SpecRequest.from_flags(spec_type="auto,suffix")
    with pytest.raises(ValueError, match="contradicts"):
        SpecRequest.from_flags(spec_type="auto", speculative_config='{"method": "ngram"}')


def test_flags_on_top_of_auto(tiny_model):
    spec, notes = spec_for_model(tiny_model, draft_n_max=5, draft_n_min=2, typical=True)
    assert spec.types == ("suffix",) and spec.adaptive and (spec.draft_n_max, spec.draft_n_min) == (5, 2)
    assert spec.acceptance == "typical" and notes[0] == "auto: auto chose suffix"
    explicit, _ = spec_for_model(tiny_model, spec_type="ngram-simple")
    assert explicit.types == ("ngram-simple",) and not explicit.adaptive


def test_generate_defaults_to_auto_and_prints_the_choice(tiny_hf_dir, capsys):
    from specdec.cli import main

    base = ["generate", "--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "128", "-n", "4", "--json"]
    assert main(base + ["hello"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["spec"]["method"] == "suffix"
    assert "auto: auto chose suffix" in captured.err
    assert main(base + ["--spec-type", "auto", "--spec-draft-n-max", "5", "hello"]) == 0
    assert "auto: auto chose suffix" in capsys.readouterr().err
    assert main(base + ["--spec-type", "none", "hello"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["spec"]["method"] == "none" and "auto:" not in captured.err
    assert main(base + ["--spec-type", "auto,suffix", "hello"]) == 2


def test_tree_flags_apply_only_when_auto_chose_a_tree_drafter(tiny_model):
    with pytest.raises(ValueError, match="auto chose suffix: token trees .* suffix drafts none; name the drafter"):
        spec_for_model(tiny_model, tree_topk=2)


def test_p_min_applies_only_when_auto_chose_a_model_drafter(tiny_model):
    """--spec-draft-p-min was dropped without a word when auto chose suffix (ngram-simple refuses it)."""
    with pytest.raises(ValueError, match="auto chose suffix: --spec-draft-p-min .* suffix drafts without one"):
        spec_for_model(tiny_model, draft_p_min=0.5)


def test_a_given_mtp_head_beside_mtp_layers_is_explained_truly():
    """A trained MTP head given with -md to a checkpoint that carries MTP layers: the reason said the checkpoint
    lacked their weights (GGUF conversions often drop them)."""
    spec, reasons = choose_auto(TargetFacts("m", mtp_declared=1, mtp_weights=True), DrafterFacts("head", "draft-mtp"))
    assert "draft-mtp" in spec.types and spec.draft_model == "head"
    assert "the checkpoint's MTP layers are not used: the MTP head given with -md drafts instead" in reasons
    assert not any("lacks their weights" in r for r in reasons)


def test_a_given_mtp_head_that_cannot_draft_leaves_the_checkpoint_s_mtp_layers_drafting():
    """A head that does not fit the model, given with -md, made auto skip the checkpoint's MTP layers too: no
    MTP at all, and a reason saying the head drafted instead."""
    bad = DrafterFacts("/heads/other", "draft-mtp", False, "hidden size 2048 != target 4096")
    spec, reasons = choose_auto(TargetFacts("m", mtp_declared=1, mtp_weights=True), bad)
    assert spec.types == ("suffix", "draft-mtp") and spec.draft_model is None
    assert any("draft-mtp, used without being asked" in r for r in reasons)
    assert "draft-mtp /heads/other not used: hidden size 2048 != target 4096" in reasons
    assert not any("drafts instead" in r for r in reasons)


def test_auto_refuses_a_tree_topk_of_0_as_the_explicit_path_does(tmp_path, monkeypatch):
    """--spec-tree-topk 0 became 1 under auto; --spec-type draft-mtp --spec-tree-topk 0 is an error."""
    import specdec.engine.spec_request as spec_request

    monkeypatch.setattr(spec_request, "target_facts", lambda *a, **k: TargetFacts("m", mtp_declared=1,
                                                                                   mtp_weights=True))
    target = AutoTarget(None, None, tmp_path, "m", "int8", sha256="0" * 64)
    with pytest.raises(ValueError, match="--spec-tree-topk must be at least 1, got 0"):
        build_spec(SpecRequest.from_flags(spec_type="auto", tree_topk=0), target)
    spec, _ = build_spec(SpecRequest.from_flags(spec_type="auto", tree_topk=2), target)
    assert spec.tree_topk == 2 and "draft-mtp" in spec.types
