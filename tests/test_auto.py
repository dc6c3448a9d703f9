"""--spec-type auto: the pure choice, its facts table, and the command-line wiring."""

from __future__ import annotations

import json

import pytest

from specdec.engine.auto import (FACTS, RUNNABLE_MODEL_DRAFTERS, SLOWER, DrafterFacts, Fact, TargetFacts,
                                 auto_requested, choose_auto, lookup_fact, target_facts)
from specdec.engine.config import MODEL_TYPES, SpecConfig

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


def test_shipped_tables_pick_mtp_exactly_when_this_build_runs_it():
    spec, reasons = choose_auto(TargetFacts("m", mtp_declared=1, mtp_weights=True))
    if "draft-mtp" in RUNNABLE_MODEL_DRAFTERS and lookup_fact("draft-mtp", "cpu", "int8").verdict != SLOWER:
        assert spec.types == ("suffix", "draft-mtp")
    else:
        assert "draft-mtp" not in spec.types and len(reasons) > 1


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
        assert f.method in MODEL_TYPES or f.method in ("suffix", "ngram-simple", "ngram-map-k", "ngram-map-k4v",
                                                       "ngram-cache")


def test_runnable_table_matches_the_drafter_factory(tiny_model, tiny_hf_dir):
    from specdec.drafters.factory import DrafterFactory

    factory = DrafterFactory(tiny_model, 64)
    for name in MODEL_TYPES:
        spec = SpecConfig(types=(name,), draft_model=str(tiny_hf_dir))
        if name == "draft-simple":
            assert factory(name, spec).name == name
        elif name in RUNNABLE_MODEL_DRAFTERS:
            # built, or refused for this tiny model's files, but never "not available in this build"
            try:
                factory(name, spec)
            except Exception as exc:  # noqa: BLE001 (any refusal but the one below is fine)
                assert "not available in this build" not in str(exc), name
        else:
            with pytest.raises(ValueError, match="not available in this build"):
                factory(name, spec)


def test_target_facts_from_a_loaded_model(tiny_model):
    facts = target_facts(tiny_model)
    assert facts == TargetFacts(tiny_model.info.name, 0, False, "fp32")


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
    assert auto_requested(spec_type, draft, config) is expected


def test_auto_cannot_be_combined():
    with pytest.raises(ValueError, match="cannot be combined"):
        auto_requested("auto,suffix", None, None)
    with pytest.raises(ValueError, match="contradicts"):
        auto_requested("auto", None, '{"method": "ngram"}')


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


def test_tree_flags_apply_only_when_auto_chose_a_hidden_state_drafter():
    from types import SimpleNamespace

    from specdec.engine.auto import tree_overrides

    args = SimpleNamespace(spec_tree_topk=2, spec_tree_budget=None)
    with pytest.raises(ValueError, match="auto chose suffix"):
        tree_overrides(SpecConfig(types=("suffix",)), args)
    assert tree_overrides(SpecConfig(types=("suffix", "draft-mtp")), args) == {"tree_topk": 2, "tree_budget": 0}
    unset = SimpleNamespace(spec_tree_topk=None, spec_tree_budget=None)
    assert tree_overrides(SpecConfig(types=("suffix",)), unset) == {}
