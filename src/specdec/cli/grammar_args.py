"""Constrained decoding flags, as llama-cli names them: the answer follows a JSON schema or a GBNF grammar.

    -j / --json-schema SCHEMA, --json-schema-file FILE, --grammar GBNF, --grammar-file FILE (one of them)

    add_grammar_args(parser)
    grammar = grammar_from_args(args, engine.model)     # a compiled Grammar, or None
"""

from __future__ import annotations

import argparse

from specdec.engine.constrain import compile_for

FLAGS = ("json_schema", "json_schema_file", "grammar", "grammar_file")


def add_grammar_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-j", "--json-schema", default=None,
                   help="the answer is JSON following this schema (text); {} for any JSON object")
    p.add_argument("--json-schema-file", default=None, help="the same, the schema read from a file")
    p.add_argument("--grammar", default=None, help="the answer follows this GBNF grammar (llama.cpp's)")
    p.add_argument("--grammar-file", default=None, help="the same, the grammar read from a file")


def grammar_from_args(args: argparse.Namespace, model):
    """The grammar the flags ask for, compiled for `model`; None without one. ValueError: two flags, a file that
    cannot be read, a schema or grammar that cannot be used (one sentence naming it)."""
    given = [name for name in FLAGS if getattr(args, name, None) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ValueError(f"{' and '.join('--' + n.replace('_', '-') for n in given)} each constrain the answer; "
                         "give one of them")
    name = given[0]
    text = getattr(args, name)
    if name.endswith("_file"):
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise ValueError(f"cannot read --{name.replace('_', '-')} {text}: {e.strerror or e}") from None
    kind = "gbnf" if name.startswith("grammar") else "json_schema"
    if kind == "json_schema" and text.strip() == "{}":
        kind, text = "json_object", ""
    return compile_for(model, kind, text)
