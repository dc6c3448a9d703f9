"""One way into speculation: every surface fills a SpecRequest, build_spec checks it once."""

from __future__ import annotations

import pytest

from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.spec_request import SpecRequest, build_spec


def built(request: SpecRequest, **kwargs) -> SpecConfig:
    return build_spec(request, **kwargs)[0]


def test_the_same_ask_from_every_surface_is_the_same_config():
    expected = SpecConfig(drafters=(DrafterSpec("ngram-simple"),), draft_n_max=5, adaptive=True)
    asks = [SpecRequest.from_flags(spec_type="ngram-simple", draft_n_max=5, adaptive=True),
            SpecRequest.from_flags(speculative_config='{"method": "ngram", "num_speculative_tokens": 5, '
                                                      '"adaptive": true}'),
            SpecRequest.from_vllm({"method": "ngram", "num_speculative_tokens": 5, "adaptive": True}),
            SpecRequest.from_override(spec_type="ngram-simple", num_speculative_tokens=5, adaptive=True)]
    for ask in asks:
        assert built(ask) == expected, ask
    # a bench method carries no adaptive flag of a model-free kind: the rest is the same
    assert built(SpecRequest.from_method("ngram-simple", draft_n_max=5)) == expected.with_overrides(adaptive=False)
    tree = SpecConfig(drafters=("draft-eagle3",), tree_topk=2, tree_budget=5)
    assert built(SpecRequest.from_flags(spec_type="draft-eagle3", tree_topk=2, tree_budget=5)) == tree
    assert built(SpecRequest.from_method("draft-eagle3:topk=2:budget=5", draft_n_max=3)) == tree
    assert built(SpecRequest.from_vllm({"method": "eagle3", "tree_topk": 2, "tree_budget": 5})) == tree


@pytest.mark.parametrize("request_, message", [
    (SpecRequest.from_flags(spec_type="none", draft_n_max=4),
     "--spec-type none turns speculation off, so --spec-draft-n-max would not be used"),
    (SpecRequest.from_override(enabled=False, num_speculative_tokens=4),
     "speculative.enabled false turns speculation off, so num_speculative_tokens would not be used"),
    (SpecRequest.from_override(spec_type="none", draft_n_min=1),
     "spec_type turns speculation off, so draft_n_min would not be used"),
])
def test_a_rule_names_the_setting_as_it_was_spelled(request_, message):
    with pytest.raises(ValueError, match=message):
        build_spec(request_)


@pytest.mark.parametrize("surface", [
    lambda: SpecRequest.from_flags(spec_type="suffix", draft_p_min=0.5),
    lambda: SpecRequest.from_vllm({"method": "suffix", "draft_p_min": 0.5}),
    lambda: SpecRequest.from_override(method="suffix", draft_p_min=0.5),
])
def test_the_p_min_rule_is_one_rule_for_every_surface(surface):
    with pytest.raises(ValueError, match="is where a model drafter stops drafting for want of confidence; suffix "
                                         "drafts without one"):
        build_spec(surface())


def test_a_server_override_changes_only_what_it_names():
    served = SpecConfig(drafters=("suffix", "draft-simple"), draft_model="small", draft_n_max=4, adaptive=True,
                        cross_tokenizer=True)
    assert built(SpecRequest.from_override(num_speculative_tokens=2), base=served) == \
        served.with_overrides(draft_n_max=2)
    assert built(SpecRequest.from_override(enabled=False), base=served).types == ()
    # a new method starts from the defaults, but for how drafts are accepted and, for a draft model, the served
    # --spec-cross-tokenizer (which made {"method": "ngram"} a 400 on such a server)
    assert built(SpecRequest.from_override(method="ngram"), base=served) == SpecConfig(drafters=("ngram-simple",))
    assert built(SpecRequest.from_override(method="draft_model", model="small"), base=served) == \
        SpecConfig(drafters=("draft-simple",), draft_model="small", cross_tokenizer=True)
    with pytest.raises(ValueError, match="lets draft-simple's draft model have another tokenizer; ngram-simple"):
        build_spec(SpecRequest.from_flags(spec_type="ngram-simple", cross_tokenizer=True))


def test_a_head_folder_is_probed_through_the_registry(tmp_path):
    for config, kind in (('{"architectures": ["LlamaForCausalLMEagle3"]}', "draft-eagle3"),
                         ('{"model_type": "dflash"}', "draft-dflash"),
                         ('{"architectures": ["DSparkDraftModel"]}', "draft-dspark"),
                         ('{"specdec": {"kind": "mtp"}}', "draft-mtp")):
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "config.json").write_text(config)
        assert built(SpecRequest.from_flags(model_draft=str(folder), draft_n_max=2)).types == (kind,)


@pytest.mark.parametrize("text, message", [
    ("draft-simple", "method draft-simple needs --draft-model"),
    ("suffix+magic", "unknown method 'magic' in --methods"),
    ("draft-dflash:topk=2", "draft-dflash takes the options adaptive in --methods"),
    ("ngram-simple:order_min=0", "order_min must be at least 1"),
])
def test_bench_method_strings_are_checked_before_any_model_loads(text, message):
    with pytest.raises(ValueError, match=message):
        build_spec(SpecRequest.from_method(text, draft_n_max=3))
