"""specdec inspect: real GGUF files, and synthetic checkpoints that declare MTP layers with and without weights."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.tiny import make_gguf_model, make_hf_model, random_eagle3_head
from specdec.drafters.eagle3 import save_eagle3_head
from specdec.cli import main
from specdec.cli.inspect import format_report, inspect_model
from specdec.model.catalogue import MODELS


def _mtp_tensors(layer: int, hidden: int = 64) -> dict:
    """DeepSeek-V3-style MTP weights: model.layers.<num_hidden_layers>.{enorm,hnorm,eh_proj,...}."""
    p = f"model.layers.{layer}."
    return {p + "enorm.weight": torch.ones(hidden), p + "hnorm.weight": torch.ones(hidden),
            p + "eh_proj.weight": torch.zeros(hidden, 2 * hidden), p + "shared_head.norm.weight": torch.ones(hidden)}


def without(monkeypatch, *kinds):
    """A build of specdec that cannot run these drafter kinds (their registry entries lose their builder)."""
    from dataclasses import replace

    from specdec.drafters import registry

    for kind in kinds:
        monkeypatch.setitem(registry._entries, kind, replace(registry.entry(kind), build=None))


@pytest.fixture
def build_without_mtp_or_eagle(monkeypatch):
    without(monkeypatch, "draft-mtp", "draft-eagle3")


@pytest.fixture
def build_with_mtp_and_eagle():
    """This build: it runs both (the registry as shipped)."""


# -- synthetic HF folders ---------------------------------------------------------------------
def test_hf_config_declares_mtp_and_carries_the_weights(tmp_path, build_without_mtp_or_eagle):
    folder = make_hf_model(tmp_path / "m", extra_config={"num_nextn_predict_layers": 1}, extra_tensors=_mtp_tensors(2))
    r = inspect_model(str(folder))
    assert r["runnable"] and r["architecture"] == "llama"
    assert r["mtp"]["declared"] == 1 and r["mtp"]["config_key"] == "num_nextn_predict_layers"
    assert r["mtp"]["weights_present"] and r["mtp"]["tensors"] == 4
    mtp = next(m for m in r["methods"] if m["method"] == "draft-mtp")
    assert not mtp["runs"] and mtp["note"] == "model declares MTP but specdec cannot run it yet"
    assert "suffix" in r["auto"]["types"] and "draft-mtp" not in r["auto"]["types"]
    assert any("specdec cannot run MTP yet" in reason for reason in r["auto"]["reasons"])
    assert "cannot run it yet" in format_report(r)


def test_mtp_is_listed_and_chosen_once_specdec_runs_it(tmp_path, build_with_mtp_and_eagle):
    folder = make_hf_model(tmp_path / "m", extra_config={"num_nextn_predict_layers": 1}, extra_tensors=_mtp_tensors(2))
    r = inspect_model(str(folder))
    mtp = next(m for m in r["methods"] if m["method"] == "draft-mtp")
    assert mtp["runs"] and mtp["note"] == "MTP layers present"
    assert r["auto"]["types"] == ["suffix", "draft-mtp"]


def test_hf_config_declares_mtp_but_the_file_lacks_the_weights(tmp_path, build_with_mtp_and_eagle):
    folder = make_hf_model(tmp_path / "m", extra_config={"num_nextn_predict_layers": 1})
    r = inspect_model(str(folder))
    assert r["mtp"]["declared"] == 1 and not r["mtp"]["weights_present"]
    assert "declares 1 MTP layer(s)" in r["mtp"]["note"] and "no MTP weights" in r["mtp"]["note"]
    mtp = next(m for m in r["methods"] if m["method"] == "draft-mtp")
    assert not mtp["runs"] and "lacks their weights" in mtp["note"]
    assert any("lacks their weights" in reason for reason in r["auto"]["reasons"])


@pytest.mark.parametrize("prefix", ["mtp.layers.0.", "model.mtp_layers.0."])
def test_qwen3_next_style_mtp_tensor_names(tmp_path, prefix):
    extra = {prefix + "fc.weight": torch.zeros(64, 128), prefix + "norm.weight": torch.ones(64)}
    folder = make_hf_model(tmp_path / "m", extra_config={"mtp_num_hidden_layers": 1}, extra_tensors=extra)
    mtp = inspect_model(str(folder))["mtp"]
    assert mtp["declared"] == 1 and mtp["config_key"] == "mtp_num_hidden_layers"
    assert mtp["weights_present"] and mtp["tensors"] == 2


def test_no_mtp_and_plain_facts(tiny_hf_dir, build_without_mtp_or_eagle):
    r = inspect_model(str(tiny_hf_dir), weights="fp32")
    assert r["mtp"] == {"declared": 0, "config_key": None, "weights_present": False, "tensors": 0, "examples": [],
                        "note": "no MTP layers"}
    assert not any(m["method"] == "draft-mtp" for m in r["methods"])
    c = r["config"]
    assert (c["layers"], c["hidden_size"], c["vocab_size"]) == (2, 64, 512)
    assert r["parameters"] == 512 * 64 * 2 + 64 + 2 * (64 * 64 * 2 + 32 * 64 * 2 + 3 * 128 * 64 + 2 * 64)
    assert r["tokenizer"]["chat_template"] and r["tokenizer"]["eos"] == ["<|im_end|>"]
    assert r["memory"]["kv_bytes_per_1k_tokens"] == 2 * 2 * 2 * 16 * 4 * 1024  # fp32 weights: a float32 cache
    assert r["auto"]["types"] == ["suffix"]
    int8 = inspect_model(str(tiny_hf_dir), weights="int8")  # the runtime's f16 cache, said float32 before
    assert int8["memory"]["kv_cache"] == "float16" and int8["memory"]["kv_bytes_per_1k_tokens"] == 2 * 2 * 2 * 16 * 2 * 1024
    assert "loaded as int8" in format_report(int8) and "per 1k tokens (float16, the CPU default)" in format_report(int8)


def test_architecture_specdec_cannot_run_is_still_described(tmp_path):
    folder = make_hf_model(tmp_path / "ds", extra_config={"model_type": "deepseek_v3", "num_nextn_predict_layers": 1},
                           extra_tensors=_mtp_tensors(2))
    r = inspect_model(str(folder))
    assert not r["runnable"] and "DeepSeek-V3 attends with multi-head latent attention (MLA): specdec cannot run it " \
        "yet" in r["not_runnable_reason"]
    assert r["architecture"] == "deepseek_v3" and r["mtp"]["weights_present"]
    assert not any(m["runs"] for m in r["methods"]) and "auto" not in r
    assert next(m for m in r["methods"] if m["method"] == "draft-mtp")["note"].endswith(
        "; the model itself cannot run here")
    assert "runs here     NO" in format_report(r)


def test_a_config_without_num_hidden_layers_has_no_mtp_layers(tmp_path):
    """Every layer counted as 'past the main ones': inspect reported 18 MTP-like tensors and 'no draft-mtp:
    MTP layers present' for a folder whose config.json lacks num_hidden_layers."""
    folder = make_hf_model(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (folder / "config.json").write_text(json.dumps(cfg))
    r = inspect_model(str(folder))
    assert not r["runnable"] and "lacks 'num_hidden_layers'" in r["not_runnable_reason"]
    assert not r["mtp"]["weights_present"] and r["mtp"]["note"] == "no MTP layers"
    assert not any(m["method"] == "draft-mtp" for m in r["methods"])


@pytest.mark.parametrize("model_type, family, key", [
    ("deepseek_v3", "DeepSeek-V3 attends with multi-head latent attention (MLA)", "num_nextn_predict_layers"),
])
def test_families_specdec_cannot_run_are_named_and_their_mtp_reported(tmp_path, model_type, family, key):
    folder = make_hf_model(tmp_path / model_type, extra_config={"model_type": model_type, key: 1})
    r = inspect_model(str(folder))
    assert not r["runnable"] and family in r["not_runnable_reason"]
    assert r["mtp"]["declared"] == 1 and r["mtp"]["config_key"] == key
    assert r["quantization"] == "F32"  # the weights' dtype ("safetensors" named the file format)


def test_eagle3_drafter_is_recognised(tmp_path, tiny_hf_dir, tiny_model, monkeypatch):
    eagle = save_eagle3_head(random_eagle3_head(tiny_model), tmp_path / "eagle")
    without(monkeypatch, "draft-mtp", "draft-eagle3")
    r = inspect_model(str(tiny_hf_dir), draft=str(eagle))
    assert r["drafter"]["kind"] == "draft-eagle3" and r["drafter"]["compatible"]
    m = next(m for m in r["methods"] if m["method"] == "draft-eagle3")
    assert not m["runs"] and "cannot run draft-eagle3 yet" in m["note"]
    assert any("cannot run draft-eagle3 yet" in reason for reason in r["auto"]["reasons"])
    monkeypatch.undo()  # this build: it runs EAGLE-3
    r = inspect_model(str(tiny_hf_dir), draft=str(eagle))
    assert next(m for m in r["methods"] if m["method"] == "draft-eagle3")["runs"]
    assert r["auto"]["types"] == ["suffix", "draft-eagle3"]
    # a head trained for another model (other hidden size) is named as such
    other = make_hf_model(tmp_path / "eagle-other", layers=1, hidden=32, heads=2, kv_heads=1,
                          extra_config={"architectures": ["LlamaForCausalLMEagle3"]})
    r = inspect_model(str(tiny_hf_dir), draft=str(other))
    assert not r["drafter"]["compatible"] and "expects target hidden size 32" in r["drafter"]["reason"]
    assert "draft-eagle3" not in r["auto"]["types"]


def _edit_layer(file, **keys):
    """Set keys of the decoder layer a speculators-format head's config.json describes (transformer_layer_config)."""
    raw = json.loads(file.read_text())
    raw["transformer_layer_config"].update(keys)
    file.write_text(json.dumps(raw))


@pytest.mark.parametrize("damage, reason", [
    (lambda f: (f / "model.safetensors").write_bytes(b"\0" * 100), "not a readable safetensors file"),
    (lambda f: _edit_layer(f / "config.json", intermediate_size=96), "tensors of the wrong shape"),
])
def test_inspect_refuses_the_eagle3_heads_the_loader_refuses(tmp_path, tiny_hf_dir, tiny_model, damage, reason):
    """inspect said 'compatible' (and auto chose the head) for folders the loader then refused."""
    eagle = save_eagle3_head(random_eagle3_head(tiny_model), tmp_path / "eagle")
    damage(eagle)
    r = inspect_model(str(tiny_hf_dir), draft=str(eagle))
    assert not r["drafter"]["compatible"] and reason in r["drafter"]["reason"]
    assert "draft-eagle3" not in r["auto"]["types"]


def test_draft_model_compatibility(tmp_path, tiny_hf_dir):

    same = inspect_model(str(tiny_hf_dir), draft=str(tiny_hf_dir))
    assert same["drafter"]["kind"] == "draft-simple" and same["drafter"]["compatible"]
    assert next(m for m in same["methods"] if m["method"] == "draft-simple")["runs"]
    assert same["memory"]["drafter_bytes"] > 0

    other = make_hf_model(tmp_path / "other", vocab=1024)
    r = inspect_model(str(tiny_hf_dir), draft=str(other))
    assert not r["drafter"]["compatible"] and "vocabulary sizes differ" in r["drafter"]["reason"]
    m = next(m for m in r["methods"] if m["method"] == "draft-simple")
    assert not m["runs"] and "--spec-cross-tokenizer" in m["note"]


# -- GGUF ---------------------------------------------------------------------------------------
def _gguf_with(monkeypatch, path, nextn: int, with_nextn_tensors: bool, layers: int):
    """make_gguf_model plus <arch>.nextn_predict_layers (and blk.N.nextn.* tensors) in the file."""
    import gguf

    original = gguf.GGUFWriter.write_header_to_file

    def patched(self, *args, **kwargs):
        self.add_uint32("llama.nextn_predict_layers", nextn)
        if with_nextn_tensors:
            for name in ("eh_proj.weight", "enorm.weight", "hnorm.weight"):
                shape = (64, 128) if name.startswith("eh_proj") else (64,)
                self.add_tensor(f"blk.{layers - 1}.nextn.{name}", np.zeros(shape, dtype=np.float32))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFWriter, "write_header_to_file", patched)
    make_gguf_model(path, layers=layers)
    monkeypatch.undo()
    return path


def test_gguf_with_nextn_tensors(tmp_path, monkeypatch):
    # three blocks in the file, the last one the MTP block (as llama.cpp converts GLM-4.5)
    path = _gguf_with(monkeypatch, tmp_path / "mtp.gguf", 1, True, layers=3)
    r = inspect_model(str(path))
    assert r["runnable"] and r["config"]["layers"] == 2
    assert r["mtp"]["declared"] == 1 and r["mtp"]["config_key"] == "llama.nextn_predict_layers"
    assert r["mtp"]["weights_present"]
    assert r["mtp"]["tensors"] == 9 + 3  # the block's own tensors and its blk.2.nextn.* ones


def test_gguf_declaring_nextn_without_weights(tmp_path, monkeypatch):
    import gguf

    original = gguf.GGUFWriter.add_block_count
    monkeypatch.setattr(gguf.GGUFWriter, "add_block_count", lambda self, n: original(self, n + 1))
    path = _gguf_with(monkeypatch, tmp_path / "dropped.gguf", 1, False, layers=2)
    r = inspect_model(str(path))
    assert r["runnable"] and r["config"]["layers"] == 2
    assert r["mtp"]["declared"] == 1 and not r["mtp"]["weights_present"]
    assert "no MTP weights" in r["mtp"]["note"]


# -- command line -------------------------------------------------------------------------------
def test_cli_json_and_text(tiny_hf_dir, capsys):
    assert main(["inspect", str(tiny_hf_dir), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["architecture"] == "llama" and r["mtp"]["note"] == "no MTP layers"
    assert main(["inspect", str(tiny_hf_dir)]) == 0
    text = capsys.readouterr().out
    for label in ("architecture", "parameters", "quantization", "context", "tokenizer", "MTP", "memory", "methods",
                  "auto"):
        assert f"\n{label}" in text
    assert main(["inspect", str(tiny_hf_dir / "missing")]) == 2


# -- real GGUF files ----------------------------------------------------------------------------
@pytest.mark.slow
def test_real_smollm(smollm):
    from specdec.bench.memory import transformer_bytes

    r = inspect_model("smollm2-135m")
    assert r["sha256"] == MODELS["smollm2-135m"].sha256
    assert (r["architecture"], r["quantization"], r["context_length"]) == ("llama", "Q4_1", 8192)
    assert r["parameters"] == smollm.info.params
    assert r["tokenizer"]["vocab_size"] == 49152 and r["tokenizer"]["chat_template"]
    assert r["mtp"]["declared"] == 0 and not r["mtp"]["weights_present"]
    # the estimate is what the built model really holds
    assert r["memory"]["weights_bytes"]["int8"] == transformer_bytes(smollm.transformer)
    # the heads shipped for it run without -md (generate --spec-type draft-mtp / draft-eagle3): inspect said
    # neither ran
    runs = {m["method"]: (m["runs"], m["note"]) for m in r["methods"]}
    assert runs["draft-mtp"][0] and runs["draft-mtp"][1].startswith("MTP head shipped with specdec, ")
    assert runs["draft-eagle3"][0] and "heads/smollm2-135m/eagle3 (used without -md)" in runs["draft-eagle3"][1]


@pytest.mark.slow
def test_real_qwen_pair_is_compatible():
    r = inspect_model("qwen2.5-coder-1.5b", draft="qwen2.5-coder-0.5b")
    assert (r["architecture"], r["quantization"]) == ("qwen2", "Q4_K_M")
    assert r["drafter"]["kind"] == "draft-simple" and r["drafter"]["compatible"]
    assert next(m for m in r["methods"] if m["method"] == "draft-simple")["runs"]
    assert r["mtp"]["note"] == "no MTP layers"
    # a compatible draft model is still not chosen by auto on CPU (facts table: slower)
    assert r["auto"]["types"] == ["suffix"]
    assert any("draft-simple qwen2.5-coder-0.5b not used" in reason for reason in r["auto"]["reasons"])


@pytest.mark.slow
def test_real_mismatched_draft_names_the_difference():
    r = inspect_model("smollm2-135m", draft="qwen2.5-coder-0.5b")
    assert not r["drafter"]["compatible"]
    assert "BOS/EOS" in r["drafter"]["reason"] and "qwen2.5-coder-0.5b" in r["drafter"]["reason"]


def test_dflash_and_dspark_folders_are_recognised_and_checked_against_the_target(tmp_path, tiny_hf_dir):
    from dataclasses import replace

    from specdec.drafters.block.config import BlockConfig

    def write(name, cfg):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(cfg.to_json()))
        return str(folder)

    cfg = BlockConfig(layout="dflash", hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
                      intermediate_size=96, vocab_size=512, target_layer_ids=(0, 1), mask_token_id=300, block_size=4,
                      num_target_layers=2)
    r = inspect_model(str(tiny_hf_dir), draft=write("dflash", cfg))
    assert r["drafter"]["kind"] == "draft-dflash" and r["drafter"]["compatible"]
    assert r["drafter"]["block"]["drafts_per_block"] == 3
    assert next(m for m in r["methods"] if m["method"] == "draft-dflash")["runs"]
    assert "dflash block of 4 (3 drafts a step: --spec-draft-n-max 3), 1 layers on target layers [0, 1]" \
        in format_report(r)
    r = inspect_model(str(tiny_hf_dir), draft=write("other", replace(cfg, num_target_layers=36)))
    assert not r["drafter"]["compatible"] and "was trained on a target with 36 layers" in r["drafter"]["reason"]
    assert not next(m for m in r["methods"] if m["method"] == "draft-dflash")["runs"]
    r = inspect_model(str(tiny_hf_dir), draft=write("nomask", replace(cfg, mask_token_id=None)))
    assert not r["drafter"]["compatible"] and "has no mask_token_id" in r["drafter"]["reason"]
    spark = replace(cfg, layout="dspark", markov_rank=8, markov_head_type="vanilla", confidence_head=True)
    r = inspect_model(str(tiny_hf_dir), draft=write("dspark", spark))
    assert r["drafter"]["kind"] == "draft-dspark" and r["drafter"]["compatible"]
    assert "dspark block of 4 (4 drafts a step" in format_report(r)
    assert "Markov rank 8 (vanilla), confidence head (--spec-draft-p-min)" in format_report(r)


def test_an_mtp_head_folder_without_weights_is_not_called_compatible(tiny_hf_dir, tmp_path):
    """inspect said the head runs ("compatible", draft-mtp given) where generate refuses it for want of
    model.safetensors."""
    import json

    from specdec.drafters.describe import describe_drafter
    from specdec.model.load import open_checkpoint

    checkpoint, _ = open_checkpoint(tiny_hf_dir)
    c = checkpoint.config
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text(json.dumps({"specdec": {"kind": "mtp", "target": {
        "hidden_size": c.hidden_size, "num_layers": c.num_layers, "vocab_size": c.vocab_size}}}))
    facts = describe_drafter(head, checkpoint, None, "tiny")
    assert facts["kind"] == "draft-mtp" and not facts["compatible"]
    assert facts["reason"] == f"the MTP head {head} has no model.safetensors"
