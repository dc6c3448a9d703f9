"""`specdec tune` measures what auto could run and saves it; auto then chooses from the measurement."""

from __future__ import annotations

import json

import pytest

from specdec.cli import main


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path))
    return tmp_path


def test_tune_saves_a_calibration_that_auto_reads_and_names(tiny_hf_dir, home, capsys):
    prompts = home / "prompts.jsonl"
    prompts.write_text('{"id": "a", "category": "code", "text": "x = 1\\ny = 2\\nx = 1\\ny ="}\n'
                       '{"id": "b", "category": "edit", "text": "the cat sat on the mat. the cat sat on"}\n')
    args = ["--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "256"]
    assert main(["tune", *args, "--methods", "suffix,ngram-simple", "--max-tokens", "8", "--repeats", "1",
                 "--temperature", "0", "--prompts", str(prompts), "--no-progress"]) == 0
    out = capsys.readouterr()
    saved = list((home / "tune").glob("*.json"))
    assert len(saved) == 1 and str(saved[0]) in out.err
    data = json.loads(saved[0].read_text())
    assert [m["method"] for m in data["measured"]] == ["ngram-simple", "suffix"]
    assert set(data["measured"][0]["speedups"]) == {"code@0", "edit@0", "all@0"}
    assert main(["generate", *args, "-n", "4", "--json", "hello"]) == 0
    err = capsys.readouterr().err
    assert f"auto: measured on this machine, {saved[0]}" in err
    assert "not measured on this machine" not in err


def test_tune_refuses_a_configuration_auto_could_not_run(tiny_hf_dir, home, capsys):
    assert main(["tune", "--model", str(tiny_hf_dir), "--weights", "fp32", "--methods", "suffix+draft-mtp"]) == 2
    assert "suffix+draft-mtp: not a configuration auto could run for this model" in capsys.readouterr().err
    assert not (home / "tune").exists()
