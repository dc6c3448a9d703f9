"""`specdec generate` with a JSON schema or a GBNF grammar (cli/grammar_args.py, llama-cli's flags): the answer
follows it, and is the engine's plain answer under the same grammar; bad flags are one line."""

from __future__ import annotations

import json

import pytest

from specdec.cli import main
from specdec.engine.constrain import compile_for
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "tag": {"enum": ["red", "blue"]}},
          "required": ["ok", "tag"], "additionalProperties": False}


def run(capsys, argv) -> tuple[int, str, str]:
    rc = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return rc, captured.out, captured.err


def base(tiny_hf_dir) -> list[str]:
    return ["generate", "--model", str(tiny_hf_dir), "--weights", "fp32", "-c", "128", "-n", "32", "--json",
            "--spec-type", "ngram-simple", "hello"]


def test_generate_follows_a_json_schema_and_a_grammar_file(capsys, tmp_path, tiny_hf_dir, tiny_model):
    rc, out, _ = run(capsys, base(tiny_hf_dir) + ["--json-schema", json.dumps(SCHEMA)])
    answer = json.loads(out)
    assert rc == 0 and json.loads(answer["text"])["tag"] in ("red", "blue")
    grammar = compile_for(tiny_model, "json_schema", json.dumps(SCHEMA))
    plain = Engine(tiny_model, max_len=128).generate(tiny_model.tokenizer.encode("hello"),
                                                     SamplingParams(grammar=grammar), 32)
    assert answer["text"] == plain.text
    assert answer["spec"]["by_drafter"]["grammar"]["accepted"] > 0
    (tmp_path / "g.gbnf").write_text('root ::= ("yes" | "no") "!"\n')
    rc, out, _ = run(capsys, base(tiny_hf_dir) + ["--grammar-file", str(tmp_path / "g.gbnf")])
    assert rc == 0 and json.loads(out)["text"] in ("yes!", "no!")


@pytest.mark.parametrize("flags, message", [
    (["--grammar", 'root ::= "a"', "-j", "{}"], "--json-schema and --grammar each constrain the answer"),
    (["--grammar-file", "/nonexistent/g.gbnf"], "cannot read --grammar-file /nonexistent/g.gbnf"),
    (["--json-schema", '{"type": "objekt"}'], "the JSON schema cannot be used"),
])
def test_a_bad_grammar_flag_is_one_line(capsys, tiny_hf_dir, flags, message):
    rc, _, err = run(capsys, base(tiny_hf_dir) + flags)
    assert rc != 0 and message in err and len(err.strip().splitlines()) == 1, err
