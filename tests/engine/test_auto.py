"""--spec-type auto: the pure choice, its facts table, and the command-line wiring."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specdec.drafters import registry
from helpers.spec import spec_for_model
from specdec.engine.auto import (FACTS, SLOWER, DrafterFacts, Fact, TargetFacts, choose_auto,
                                 lookup_fact, runnable_model_drafters)
from specdec.engine.spec_request import AutoTarget, SpecRequest, build_spec
from specdec.model.checkpoint_facts import target_facts

PLAIN = TargetFacts("m", weights_format="int8")
FAST_DRAFT = FACTS + (Fact("draft-simple", "cpu", "int8", "faster", "test"),)
ONLY_DRAFT_MODEL = frozenset({"draft-simple"})  # a build that runs no MTP / EAGLE-3 / DFlash / DSpark drafter


def test_plain_model_gets_the_model_free_drafter():
    spec, reasons = choose_auto(PLAIN)
    assert spec.types == ("suffix",) and spec.draft_model is None and spec.draft_n_max == 3
    assert reasons[0] == "auto chose suffix"


def test_mtp_with_weights_is_not_picked_while_specdec_cannot_run_it():
    spec, reasons = choose_auto(TargetFacts("m", mtp_declared=1, mtp_weights=True), runnable=ONLY_DRAFT_MODEL)
    assert spec.types == ("suffix",)
    assert any("specdec cannot run MTP yet" in r for r in reasons)


def test_mtp_with_weights_is_picked_by_this_build():
    assert "draft-mtp" in runnable_model_drafters()
    spec, reasons = choose_auto(TargetFacts("m", mtp_declared=1, mtp_weights=True))
    assert spec.types == ("suffix", "draft-mtp") and spec.adaptive
    assert any("draft-mtp, used without being asked" in r for r in reasons)


def test_mtp_is_picked_once_runnable_and_beats_a_draft_model():
    draft = DrafterFacts("d", "draft-simple")
    spec, reasons = choose_auto(TargetFacts("m", 1, True), draft, runnable=ONLY_DRAFT_MODEL | {"draft-mtp"},
                                facts=FAST_DRAFT)
    assert spec.types == ("suffix", "draft-mtp") and spec.draft_model is None
    assert any("draft-simple d not used: draft-mtp was chosen" in r for r in reasons)


def test_mtp_declared_without_weights():
    spec, reasons = choose_auto(TargetFacts("m", mtp_declared=2, mtp_weights=False))
    assert spec.types == ("suffix",)
    assert any("declares 2 MTP layer(s) but the checkpoint lacks their weights" in r for r in reasons)


def test_draft_model_follows_the_facts_table():
    draft = DrafterFacts("small", "draft-simple")
    spec, reasons = choose_auto(PLAIN, draft)  # shipped table: a draft model slows the target on CPU
    assert spec.types == ("suffix",)
    assert any("draft-simple small not used: measured slower" in r for r in reasons)
    spec, _ = choose_auto(PLAIN, draft, facts=FAST_DRAFT)
    assert spec.types == ("suffix", "draft-simple") and spec.draft_model == "small"
    spec, _ = choose_auto(PLAIN, draft, facts=FAST_DRAFT, hardware="cuda")  # no row for cuda+draft: unmeasured
    assert "draft-simple" in spec.types


def test_incompatible_and_unrunnable_drafters_are_explained():
    spec, reasons = choose_auto(PLAIN, DrafterFacts("d", "draft-simple", False, "token 5 differs"), facts=FAST_DRAFT)
    assert spec.types == ("suffix",) and any("token 5 differs" in r for r in reasons)
    spec, reasons = choose_auto(PLAIN, DrafterFacts("e", "draft-eagle3"), runnable=ONLY_DRAFT_MODEL)
    assert spec.types == ("suffix",) and any("specdec cannot run draft-eagle3 yet" in r for r in reasons)
    spec, _ = choose_auto(PLAIN, DrafterFacts("e", "draft-eagle3"), runnable={"draft-eagle3"})
    assert spec.types == ("suffix", "draft-eagle3") and spec.draft_model == "e"


def test_a_method_measured_slower_is_not_picked():
    facts = FACTS + (Fact("suffix", "cpu", "int8", SLOWER, "bench run 1"),)
    spec, reasons = choose_auto(PLAIN, facts=facts)
    assert spec.types == () and spec.method == "none"
    assert any("suffix not used" in r and "bench run 1" in r for r in reasons)
    spec, _ = choose_auto(TargetFacts("m", weights_format="bf16"), facts=facts)  # that row is for int8 only
    assert spec.types == ("suffix",)


def test_most_specific_fact_wins():
    facts = (Fact("x", "*", "*", "faster", "a"), Fact("x", "cpu", "*", SLOWER, "b"),
             Fact("x", "cpu", "bf16", "faster", "c"))
    assert lookup_fact("x", "cpu", "bf16", facts).evidence == "c"
    assert lookup_fact("x", "cpu", "int8", facts).evidence == "b"
    assert lookup_fact("x", "cuda", "int8", facts).evidence == "a"
    assert lookup_fact("y", "cpu", "int8", facts).verdict == "unmeasured"


def test_facts_table_is_well_formed():
    for f in FACTS:
        assert f.verdict in ("faster", "slower", "unmeasured") and f.evidence
        assert f.method in registry.kinds()


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
                "draft-eagle3": (Eagle3Error, "tensors of the wrong shape"),
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
    target = AutoTarget(None, None, tmp_path, "m", "int8")
    with pytest.raises(ValueError, match="--spec-tree-topk must be at least 1, got 0"):
        build_spec(SpecRequest.from_flags(spec_type="auto", tree_topk=0), target)
    spec, _ = build_spec(SpecRequest.from_flags(spec_type="auto", tree_topk=2), target)
    assert spec.tree_topk == 2 and "draft-mtp" in spec.types
