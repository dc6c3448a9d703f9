"""Speculative settings from llama.cpp-style flags and vLLM-style JSON; bad settings are one clear error."""

from __future__ import annotations

import pytest

from helpers.spec import spec_of as spec_config_from_flags
from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.spec_request import SpecRequest, build_spec


def test_llama_cpp_flags():
    spec, notes = spec_config_from_flags(spec_type="ngram-simple,suffix", draft_n_max=5, draft_n_min=2)
    assert spec.types == ("ngram-simple", "suffix") and spec.draft_n_max == 5 and spec.draft_n_min == 2
    assert spec.method == "ngram-simple,suffix" and notes == []


def test_vllm_json():
    spec, _ = spec_config_from_flags(
        speculative_config='{"method": "draft_model", "model": "qwen2.5-coder-0.5b", "num_speculative_tokens": 4}')
    assert spec.types == ("draft-simple",) and spec.draft_model == "qwen2.5-coder-0.5b" and spec.draft_n_max == 4
    assert spec_config_from_flags(speculative_config='{"method": "ngram"}')[0].types == ("ngram-simple",)
    assert spec_config_from_flags(speculative_config='{"method": "suffix"}')[0].types == ("suffix",)
    typed, _ = spec_config_from_flags(speculative_config='{"method": "ngram", "draft_p_min": 0, "adaptive": true}')
    assert typed.adaptive and typed.draft_p_min == 0
    json_off = '{"method": "ngram", "adaptive": false}'
    assert not spec_config_from_flags(adaptive=True, speculative_config=json_off)[0].adaptive


def test_vllm_prompt_lookup_sizes_reach_the_ngram_drafter(tiny_model):
    """prompt_lookup_min/max were accepted and ignored; they are ngram-simple's n-gram orders."""
    from specdec.engine.engine import Engine

    spec, _ = spec_config_from_flags(speculative_config='{"method": "ngram", "prompt_lookup_min": 3, '
                                                        '"prompt_lookup_max": 5}')
    assert spec.drafters == (DrafterSpec.of("ngram-simple", order_min=3, order_max=5),)
    (drafter,) = Engine(tiny_model, max_len=64).drafters_for(spec)
    assert (drafter.order_min, drafter.order_max) == (3, 5)
    # one of them given: the other is the same, as vLLM sets it (max 4 alone ran orders 2..4; min 8 alone was
    # an error naming a maximum of 6 nobody gave)
    spec, _ = spec_config_from_flags(speculative_config='{"method": "ngram", "prompt_lookup_max": 4}')
    assert spec.drafters == (DrafterSpec.of("ngram-simple", order_min=4, order_max=4),)
    spec, _ = spec_config_from_flags(speculative_config='{"method": "ngram", "prompt_lookup_min": 8}')
    (drafter,) = Engine(tiny_model, max_len=64).drafters_for(spec)
    assert (drafter.order_min, drafter.order_max) == (8, 8)


def test_a_json_null_tree_setting_keeps_the_flag():
    """"tree_topk": null replaced --spec-tree-topk 2 with 1 (and a null tree_budget the flag's with 0)."""
    spec, _ = spec_config_from_flags(tree_topk=2, tree_budget=5,
                                     speculative_config='{"method": "eagle3", "tree_topk": null, "tree_budget": null}')
    assert (spec.tree_topk, spec.tree_budget) == (2, 5)


def test_draft_model_alone_turns_draft_simple_on_and_says_so():
    spec, notes = spec_config_from_flags(model_draft="qwen2.5-coder-0.5b")
    assert spec.types == ("draft-simple",)
    assert any("draft-simple turned on" in n for n in notes)
    spec, _ = spec_config_from_flags(spec_type="ngram-simple", model_draft="d")
    assert spec.types == ("ngram-simple", "draft-simple")


def test_an_eagle3_head_folder_alone_turns_draft_eagle3_on(tmp_path):
    """-md DIR with an EAGLE-3 head and no --spec-type used to load the folder as a draft model."""
    (tmp_path / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64}')
    spec, notes = spec_config_from_flags(model_draft=str(tmp_path))
    assert spec.types == ("draft-eagle3",) and spec.draft_model == str(tmp_path)
    assert any("draft-eagle3 turned on" in n for n in notes)


def test_model_free_kinds_are_tried_before_the_model_drafter():
    spec = SpecConfig(drafters=("draft-simple", "suffix", "ngram-simple"), draft_model="d")
    assert spec.types == ("suffix", "ngram-simple", "draft-simple") and spec.model_kind == "draft-simple"
    assert spec == SpecConfig(drafters=("suffix", "ngram-simple", "draft-simple"), draft_model="d")


def test_tree_shape_from_flags_and_json():
    spec, _ = spec_config_from_flags(spec_type="draft-eagle3", tree_topk=2, tree_budget=5)
    assert (spec.tree_topk, spec.tree_budget, spec.effective_tree_budget) == (2, 5, 5)
    spec, _ = spec_config_from_flags(speculative_config='{"method": "mtp", "tree_topk": 3}')
    assert spec.types == ("draft-mtp",) and spec.effective_tree_budget == 9  # topk x draft length
    assert spec_config_from_flags(spec_type="draft-mtp")[0].tree_topk == 1  # a chain unless asked


def test_defaults_and_none():
    assert not spec_config_from_flags(spec_type="none")[0].enabled
    assert SpecConfig().method == "none" and SpecConfig().draft_n_max == 3
    with pytest.raises(ValueError, match="auto reads the target model's files to choose; name a --spec-type"):
        spec_config_from_flags()  # nothing said is auto, which needs the target


@pytest.mark.parametrize("kwargs, message", [
    (dict(spec_type="ngram-bogus"), "unknown --spec-type 'ngram-bogus'"),
    (dict(spec_type="none,suffix"), "'none' cannot be combined"),
    (dict(spec_type=""), "--spec-type '' names no type; give none, auto or"),
    (dict(spec_type=" , "), "--spec-type ' , ' names no type"),
    (dict(spec_type="none", model_draft="qwen2.5-coder-0.5b"), "--spec-type none turns speculation off, so "
     "-md/--model-draft would not be used"),
    (dict(spec_type="none", speculative_config='{"method": "ngram"}'), "so --speculative-config would not be used"),
    (dict(spec_type="none", draft_n_max=5), "so --spec-draft-n-max would not be used"),
    (dict(spec_type="none", adaptive=True), "so --spec-adaptive would not be used"),
    (dict(spec_type="none", typical=True), "so --spec-typical would not be used"),
    (dict(spec_type="none", cross_tokenizer=True), "so --spec-cross-tokenizer would not be used"),
    (dict(spec_type="suffix", cross_tokenizer=True), "suffix has no draft model of that kind, so it would do nothing"),
    (dict(spec_type="ngram-simple", draft_p_min=0.5), "ngram-simple drafts without one, so it would do nothing"),
    (dict(spec_type="draft-mtp", model_draft="qwen2.5-coder-0.5b"), "--spec-type draft-mtp with -md "
     "qwen2.5-coder-0.5b: that is not an MTP head folder"),
    (dict(speculative_config='{"method": "mtp", "model": "qwen2.5-coder-0.5b"}'), "that is not an MTP head folder"),
    (dict(spec_type="suffix,suffix"), "lists a type twice"),
    (dict(spec_type="ngram-simple", draft_n_max=0), "must be between 1 and 32, got 0"),
    (dict(spec_type="ngram-simple", draft_n_max=-2), "must be between 1 and 32, got -2"),
    (dict(spec_type="ngram-simple", draft_n_max=10000), "must be between 1 and 32, got 10000"),
    (dict(spec_type="ngram-simple", draft_n_min=-1), "--spec-draft-n-min must be >= 0"),
    (dict(spec_type="ngram-simple", draft_n_max=2, draft_n_min=3), "is larger than --spec-draft-n-max"),
    (dict(spec_type="draft-simple", model_draft="small", draft_p_min=1.5), "--spec-draft-p-min must be in"),
    (dict(spec_type="draft-simple"), "needs a draft model"),
    (dict(speculative_config="{not json"), "is not valid JSON"),
    (dict(speculative_config='["ngram"]'), "must be a JSON object"),
    (dict(speculative_config='{"method": "medusa"}'), "method 'medusa' is not one of"),
    (dict(speculative_config='{"method": "ngram", "colour": 1}'), "unknown keys: colour"),
    (dict(speculative_config='{"method": "ngram", "num_speculative_tokens": "3"}'), "must be an integer"),
    (dict(speculative_config='{"method": "ngram", "num_speculative_tokens": 0}'), "must be between 1 and 32, got 0"),
    (dict(spec_type="suffix", speculative_config='{"method": "ngram"}'), "contradicts --speculative-config"),
    (dict(draft_n_max=4, speculative_config='{"method": "ngram", "num_speculative_tokens": 3}'),
     "--spec-draft-n-max 4 contradicts num_speculative_tokens 3"),
    (dict(model_draft="a", speculative_config='{"method": "draft_model", "model": "b"}'), "different draft models"),
    (dict(spec_type="draft-simple,draft-eagle3", model_draft="a"), "only one model drafter"),
    (dict(spec_type="draft-eagle3", tree_topk=0), "--spec-tree-topk must be at least 1"),
    (dict(spec_type="draft-eagle3", tree_budget=-1), "a draft tree holds at most 64 nodes .*, got -1"),
    (dict(spec_type="draft-eagle3", tree_topk=30), "a draft tree holds at most 64 nodes .*, got 90"),
    (dict(spec_type="suffix", tree_topk=2), "token trees .* are drafted by draft-eagle3 and draft-mtp"),
    (dict(tree_topk=2, speculative_config='{"method": "eagle3", "tree_topk": 3}'),
     "--spec-tree-topk 2 contradicts tree_topk 3"),
    (dict(speculative_config='{"method": "eagle3", "tree_budget": 2.5}'), "tree_budget must be an integer"),
    (dict(speculative_config='{"method": "ngram", "draft_p_min": "0.5"}'),
     'draft_p_min must be a number, got "0.5"'),
    (dict(speculative_config='{"method": "ngram", "draft_p_min": true}'), "draft_p_min must be a number, got true"),
    (dict(speculative_config='{"method": "ngram", "adaptive": "no"}'), 'adaptive must be true or false, got "no"'),
    (dict(speculative_config='{"method": "draft_model", "model": ["a"]}'), "model must be a string"),
    (dict(speculative_config='{"method": "suffix", "prompt_lookup_min": 2}'), "n-gram sizes of method 'ngram'"),
    (dict(speculative_config='{"method": "ngram", "prompt_lookup_min": 0}'), "order_min must be at least 1"),
    (dict(speculative_config='{"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 3}'),
     "order_max .3. must be >= order_min .4."),
    (dict(spec_type="draft-mtp", tree_topk=2, typical=True), "typical acceptance .* verifies chains"),
])
def test_bad_settings_are_one_clear_error(kwargs, message, tiny_model):
    from specdec.engine.engine import Engine

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        spec, _ = spec_config_from_flags(**kwargs)
        Engine(tiny_model, max_len=64).drafters_for(spec)  # options are checked when the drafter is built


def test_mismatched_draft_vocabulary_names_the_first_differing_token(tmp_path, tiny_model):
    """A draft whose token texts differ is refused, naming the first differing token."""
    import json

    from helpers.tiny import make_hf_model
    from specdec.drafters.draft_model import DraftCompatibilityError
    from specdec.engine.engine import Engine

    other = make_hf_model(tmp_path / "other")
    data = json.loads((other / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    victim = next(t for t, i in vocab.items() if i == 40)
    vocab["XYZ"] = vocab.pop(victim)
    (other / "tokenizer.json").write_text(json.dumps(data))
    engine = Engine(tiny_model, max_len=64)
    with pytest.raises(DraftCompatibilityError, match=f"token 40 differs: target .* has {victim!r}, draft .* has 'XYZ'"):
        engine.drafters_for(SpecConfig(drafters=("draft-simple",), draft_model=str(other)))
    bigger = make_hf_model(tmp_path / "bigger", vocab=1024)
    with pytest.raises(DraftCompatibilityError, match="vocabulary sizes differ too much"):
        engine.drafters_for(SpecConfig(drafters=("draft-simple",), draft_model=str(bigger)))


def test_cross_tokenizer_drafting_is_lossless(tmp_path, tiny_model):
    """A draft with another tokenizer drafts through text when asked; greedy output is unchanged."""
    import json

    from helpers.tiny import make_hf_model
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    other = make_hf_model(tmp_path / "other", seed=0)
    data = json.loads((other / "tokenizer.json").read_text())
    data["model"]["merges"] = data["model"]["merges"][:2]  # another segmentation of the same text
    (other / "tokenizer.json").write_text(json.dumps(data))
    engine = Engine(tiny_model, max_len=128)
    ids = tiny_model.tokenizer.encode("the then there the then")
    plain = engine.generate(ids, SamplingParams(), max_tokens=20)
    spec = SpecConfig(drafters=("draft-simple",), draft_model=str(other), cross_tokenizer=True)
    out = engine.generate(ids, SamplingParams(), max_tokens=20, spec=spec)
    assert out.token_ids == plain.token_ids
    # the draft has the target's weights (seed 0): its tokens, once turned into the target's, are mostly taken
    assert out.stats.configured and out.stats.drafted > 0 and out.stats.accepted > 0, out.stats


@pytest.mark.parametrize("kwargs, message", [
    (dict(drafters="ngram-simple"), r"drafters must be a tuple of kinds, e.g. \('ngram-simple',\)"),
    (dict(drafters=("ngram-simple",), adaptive="no"), "adaptive must be True or False, got 'no'"),  # was on
    (dict(drafters=("ngram-simple",), draft_n_max=2.5), "draft_n_max must be a whole number, got 2.5"),
    (dict(drafters=("ngram-simple",), draft_n_max="3"), "draft_n_max must be a whole number, got '3'"),
])
def test_spec_config_field_types_are_checked(kwargs, message):
    with pytest.raises(TypeError, match=message):
        SpecConfig(**kwargs)
