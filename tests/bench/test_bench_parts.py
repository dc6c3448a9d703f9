"""The bench's parts on their own: method parsing, fresh drafter state, prompt sets, memory estimates."""

from __future__ import annotations

import pytest

from specdec.bench import prompts as prompt_sets
from specdec.bench.memory import (estimate_weight_bytes, gguf_tensor_bytes, kv_bytes_per_token, object_bytes,
                                  transformer_bytes)
from specdec.bench.methods import BenchEngine, parse_methods
from specdec.bench.runner import interleaved_rounds
from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig


# -- run order ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n_configs, temperatures, n_prompts, repeats",
                         [(2, [0.0, 0.7], 15, 2), (2, [0.0, 0.7], 3, 2), (3, [0.0, 0.5, 1.0], 3, 1), (2, [0.0], 4, 1)])
def test_every_configuration_runs_in_every_position_equally_often_at_each_temperature(
        n_configs, temperatures, n_prompts, repeats):
    configs = [f"c{i}" for i in range(n_configs)]
    rounds = interleaved_rounds(repeats, n_prompts, temperatures, configs)
    assert [(rep, pi, t) for rep, pi, t, _ in rounds] == [
        (rep, pi, t) for rep in range(repeats) for pi in range(n_prompts) for t in temperatures]
    for t in temperatures:
        orders = [order for _, _, temp, order in rounds if temp == t]
        assert all(sorted(order) == configs for order in orders)
        for c in configs:
            counts = [sum(order.index(c) == p for order in orders) for p in range(n_configs)]
            assert max(counts) - min(counts) <= 1, (t, c, counts)  # equal, but for the remainder


def test_each_prompt_meets_another_order_at_each_repeat():
    """With prompts a multiple of the configurations (15 and 5, the default) each prompt ran in the same order
    in every repeat, so a category's runs kept their positions."""
    configs = [f"c{i}" for i in range(5)]
    rounds = interleaved_rounds(5, 15, [0.0, 0.7], configs)
    for pi in range(15):
        for t in (0.0, 0.7):
            firsts = [order[0] for _, p, temp, order in rounds if p == pi and temp == t]
            assert sorted(firsts) == configs  # 5 repeats: every configuration first once


# -- methods ------------------------------------------------------------------------------------
def test_parse_methods_baseline_first_options_combinations_sweep():
    methods = parse_methods("suffix,ngram-simple+suffix,ngram-map-k:min_hits=1000:key_size=4", draft_n_max=3,
                            draft_lengths=[1, 3, 5])
    labels = [m.label for m in methods]
    assert labels[:4] == ["none", "suffix", "ngram-simple+suffix", "ngram-map-k:min_hits=1000:key_size=4"]
    assert methods[0].spec == SpecConfig()
    assert methods[2].spec.types == ("ngram-simple", "suffix")
    assert methods[3].spec.drafters == (DrafterSpec.of("ngram-map-k", min_hits=1000, key_size=4),)
    assert methods[3].spec.types == ("ngram-map-k",)  # the options ride as data, not in the name
    sweep = [m for m in methods if m.base == "suffix"]
    assert sorted(m.spec.draft_n_max for m in sweep) == [1, 3, 5]  # k=3 is the main run, not repeated
    assert "suffix k=5" in labels and "suffix k=3" not in labels


def test_model_drafter_options_become_spec_settings():
    methods = parse_methods("draft-eagle3:topk=2:budget=5,draft-mtp:adaptive=1")
    assert methods[1].spec.drafters == (DrafterSpec("draft-eagle3"),)
    assert (methods[1].spec.tree_topk, methods[1].spec.tree_budget, methods[1].spec.adaptive) == (2, 5, False)
    assert methods[2].spec.adaptive and methods[2].spec.tree_topk == 1


@pytest.mark.parametrize("text, message", [
    ("bogus", "unknown method 'bogus'"),
    ("draft-eagle3:colour=2", "draft-eagle3 takes the options adaptive, budget, topk"),
    ("draft-simple", "needs --draft-model"),
    ("suffix,suffix", "twice"),
    ("ngram-map-k:min_hits", "not key=value"),
    ("auto", "needs the target model"),
])
def test_parse_methods_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse_methods(text)


def test_drafter_options_reach_the_drafter_and_state_is_fresh_per_request(tiny_model):
    engine = BenchEngine(tiny_model, 256)
    (d,) = engine.drafters_for(parse_methods("ngram-map-k:min_hits=7")[1].spec)
    assert d.name == "ngram-map-k" and d.inner.min_hits == 7
    (suffix,) = engine.drafters_for(SpecConfig(drafters=("suffix",)))
    suffix.begin([1, 2, 3])
    first = suffix.inner
    suffix.end([4, 5, 6, 4, 5, 6])  # would enter suffix's global tree
    suffix.begin([1, 2, 3])
    assert suffix.inner is not first and suffix.inner.global_size() <= 1
    (kept,) = BenchEngine(tiny_model, 256, fresh_drafters=False).drafters_for(SpecConfig(drafters=("suffix",)))
    kept.begin([1, 2, 3])
    kept.end([4, 5, 6, 4, 5, 6])
    kept.begin([1, 2, 3])
    assert kept.global_size() > 1


# -- prompt sets -------------------------------------------------------------------------------
def test_shipped_prompts_cover_every_category_and_name_source_and_license():
    counts = {c: sum(p.category == c for p in prompt_sets.PROMPTS) for c in prompt_sets.CATEGORIES}
    assert all(n >= 2 for n in counts.values()), counts
    assert "Apache-2.0" in prompt_sets.META["license"] and prompt_sets.META["source"]
    assert len({p.id for p in prompt_sets.PROMPTS}) == len(prompt_sets.PROMPTS)
    assert [p.category for p in prompt_sets.load_prompts("quick")] == list(prompt_sets.CATEGORIES)
    assert {p.category for p in prompt_sets.load_prompts("edit,code")} == {"edit", "code"}
    assert len(prompt_sets.load_prompts("mixed", per_category=1)) == len(prompt_sets.CATEGORIES)
    assert any(len(p.messages) >= 3 for p in prompt_sets.PROMPTS if p.category == "chat")  # multi-turn


def test_prompt_file_round_trip_and_errors(tmp_path):
    path = tmp_path / "set.jsonl"
    prompt_sets.write_jsonl(path)
    assert prompt_sets.load_prompts(str(path)) == list(prompt_sets.PROMPTS)
    assert prompt_sets.prompts_meta(str(path))["license"] == prompt_sets.META["license"]
    with pytest.raises(ValueError, match="neither a prompt set"):
        prompt_sets.load_prompts(str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"category": "code", "text": "x"}\n')
    with pytest.raises(ValueError, match="needs an 'id'"):
        prompt_sets.load_prompts(str(bad))
    with pytest.raises(ValueError, match="exactly one"):
        prompt_sets.Prompt("x", "code")


@pytest.mark.parametrize("line, message", [
    ("[1]", ":1: a JSON list, where each line is an object"),  # was AttributeError
    ('{"_meta": "mine"}', "'_meta' must be an object"),
    ('{"id": "a", "messages": "hello"}', "'messages' must be a list of"),  # was a cryptic ValueError
    ('{"id": "a", "messages": [{"role": "user"}]}', "'messages' must be a list of"),
    ('{"id": "a", "text": 3}', "'text' must be a string, got 3"),
    ('{"id": null, "text": "x"}', "'id' must be a string, got None"),
    ('{"id": "a", "category": ["code"], "text": "x"}', "'category' must be a non-empty string"),
    ('{"id": "a", "category": "", "text": "x"}', "'category' must be a non-empty string"),
    ('{"id": "a", "category": "all", "text": "x"}', "'category' \"all\" is the reports' name for every category"),
    ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}', ":2: prompt id 'a' is used twice"),
])
def test_a_prompt_file_line_of_the_wrong_shape_names_the_line(tmp_path, line, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(line + "\n")
    with pytest.raises(ValueError, match=message):
        prompt_sets.load_prompts(str(bad))


def test_a_prompt_file_that_is_not_utf8(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"id": "a", "text": "\xff"}\n')
    with pytest.raises(ValueError, match="bad.jsonl: not UTF-8 text"):
        prompt_sets.load_prompts(str(bad))


def test_prompts_render_with_and_without_a_chat_template(tiny_model):
    tok = tiny_model.tokenizer
    chat = next(p for p in prompt_sets.PROMPTS if p.category == "chat")
    ids = chat.render(tok)
    assert "<|im_start|>assistant" in tok.decode(ids)  # the model's own template
    code = prompt_sets.PROMPTS[0]
    assert tok.decode(code.render(tok)) == code.text


# -- memory ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8", "int4"])
def test_weight_estimate_equals_the_built_model(tiny_hf_dir, fmt):
    from specdec.model.load import load_model

    model = load_model(str(tiny_hf_dir), fmt, progress=False)
    assert estimate_weight_bytes(model.config, fmt) == transformer_bytes(model.transformer)


@pytest.mark.parametrize("family, tensor_type", [("llama", "Q8_0"), ("llama", "F32"), ("gemma3", "Q8_0"),
                                                 ("gemma3", "F32"), ("gemma3", "Q4_0")])
def test_gguf_weight_estimate_equals_the_built_model(tmp_path, family, tensor_type):
    """The gguf format's estimate (what inspect prints) is the built model's size; a tied embedding's
    blocks, which the embedding and the head share, count once (they were counted twice: 42% over)."""
    from helpers.tiny import make_gemma3_gguf_model, make_gguf_model
    from specdec.model.load import load_model, open_checkpoint

    maker = make_gemma3_gguf_model if family == "gemma3" else make_gguf_model
    path = maker(tmp_path / "m.gguf", tensor_type=tensor_type)
    model = load_model(str(path), "gguf", progress=False)
    assert model.config.tie_embeddings == (family == "gemma3")
    gguf_bytes = gguf_tensor_bytes(open_checkpoint(str(path))[0])
    assert estimate_weight_bytes(model.config, "gguf", gguf_bytes) == transformer_bytes(model.transformer)


def test_kv_and_object_sizes(tiny_model):
    cache = tiny_model.transformer.new_cache(100)
    assert cache.nbytes() == kv_bytes_per_token(tiny_model.config, tiny_model.info.kv_cache) * 100
    from specdec.drafters.suffix import SuffixDrafter

    d = SuffixDrafter()
    empty = object_bytes(d)
    d.begin(list(range(200)) * 2)
    assert object_bytes(d) > 10 * empty


# -- report caveats and the command line ---------------------------------------------------------
def _row(config, **kw):
    row = {"config": config, "category": "all", "temperature": 0.0, "engaged": "yes", "by_drafter": {},
           "greedy_identical": None, "baseline": "none", "lossy": False}
    row.update(kw)
    return row


def test_caveats_name_the_known_traps():
    from specdec.bench.report import caveats

    r = {"configs": [{"label": "ngram-simple+draft-simple", "kind": "specdec", "speculation_path": "yes",
                      "types": ["ngram-simple", "draft-simple"]},
                     {"label": "suffix", "kind": "specdec", "speculation_path": "yes", "types": ["suffix"]}],
         "summary": [_row("ngram-simple+draft-simple", by_drafter={"ngram-simple": {}},
                          greedy_identical={"identical": 1, "compared": 3}),
                     _row("suffix", engaged="no")],
         "runs": [{"timing_source": "engine"}]}
    notes = caveats(r)
    assert any("draft-simple drafter was loaded but never drafted" in n for n in notes)
    assert any("suffix was configured but NEVER ENGAGED" in n for n in notes)
    assert any("2 of 3 greedy outputs differ" in n for n in notes)


def test_bench_checks_its_settings_before_loading_the_model(capsys):
    from specdec.cli import main

    assert main(["bench", "--model", "/no/such/model.gguf", "--methods", "none,bogus"]) == 2
    assert "unknown method 'bogus'" in capsys.readouterr().err
    assert main(["bench", "--model", "/no/such/model.gguf", "--prompts", "poetry"]) == 2
    assert "--prompts 'poetry'" in capsys.readouterr().err
