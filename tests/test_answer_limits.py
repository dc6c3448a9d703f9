"""Where an answer ends on the command line: `specdec chat` answers until the model ends its turn or the context
is full (llama-cli's -n -1), and whenever a limit cuts an answer, generate and chat say which one on stderr;
-t/--threads, as llama.cpp names it, sets the threads every command computes with.

The tiny random model never ends a turn, so an answer without -n runs to the end of the context."""

from __future__ import annotations

import builtins
import json

import pytest
import torch

from specdec.cli import build_parser, main

CUT_AT_5 = "note: the answer was cut at 5 tokens (--max-tokens); -n -1 lets the model end it"


def run(capsys, monkeypatch, argv, lines=()) -> tuple[str, str]:
    typed = iter(lines)
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(typed))
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.out, captured.err


@pytest.fixture
def model(tiny_hf_dir):
    return ["--model", str(tiny_hf_dir), "--weights", "fp32", "--spec-type", "none"]


def test_chat_answers_past_128_tokens_to_the_end_of_the_context_and_says_so(capsys, monkeypatch, model):
    """chat cut every answer at 128 tokens (the shared -n default), mid-sentence and without a word."""
    _, err = run(capsys, monkeypatch, ["chat", *model, "-c", "200"], ["hello", ""])
    assert "note: the answer stopped at the end of the 200-token context (--ctx-size)" in err
    assert "--max-tokens" not in err
    _, err = run(capsys, monkeypatch, ["chat", *model, "-c", "200", "-n", "5"], ["hello", "again", ""])
    assert err.count(CUT_AT_5) == 2  # every cut answer says so
    _, err = run(capsys, monkeypatch, ["chat", *model, "-c", "200", "--stop", "<"], ["hello", ""])
    assert "note:" not in err  # a stop string ended it: no limit cut it


def test_generate_says_when_its_limit_cut_the_answer(capsys, monkeypatch, model):
    out, err = run(capsys, monkeypatch, ["generate", *model, "-c", "64", "-n", "5", "--json", "hello"])
    assert json.loads(out)["finish_reason"] == "length" and CUT_AT_5 in err
    _, err = run(capsys, monkeypatch, ["generate", *model, "-c", "64", "-n", "-1", "hello"])
    assert "note: the answer stopped at the end of the 64-token context (--ctx-size)" in err
    out, err = run(capsys, monkeypatch, ["generate", *model, "-c", "64", "-n", "40", "--stop", "<", "--json", "hello"])
    assert json.loads(out)["finish_reason"] == "stop" and "note:" not in err


def test_threads_is_set_before_the_model_loads_and_every_command_takes_it(capsys, monkeypatch, model):
    from specdec.model import load as load_module

    before = torch.get_num_threads()
    seen = {}
    real_load = load_module.load_model

    def load_model(*args, **kwargs):  # the GGUF repack runs on the threads too: they are set first
        seen["threads"] = torch.get_num_threads()
        return real_load(*args, **kwargs)

    monkeypatch.setattr("specdec.engine.setup.load_model", load_model)
    other = 1 if before != 1 else 2
    try:
        run(capsys, monkeypatch, ["generate", *model, "-t", str(other), "-n", "2", "hello"])
        assert seen["threads"] == torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)
    parser = build_parser()
    for command in (["generate", "hi"], ["chat"], ["serve"], ["bench"], ["tune"]):
        assert parser.parse_args([*command, "-t", "3"]).threads == 3
        assert parser.parse_args([*command, "--threads", "3"]).threads == 3
    assert parser.parse_args(["chat"]).max_tokens == -1 and parser.parse_args(["generate", "hi"]).max_tokens == 128


@pytest.mark.parametrize("flags, expected", [([], 200), (["-n", "64"], 64)])
def test_serve_answers_a_request_without_max_tokens_to_the_end_as_llama_server(capsys, monkeypatch, model, flags,
                                                                                expected):
    """The page and any client that names no max_tokens got 256 tokens at most; now the room the context leaves
    (make_job caps the default by it), as llama-server's -n -1 and vLLM's chat endpoint do."""
    seen = {}

    class Served(Exception):
        pass

    def create_app(engine, name, **settings):
        seen.update(settings)
        raise Served  # stop before uvicorn runs

    monkeypatch.setattr("specdec.cli.serve.create_app", create_app)
    with pytest.raises(Served):
        main(["serve", *model, "--port", "0", "-c", "200", *flags])
    assert seen["default_max_tokens"] == expected
