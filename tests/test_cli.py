"""The command line's bad input: one line on stderr and exit status 2, never a traceback, and a flag
that cannot work is refused before a model loads."""

from __future__ import annotations

import builtins
import json

import pytest

from specdec.cli import main

MISSING = "/nonexistent/model.gguf"  # a flag checked before loading is refused before this is looked for


def run(capsys, argv) -> tuple[int, str, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return rc, captured.out, captured.err


def run_chat(capsys, monkeypatch, lines: list[str], argv) -> tuple[int, str, str]:
    """`specdec chat` with argv, typing `lines` (an empty one ends the chat)."""
    typed = iter(lines)
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(typed))
    return run(capsys, ["chat", *argv])


@pytest.mark.parametrize("argv, message", [
    (["generate", "-c", "-5", "hi"], "--ctx-size must be 0 (the model's context length) or more, got -5"),
    (["generate", "-n", "-2", "hi"], "--max-tokens must be at least 1, or -1 (until the model ends the answer or "
     "the context is full), got -2"),  # -1 is llama.cpp's "until the end"
    (["generate", "-t", "0", "hi"], "--threads must be a whole number of at least 1, got 0"),  # was RuntimeError
    (["chat", "--threads", "-2"], "--threads must be a whole number of at least 1, got -2"),
    (["serve", "-t", "0"], "--threads must be a whole number of at least 1, got 0"),
    (["generate", ""], "the prompt is empty: give it as an argument, with --file or on stdin"),  # said after loading
    (["generate", "--file", "/nonexistent/prompt.txt"], "cannot read the prompt file /nonexistent/prompt.txt: No such"),
    (["generate", "--file", "a-file", "hi"], "give the prompt as an argument or with --file, not both"),
    (["serve", "--max-tokens", "0"], "--max-tokens must be at least 1, or -1 (until the model ends the answer or "
     "the context is full), got 0"),
    (["generate", "--temp", "1", "--seed", str(10**24), "hi"], "seed must be an integer in [-2**63, 2**64)"),
    (["generate", "--temp", "inf", "hi"], "temperature must be a finite number >= 0, got inf"),
    (["generate", "--speculative-config", '{"method": "ngram", "draft_p_min": "abc"}', "hi"],
     'draft_p_min must be a number, got "abc"'),
    (["generate", "--speculative-config", '{"method": "draft_model", "model": 123}', "hi"],
     "model must be a string"),
    (["generate", "--speculative-config", '{"method": "ngram", "adaptive": "no"}', "hi"],
     'adaptive must be true or false, got "no"'),
    (["generate", "--speculative-config", '{"method": "ngram", "prompt_lookup_max": -1}', "hi"],
     "ngram-simple: order_min must be at least 1 (got -1)"),  # was said after the model loaded
    (["serve", "--port", "99999"], "--port must be between 0 and 65535, got 99999"),
    (["serve", "--request-timeout", "nan"], "--request-timeout must be a positive number of seconds, got nan"),
    (["serve", "--api-key", ""], "--api-key is empty, which would let every request in"),
    (["serve", "-c", "-1"], "--ctx-size must be 0"),
    (["train", "mtp", "--steps", "-1"], "--steps must be at least 0, got -1"),
    (["train", "eagle3", "--lr", "nan", "--out", "x"], "--lr must be a positive number, got nan"),
    (["train", "mtp", "--device", "gpu0"], "unknown device 'gpu0'; choose cpu or cuda"),  # was a traceback
    (["bench", "--repeats", "0"], "--repeats must be at least 1, got 0"),
    (["bench", "--temperature", ""], "--temperature names no temperature: ''"),  # was an IndexError after loading
    (["bench", "--temperature", "0,-1"], "--temperature: temperature must be a finite number >= 0, got -1.0"),
    (["bench", "--temperature", "0,0"], "--temperature lists a temperature twice"),
    (["bench", "-n", "0"], "--max-tokens must be at least 1, got 0"),  # was raised after the first round
    (["bench", "-t", "-2"], "--threads must be a whole number of at least 1, got -2"),  # was a RuntimeError traceback
    (["bench", "--spec-type", "ngram-simple", "--requests", "5"], "--spec-type, --requests set the server-load "
     "mode (--concurrency); the method bench measures --methods"),  # were ignored: the default methods ran
    (["bench", "--draft-lengths", "2,0"], "--draft-lengths takes distinct lengths from 1 to 32, got '2,0'"),
    (["bench", "--concurrency", "", "--url", "http://127.0.0.1:1/v1"], "--concurrency needs levels of at least 1"),
    (["bench", "--concurrency", "1", "--url", "http://127.0.0.1:1/v1", "--request-timeout", "nan"],
     "--request-timeout must be a positive number of seconds, got nan"),
    (["bench", "--concurrency", "1", "--server-start-timeout", "nan"],
     "--server-start-timeout must be a positive number of seconds, got nan"),
    # results written after a run of many minutes: where they cannot be, say so before it
    (["bench", "--out", "a-file"], "--out a-file is a file; give a folder to write into"),
    (["bench", "--concurrency", "1", "--out", "a-file/x"], "--out a-file/x: cannot write there (Not a directory)"),
    (["train", "eagle3", "--out", "a-file"], "--out a-file is a file"),
    (["generate", "--compact", "hi"], "--compact prints --json's object on one line; add --json"),  # was ignored
])
def test_a_bad_flag_is_one_line_before_the_model_loads(capsys, monkeypatch, tmp_path, argv, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    rc, _, err = run(capsys, argv + ["--model", MISSING])
    assert rc == 2
    assert err.startswith("specdec: error: ") and message in err and MISSING not in err


def test_a_prompt_that_is_not_utf8_is_one_line(capsys, tiny_hf_dir):
    """Bytes that are not UTF-8 in argv or stdin reach Python as lone surrogates (surrogateescape)."""
    base = ["generate", "--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "128", "-n", "2", "--spec-type",
            "none"]
    rc, out, err = run(capsys, base + ["def f(\udcff):"])
    assert rc == 2 and "the text is not valid UTF-8: character 6 is '\\udcff'" in err and not out
    rc, out, _ = run(capsys, base + ["--json", "def f():"])
    assert rc == 0 and len(json.loads(out)["token_ids"]) == 2


def test_a_prompt_from_stdin_or_a_file_loses_one_trailing_line_end(capsys, monkeypatch, tmp_path, tiny_hf_dir):
    """`echo P | specdec generate` and `specdec generate -f FILE` (an editor ends FILE with a newline) mean P."""
    import io
    base = ["generate", "--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "128", "-n", "2", "--spec-type",
            "none", "--json"]

    def prompt_tokens(argv, stdin=""):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        rc, out, err = run(capsys, base + argv)
        assert rc == 0, err
        return json.loads(out)["prompt_tokens"]

    plain, two_lines = prompt_tokens(["def f():"]), prompt_tokens(["def f():\n\n"])
    assert plain != two_lines
    assert prompt_tokens([], stdin="def f():\n") == plain
    assert prompt_tokens([], stdin="def f():\n\n\n") == two_lines  # only one line end goes
    for text, want in (("def f():\r\n", plain), ("def f():", plain), ("def f():\n\n\n", two_lines)):
        (tmp_path / "p.txt").write_bytes(text.encode())
        assert prompt_tokens(["-f", str(tmp_path / "p.txt")]) == want


def test_chat_refuses_a_line_that_is_not_utf8_and_goes_on(capsys, monkeypatch, tiny_hf_dir):
    rc, out, err = run_chat(capsys, monkeypatch, ["caf\udce9", "hello", ""],
                            ["--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "128", "-n", "2", "--spec-type",
                             "none"])
    assert rc == 0
    assert "specdec: error: the text is not valid UTF-8" in err and "the line was not sent" in err
    assert err.count("speculation: off") == 1  # the next line was answered


def test_train_on_a_prompts_file_with_no_prompts_says_so(capsys, tmp_path, tiny_hf_dir):
    blank = tmp_path / "prompts.txt"
    blank.write_text("\n   \n")
    rc, _, err = run(capsys, ["train", "mtp", "--model", str(tiny_hf_dir), "--prompts", str(blank), "--steps", "1",
                              "--out", str(tmp_path / "out"), "--device", "cpu"])
    assert rc == 2 and f"{blank}: no prompts" in err


def test_generate_and_chat_stream_the_answer_cut_before_a_stop_string(capsys, monkeypatch, tiny_hf_dir):
    """chat printed the stop string and what followed it in the same step; generate held the whole answer
    back until the end. Both now stream it, cut where `generate --json` cuts it."""
    base = ["--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "128", "-n", "24", "--spec-type", "ngram-simple"]
    rc, out, _ = run(capsys, ["generate", *base, "--json", "--chat", "hello"])
    full = json.loads(out)["text"]
    assert rc == 0 and len(full) > 10
    half = len(full) // 2  # a stop string first found in the second half: the first half streams before it
    stop = next(full[i : i + 3] for i in range(half, len(full) - 2) if full[i : i + 3].strip()
                and full.index(full[i : i + 3]) >= half)
    rc, out, _ = run(capsys, ["generate", *base, "--json", "--chat", "--stop", stop, "hello"])
    cut = json.loads(out)["text"]
    assert rc == 0 and cut == full[: full.index(stop)]
    written: list[str] = []
    monkeypatch.setattr("sys.stdout.write", written.append)
    rc, _, _ = run(capsys, ["generate", *base, "--chat", "--stop", stop, "hello"])
    assert rc == 0 and "".join(written) == cut + "\n"
    assert len([w for w in written if w]) > 2  # streamed, not one piece at the end
    written.clear()
    rc, _, _ = run_chat(capsys, monkeypatch, ["hello", ""], [*base, "--stop", stop])
    assert rc == 0 and "".join(written) == cut + "\n"


@pytest.mark.parametrize("template, message", [
    ("{% for m in messages %}{{ m['content'] + 1 }}{% endfor %}",
     "the model's chat template failed: TypeError: can only concatenate str"),
    ("{% for m in messages %}", "the model's chat template failed: TemplateSyntaxError: Unexpected end of template"),
    ("{{ undefined_thing.attr }}", "the model's chat template failed: UndefinedError: 'undefined_thing' is undefined"),
])
def test_a_broken_chat_template_is_one_line_and_chat_goes_on(capsys, monkeypatch, tmp_path, tiny_hf_dir, template,
                                                             message):
    import shutil

    folder = tmp_path / "broken-template"
    shutil.copytree(tiny_hf_dir, folder)
    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["chat_template"] = template
    cfg_file.write_text(json.dumps(cfg))
    base = ["--model", str(folder), "--weights", "fp32", "-c", "128", "-n", "2", "--spec-type", "none"]
    rc, out, err = run(capsys, ["generate", *base, "--chat", "hello"])
    assert rc == 2 and err.startswith("specdec: error: ") and message in err and not out
    rc, _, err = run_chat(capsys, monkeypatch, ["hello", ""], base)
    assert rc == 0 and message in err and "the line was not sent" in err


def test_chat_outgrowing_the_context_drops_its_oldest_turns_and_goes_on(capsys, monkeypatch, tiny_hf_dir):
    """A conversation longer than --ctx-size, or one line longer than it, ended the session (exit 2) and the
    history with it."""
    lines = ["tell me about the weather today please"] * 6 + ["word " * 200, "and now?", ""]
    rc, out, err = run_chat(capsys, monkeypatch, lines, ["--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "96",
                                                         "-n", "12", "--spec-type", "none"])
    assert rc == 0
    assert "note: the conversation outgrew the 96-token context (--ctx-size): its oldest 2 turn(s) were dropped" in err
    assert "tokens with the chat template; the context holds 96 (--ctx-size); the line was not sent" in err
    assert err.count("speculation: off") == 7  # every line but the overlong one was answered


def test_chat_survives_a_failed_turn_and_ctrl_c_during_an_answer(capsys, monkeypatch, tiny_hf_dir):
    """A turn that fails (here a cache error raised by the second turn's third step) and Ctrl-C while an
    answer streams ended the whole session; now the failed turn is dropped, the interrupted answer kept."""
    from specdec.engine.engine import Engine
    from specdec.model.errors import SpecdecError

    real_step, steps = Engine.step, {"n": 0}

    def step(self, req):
        steps["n"] += 1
        if steps["n"] == 8:
            raise SpecdecError("32 key/value entries in layer 0 exceed float16's range")
        if steps["n"] == 14:
            raise KeyboardInterrupt
        return real_step(self, req)

    monkeypatch.setattr(Engine, "step", step)
    rc, out, err = run_chat(capsys, monkeypatch, ["one", "two", "three", "four", ""],
                            ["--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "256", "-n", "5", "--spec-type",
                             "none"])
    assert rc == 0
    assert "specdec: error: 32 key/value entries in layer 0 exceed float16's range; the line was not answered" in err
    assert "(interrupted)" in err
    assert err.count("speculation: off") == 3  # one, three (interrupted) and four were answered


def test_an_answer_cut_by_the_context_says_so_and_chat_keeps_its_history(capsys, monkeypatch, tiny_hf_dir):
    model = ["--model", str(tiny_hf_dir), "--weights", "fp32", "--spec-type", "none"]
    rc, out, err = run(capsys, ["generate", *model, "-c", "64", "-n", "1000", "hello"])
    assert rc == 0 and "note: the answer stopped at the end of the 64-token context (--ctx-size)" in err
    rc, out, err = run(capsys, ["generate", *model, "-c", "64", "-n", "1000", "--json", "hello"])  # said it nowhere
    assert rc == 0 and "note: the answer stopped at the end of the 64-token context (--ctx-size)" in err
    assert json.loads(out)["finish_reason"] == "length"
    rc, out, err = run_chat(capsys, monkeypatch, ["hi", "hello", ""], [*model, "-c", "256", "-n", "300", "--stop", "<"])
    assert rc == 0 and len(out) < 200  # short answers (the stop string), -n beyond the context:
    assert "outgrew" not in err  # every turn dropped all history


def test_seed_minus_one_is_random_as_in_llama_cpp_and_a_capped_context_is_noted(capsys, tiny_hf_dir):
    import argparse

    from specdec.cli.options import add_sampling_args, sampling_from_args

    parser = argparse.ArgumentParser()
    add_sampling_args(parser)
    assert sampling_from_args(parser.parse_args(["--seed", "-1"])).seed is None  # was the fixed seed -1
    assert sampling_from_args(parser.parse_args(["--seed", "7"])).seed == 7
    rc, _, err = run(capsys, ["generate", "--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "100000", "-n", "2",
                              "--spec-type", "none", "hi"])
    assert rc == 0 and "note: --ctx-size 100000 is more than" in err and "its context is 512 tokens" in err


def test_chat_without_a_chat_template_is_refused_at_start(capsys, monkeypatch, tmp_path, tiny_hf_dir):
    """It refused every line with advice about a --chat flag chat does not have, and exited 0."""
    import shutil

    folder = tmp_path / "no-template"
    shutil.copytree(tiny_hf_dir, folder)
    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text())
    del cfg["chat_template"]
    cfg_file.write_text(json.dumps(cfg))
    typed = iter(["hello", ""])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(typed))
    rc, out, err = run(capsys, ["chat", "--model", str(folder), "--weights", "fp32", "--spec-type", "none"])
    assert rc == 2 and "has no chat template" in err and "specdec generate" in err
    assert next(typed) == "hello"  # no line was read


def test_ctrl_c_in_a_chat_prefill_drops_that_line_and_chat_goes_on(capsys, monkeypatch, tiny_hf_dir):
    """Ctrl-C before the answer began (a long prompt's prefill) ended the program; now the line is not
    answered, not kept in the history, and the next one is."""
    from specdec.engine.engine import Engine

    real_start, starts, prompts = Engine.start, {"n": 0}, []

    def start(self, prompt, *args, **kwargs):
        starts["n"] += 1
        prompts.append(self.model.tokenizer.decode(prompt))
        if starts["n"] == 1:
            raise KeyboardInterrupt
        return real_start(self, prompt, *args, **kwargs)

    monkeypatch.setattr(Engine, "start", start)
    rc, out, err = run_chat(capsys, monkeypatch, ["first line", "second line", ""],
                            ["--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "256", "-n", "3",
                             "--spec-type", "none"])
    assert rc == 0 and "(interrupted before the answer began; the line was not answered)" in err
    assert err.count("speculation: off") == 1 and "first line" not in prompts[1] and "second line" in prompts[1]


def test_a_closed_pipe_ends_quietly(capsys, monkeypatch, tiny_hf_dir):
    """`specdec generate ... | head -c 5`: the reader went away; a BrokenPipeError traceback before."""
    import sys

    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Closed())
    rc, _, err = run(capsys, ["generate", "--model", str(tiny_hf_dir), "--weights", "fp32", "-n", "3",
                              "--spec-type", "none", "hi"])
    assert rc == 141 and "Error" not in err


def test_the_default_context_is_not_noted_as_asked_for(capsys, tiny_hf_dir):
    """Without --ctx-size nothing says "--ctx-size 4096 is more than ..." (the model's 512 is used)."""
    rc, _, err = run(capsys, ["generate", "--model", str(tiny_hf_dir), "--weights", "fp32", "-n", "2",
                              "--spec-type", "none", "hi"])
    assert rc == 0 and "--ctx-size" not in err


def test_the_command_table_fails_loudly_on_a_command_no_module_adds(monkeypatch):
    """cli.py loaded its commands through importlib and skipped a missing one silently."""
    import specdec.cli as cli

    assert set(cli.build_parser()._subparsers._group_actions[0].choices) == set(cli.COMMANDS)
    monkeypatch.setitem(cli.COMMANDS, "tune", cli.pull)
    with pytest.raises(RuntimeError, match="cli.COMMANDS lists tune, which no module added"):
        cli.build_parser()


def test_generate_gives_the_verdict_in_json_and_on_stderr(capsys, tiny_hf_dir):
    base = ["generate", "--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "128", "-n", "24", "--spec-type",
            "ngram-simple", "--chat", "hello"]
    rc, out, _ = run(capsys, base + ["--json"])
    spec = json.loads(out)["spec"]
    verdict = spec["verdict"]
    assert rc == 0 and verdict["decode_s"] > 0 and verdict["rollback_s"] == spec["rollback_s"]
    if verdict["plain_estimate_s"] is not None:  # the tokens after the first, priced by one plain step each
        assert verdict["speedup"] == pytest.approx(verdict["plain_estimate_s"] / verdict["decode_s"])
        assert verdict["plain_step_s"] == pytest.approx(verdict["plain_estimate_s"] / 23)
    assert (verdict["reason"] is None) == verdict["pays"]
    rc, _, err = run(capsys, base)
    assert rc == 0 and "; verdict: " in err  # engaged or not (the tiny model's chat answer gives ngrams nothing)
