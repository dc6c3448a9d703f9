"""specdec export-config: llama.cpp, vLLM and SGLang flags for the same speculative settings."""

from __future__ import annotations

import json

import pytest

from helpers.spec import spec_of
from specdec.cli import main
from specdec.cli.export import export, format_export
from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig


def _flag(args, name):
    return args[args.index(name) + 1]


@pytest.mark.parametrize("types, draft", [
    (("ngram-simple",), None), (("suffix",), None), (("draft-simple",), "/m/draft.gguf"),
    (("draft-eagle3",), "/m/eagle"), (("draft-mtp",), None), (("draft-dflash",), "/m/dflash"),
    (("draft-dspark",), "/m/dspark"),
])
def test_vllm_config_round_trips_through_our_own_parser(types, draft):
    spec = SpecConfig(drafters=types, draft_n_max=4, draft_model=draft)
    vllm = export(spec, "/m/target.gguf")["vllm"]
    text = _flag(vllm["args"], "--speculative-config")
    back, _ = spec_of(speculative_config=text)
    assert back.types == types and back.draft_n_max == 4 and back.draft_model == draft
    assert json.loads(text) == vllm["speculative_config"]


def test_llama_cpp_flags():
    out = export(SpecConfig(drafters=("ngram-simple", "draft-simple"), draft_n_max=5, draft_n_min=2, draft_p_min=0.5,
                            draft_model="d.gguf"), "t.gguf")["llama.cpp"]
    args = out["args"]
    assert args[:3] == ["llama-server", "-m", "t.gguf"]
    assert _flag(args, "--spec-type") == "ngram-simple,draft-simple" and _flag(args, "-md") == "d.gguf"
    assert (_flag(args, "--spec-draft-n-max"), _flag(args, "--spec-draft-n-min"), _flag(args, "--spec-draft-p-min")) \
        == ("5", "2", "0.5")
    mapped = export(SpecConfig(drafters=(DrafterSpec.of("ngram-map-k4v", key_size=4, min_hits=2),
                                         DrafterSpec.of("ngram-mod", n_match=8, table_size=1024))), "t")["llama.cpp"]
    assert (_flag(mapped["args"], "--spec-ngram-map-k4v-size-n"), _flag(mapped["args"], "--spec-ngram-map-k4v-min-hits"),
            _flag(mapped["args"], "--spec-ngram-mod-n-match")) == ("4", "2", "8")
    assert any("ngram-mod's table_size=1024 has no llama.cpp flag" in n for n in mapped["notes"])
    suffix = export(SpecConfig(drafters=("suffix",)), "t")["llama.cpp"]
    assert _flag(suffix["args"], "--spec-type") == "ngram-simple"
    assert any("llama.cpp has no suffix (" in n for n in suffix["notes"])


def test_sglang_flags():
    out = export(SpecConfig(drafters=("draft-simple",), draft_n_max=3, draft_model="d"), "t")["sglang"]
    args = out["args"]
    assert _flag(args, "--speculative-algorithm") == "STANDALONE"
    assert _flag(args, "--speculative-draft-model-path") == "d"
    assert (_flag(args, "--speculative-num-steps"), _flag(args, "--speculative-eagle-topk"),
            _flag(args, "--speculative-num-draft-tokens")) == ("3", "1", "4")
    for types, algorithm in ((("draft-eagle3",), "EAGLE3"), (("draft-mtp",), "NEXTN"), (("draft-dflash",), "DFLASH"),
                             (("ngram-simple",), "NGRAM"), (("suffix",), "NGRAM")):
        spec = SpecConfig(drafters=types, draft_model="d" if types[0] != "draft-mtp" else None)
        args = export(spec, "t")["sglang"]["args"]
        assert _flag(args, "--speculative-algorithm") == algorithm
    assert "--speculative-draft-model-path" not in export(SpecConfig(drafters=("draft-mtp",)), "t")["sglang"]["args"]


def test_tree_shape_goes_to_sglang_and_is_a_note_elsewhere():
    out = export(SpecConfig(drafters=("draft-eagle3",), draft_n_max=3, tree_topk=2, tree_budget=5), "t")
    args = out["sglang"]["args"]
    assert (_flag(args, "--speculative-num-steps"), _flag(args, "--speculative-eagle-topk"),
            _flag(args, "--speculative-num-draft-tokens")) == ("3", "2", "6")
    assert any("token tree" in n for n in out["vllm"]["notes"] + out["llama.cpp"]["notes"])
    assert out["specdec"]["tree_topk"] == 2


def test_no_speculation_and_notes():
    out = export(SpecConfig(), "t")
    assert "--spec-type" not in out["llama.cpp"]["args"] and out["vllm"]["speculative_config"] is None
    assert "--speculative-algorithm" not in out["sglang"]["args"]
    spec = SpecConfig(drafters=("suffix", "draft-simple"), draft_model="d", adaptive=True, acceptance="typical")
    out = export(spec, "t")
    assert out["vllm"]["speculative_config"]["method"] == "draft_model"
    assert any("suffix dropped" in n for n in out["vllm"]["notes"])
    assert any("adaptive" in n for n in out["sglang"]["notes"])
    assert any("typical" in n for n in out["llama.cpp"]["notes"])
    assert "# vLLM" in format_export(out) and "note:" in format_export(out)


def test_cli_takes_the_generate_spec_flags(tiny_hf_dir, capsys):
    assert main(["export-config", "--model", str(tiny_hf_dir), "--spec-type", "ngram-map-k", "--spec-draft-n-max",
                 "6", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["specdec"]["types"] == ["ngram-map-k"] and out["vllm"]["speculative_config"]["method"] == "ngram"
    # llama.cpp's n-gram kinds take their own draft length; --spec-draft-n-max sets a draft model's only
    assert _flag(out["llama.cpp"]["args"], "--spec-ngram-map-k-size-m") == "6"
    assert "--spec-draft-n-max" not in out["llama.cpp"]["args"]
    assert any("llama.cpp loads GGUF files only: convert the model folder" in n for n in out["llama.cpp"]["notes"])
    assert main(["export-config", "--model", str(tiny_hf_dir), "--speculative-config",
                 '{"method": "suffix", "num_speculative_tokens": 2}']) == 0
    text = capsys.readouterr().out
    assert '"method": "suffix"' in text and "# SGLang" in text
    # nothing said: auto, chosen from the model's files
    assert main(["export-config", "--model", str(tiny_hf_dir), "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["specdec"]["types"] == ["suffix"] and "auto: auto chose suffix" in captured.err
    assert json.loads(captured.out)["specdec"]["adaptive"] is True  # what generate runs under auto (was false)


def test_ctx_size_is_carried_over_when_given_and_other_model_flags_are_noted(tiny_hf_dir, capsys):
    base = ["export-config", "--model", str(tiny_hf_dir), "--spec-type", "suffix", "--json"]
    assert main(base) == 0
    out = json.loads(capsys.readouterr().out)
    assert "-c" not in out["llama.cpp"]["args"] and "--max-model-len" not in out["vllm"]["args"]
    assert main(base + ["--ctx-size", "8192", "--device", "cpu", "--weights", "fp32"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert _flag(out["llama.cpp"]["args"], "-c") == "8192" and _flag(out["vllm"]["args"], "--max-model-len") == "8192"
    assert _flag(out["sglang"]["args"], "--context-length") == "8192" and out["specdec"]["ctx_size"] == 8192
    assert "--device cpu (where the target runs) is not carried over" in captured.err
    assert "--weights fp32 (specdec's in-memory weight format) is not carried over" in captured.err
    assert main(base + ["--ctx-size", "0"]) == 0  # the model's own: llama.cpp says so, the others by default
    out = json.loads(capsys.readouterr().out)
    assert _flag(out["llama.cpp"]["args"], "-c") == "0" and "--max-model-len" not in out["vllm"]["args"]
    assert main(base + ["--ctx-size", "-5"]) == 2
    assert "--ctx-size must be 0 (the model's context length) or more, got -5" in capsys.readouterr().err


def test_auto_sees_an_mtp_head_saved_beside_the_model(tmp_path, capsys):
    """export-config and inspect skipped auto's look beside the model for a trained MTP head."""
    import sys
    from pathlib import Path

    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).parent / "drafters"))
    from helpers.tiny import make_hf_model, tiny_config
    from mtp_helpers import deepseek_layout, mtp_block

    folder = make_hf_model(tmp_path / "target")
    (tmp_path / "target.mtp").mkdir()
    save_file(deepseek_layout([mtp_block(tiny_config(), seed=1)], 2), str(tmp_path / "target.mtp" / "model.safetensors"))
    assert main(["export-config", "--model", str(folder), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["specdec"]["types"] == ["suffix", "draft-mtp"]
    assert "MTP head beside the model" in captured.err
    for engine in ("llama.cpp", "vllm", "sglang"):  # the other engines cannot read specdec's head
        assert any(n.startswith(f"the MTP head is specdec's own (a head beside the model, {tmp_path / 'target.mtp'})")
                   for n in out[engine]["notes"]), engine
    assert main(["inspect", str(folder), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["auto"]["types"] == ["suffix", "draft-mtp"]
    assert any(m["method"] == "draft-mtp" and m["runs"] for m in report["methods"])
    assert main(["generate", "--model", str(folder), "--weights", "fp32", "-c", "128", "-n", "8", "--json",
                 "hello hello hello"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"]["method"] == "suffix,draft-mtp"



def test_dflash_goes_to_sglang_as_one_block_and_the_block_length_is_noted(tmp_path):
    folder = tmp_path / "dflash"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
        "intermediate_size": 96, "vocab_size": 512, "block_size": 16,
        "dflash_config": {"mask_token_id": 300, "target_layer_ids": [0, 1]}}))
    out = export(SpecConfig(drafters=("draft-dflash",), draft_model=str(folder), draft_n_max=15), "t")
    args = out["sglang"]["args"]  # as z-lab's README runs it: the block size is the draft tokens verified
    assert _flag(args, "--speculative-algorithm") == "DFLASH" and _flag(args, "--speculative-num-draft-tokens") == "16"
    assert _flag(args, "--speculative-draft-model-path") == str(folder)
    assert "--speculative-num-steps" not in args and "--speculative-eagle-topk" not in args
    assert out["vllm"]["speculative_config"] == {"method": "dflash", "num_speculative_tokens": 15, "model": str(folder)}
    assert not any("block" in n for n in out["vllm"]["notes"] + out["sglang"]["notes"])
    short = export(SpecConfig(drafters=("draft-dflash",), draft_model=str(folder), draft_n_max=3), "t")
    note = "the drafter's block of 16 drafts 15 tokens a step; the draft length 3 uses only part of it"
    assert any(note in n for n in short["vllm"]["notes"]) and any(note in n for n in short["sglang"]["notes"])
    # both have DSpark (vLLM's method "dspark" since 0.25, SGLang's DSPARK): it ran as DFLASH there, a DSpark
    # checkpoint loaded as another architecture
    spark = export(SpecConfig(drafters=("draft-dspark",), draft_model="/m/dspark"), "t")
    assert spark["vllm"]["speculative_config"]["method"] == "dspark" and not spark["vllm"]["notes"]
    assert _flag(spark["sglang"]["args"], "--speculative-algorithm") == "DSPARK" and not spark["sglang"]["notes"]


def test_settings_an_engine_has_no_flag_for_are_noted():
    """draft_n_min, draft_p_min and the n-gram sizes were dropped from some engines' lines without a word."""
    from specdec.drafters.registry import DrafterSpec

    out = export(SpecConfig(drafters=("draft-simple",), draft_model="d", draft_n_min=2, draft_p_min=0.5), "t")
    assert "--spec-draft-n-min" in out["llama.cpp"]["args"] and not out["llama.cpp"]["notes"]
    for engine, name in (("vllm", "vLLM"), ("sglang", "SGLang")):
        assert f"{name} has no minimum draft length (--spec-draft-n-min 2); dropped" in out[engine]["notes"]
    assert "SGLang has no draft probability floor (--spec-draft-p-min 0.5); dropped" in out["sglang"]["notes"]
    sized = export(SpecConfig(drafters=(DrafterSpec.of("ngram-simple", order_min=2, order_max=5),)), "t")
    assert sized["vllm"]["speculative_config"]["prompt_lookup_min"] == 2 and not any(
        "n-gram sizes" in n for n in sized["vllm"]["notes"])
    for engine in ("llama.cpp", "sglang"):
        assert any("n-gram sizes of ngram-simple (order_max=5, order_min=2) are not carried over" in n
                   for n in sized[engine]["notes"])


def test_draft_mtp_without_any_head_is_refused_as_generate_refuses_it(tiny_hf_dir, capsys):
    """It printed every engine's MTP flags with a note calling the (missing) head specdec's own."""
    assert main(["export-config", "--model", str(tiny_hf_dir), "--spec-type", "draft-mtp"]) == 2
    captured = capsys.readouterr()
    assert "has no MTP layers, no MTP head beside it and none shipped with specdec" in captured.err
    assert not captured.out


def test_a_catalogue_name_is_not_downloaded_to_print_flags(tmp_path, capsys, monkeypatch):
    from specdec.model import catalogue

    def no_pull(*args, **kwargs):
        raise AssertionError("export-config pulled a model")

    monkeypatch.setattr(catalogue, "pull", no_pull)
    monkeypatch.setattr(catalogue, "model_path", lambda name: tmp_path / f"{name}.gguf")  # not pulled here
    assert main(["export-config", "--model", "smollm2-135m", "--spec-type", "suffix", "--json"]) == 0
    captured = capsys.readouterr()
    pulled_to = str(tmp_path / "smollm2-135m.gguf")
    assert json.loads(captured.out)["llama.cpp"]["args"][:3] == ["llama-server", "-m", pulled_to]
    assert "note: smollm2-135m is not pulled yet; `specdec pull smollm2-135m` puts it at" in captured.err
    # auto reads the model's files: it asks for them, never downloads
    assert main(["export-config", "--model", "smollm2-135m", "--json"]) == 2
    assert "is not pulled; run `specdec pull smollm2-135m` (auto reads the model's files to choose), or name a " \
           "--spec-type" in capsys.readouterr().err


def test_a_registered_kind_without_engine_names_exports_without_speculation_there():
    """A kind added with registry.register and no vLLM / SGLang name: each line says so instead of failing."""
    from specdec.drafters import registry
    from specdec.drafters.ngram import NgramSimple
    from specdec.drafters.registry import Entry

    registry.register(Entry("test-export-kind", lambda ctx: NgramSimple()))
    try:
        out = export(SpecConfig(drafters=("test-export-kind",)), "m.gguf")
    finally:
        registry._entries.pop("test-export-kind", None)
    assert "SGLang has no test-export-kind: this command runs without speculation" in out["sglang"]["notes"]
    assert "--speculative-algorithm" not in out["sglang"]["args"]


@pytest.mark.parametrize("flags, message", [
    (["--speculative-config", '{"method": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}'],
     "ngram-simple: order_max (2) must be >= order_min (5)"),
    (["--speculative-config", '{"method": "ngram", "prompt_lookup_max": 0}'],
     "ngram-simple: order_min must be at least 1"),
])
def test_drafter_options_generate_refuses_are_refused(tiny_hf_dir, capsys, flags, message):
    """export-config printed every engine's flags for settings generate and serve refuse."""
    assert main(["export-config", "--model", str(tiny_hf_dir), *flags]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and not captured.out


def test_a_shipped_drafter_kind_without_a_head_is_refused(tiny_hf_dir, capsys):
    """draft-eagle3 without -md printed commands with no draft model, which no engine can run."""
    assert main(["export-config", "--model", str(tiny_hf_dir), "--spec-type", "draft-eagle3"]) == 2
    captured = capsys.readouterr()
    assert "draft-eagle3 needs an EAGLE-3 head for" in captured.err and "pass its folder with -md" in captured.err
    assert not captured.out


@pytest.mark.slow
def test_draft_eagle3_without_md_names_the_head_shipped_for_the_model(capsys):
    from specdec.drafters.mtp import HEADS_DIR

    assert main(["export-config", "--model", "smollm2-135m", "--spec-type", "draft-eagle3", "--json"]) == 0
    captured = capsys.readouterr()
    head = str(HEADS_DIR / "smollm2-135m" / "eagle3")
    out = json.loads(captured.out)
    assert out["specdec"]["draft_model"] == head and out["vllm"]["speculative_config"]["model"] == head
    sglang = out["sglang"]["args"]
    assert sglang[sglang.index("--speculative-draft-model-path") + 1] == head
    assert f"draft-eagle3 runs an EAGLE-3 head shipped with specdec, {head}" in captured.err
