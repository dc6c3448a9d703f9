"""inspect, export-config and generate on a Gemma 4 target with its assistant (tests/model/data/gemma4-tiny): the
assistant lights draft-mtp up when given with -md or found beside the model (`<model>-assistant`), inspect says
what the layers are and where the drafter is, export-config names the assistant as llama.cpp's -md."""

from __future__ import annotations

import json
import shutil

from helpers.gemma4 import FIXTURE
from specdec.cli import main


def _beside(tmp_path):
    shutil.copytree(FIXTURE / "hf", tmp_path / "g4")
    shutil.copytree(FIXTURE / "assistant", tmp_path / "g4-assistant")
    return tmp_path / "g4", tmp_path / "g4-assistant"


def test_inspect_names_the_layers_and_the_assistant(tmp_path, capsys):
    assert main(["inspect", str(FIXTURE / "hf"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert "2 global (kv 1, dim 32, RoPE on 8 of 32 dims, values = keys)" in r["config"]["gemma4"]
    assert "assistant checkpoint" in r["mtp"]["note"] and "none given" in r["mtp"]["note"]
    assert "tiny reference checkpoints only" in r["family_note"]
    assert r["auto"]["types"] == ["suffix"] and not any(m["method"] == "draft-mtp" for m in r["methods"])
    model, helper = _beside(tmp_path)
    for args, where in (([str(model)], f"found beside the model ({helper})"),
                        ([str(FIXTURE / "hf"), "-md", str(FIXTURE / "assistant")], "given with -md")):
        assert main(["inspect", *args, "--json"]) == 0
        r = json.loads(capsys.readouterr().out)
        assert where in r["mtp"]["note"]
        assert r["auto"]["types"] == ["suffix", "draft-mtp"]
        assert any(m["method"] == "draft-mtp" and m["runs"] for m in r["methods"])
    assert main(["inspect", str(FIXTURE / "assistant"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert not r["runnable"] and "give it with -md" in r["not_runnable_reason"]
    assert "cannot run it yet" not in r["not_runnable_reason"]


def test_export_and_generate_run_the_assistant_found_beside_the_model(tmp_path, capsys):
    model, helper = _beside(tmp_path)
    assert main(["export-config", "--model", str(model), "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["specdec"]["types"] == ["suffix", "draft-mtp"] and out["specdec"]["draft_model"] == str(helper)
    assert "-md " + str(helper) in out["llama.cpp"]["command"]
    assert not any("specdec's own" in n for engine in ("llama.cpp", "vllm") for n in out[engine]["notes"])
    assert main(["generate", "--model", str(model), "--weights", "fp32", "-c", "128", "-n", "8", "--json",
                 "hello hello hello"]) == 0
    assert json.loads(capsys.readouterr().out)["spec"]["method"] == "suffix,draft-mtp"
