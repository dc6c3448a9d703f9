"""The table of promise x drafter kind in tests/README.md is complete and names tests that exist.

Every registered drafter kind has a row (a kind that drafts trees: a chain row and a tree row; draft-simple:
a row with another tokenizer too), the rows are the matrix's (helpers/matrix.ROWS), every cell names at
least one test, one of them the matrix's own test in tests/lossless, and every test a cell names is
defined in its file (with its parameter, where a cell names one). A kind registered without a row, or a
test renamed or removed, fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from helpers.matrix import ROWS
from specdec.drafters import registry

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
README = TESTS / "README.md"
COLUMNS = ["greedy", "law", "batch"]
OWN = {  # the matrix's own test of each column
    "greedy": "tests/lossless/test_greedy_matrix.py::test_greedy_output_is_plain_greedy_output",
    "law": "tests/lossless/test_law_matrix.py::test_sampled_output_follows_the_target_law",
    "batch": "tests/lossless/test_batch_matrix.py::test_batched_requests_give_their_solo_answers",
}
NODE = re.compile(r"`(tests/[^`:]+\.py)::(\w+)(?:\[([^\]`]+)\])?`")


def table() -> dict[str, dict[str, list[tuple[str, str, str | None]]]]:
    """row -> column -> [(file, test, parameter or None)], from the README's matrix table."""
    text = README.read_text()
    start = text.index("<!-- lossless-matrix -->")
    rows = {}
    for line in text[start:].splitlines()[1:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = cells[0].strip("`")
        if name in ("row", "") or set(name) <= set("-: "):
            continue
        assert len(cells) == 1 + len(COLUMNS), f"README matrix row {name!r} has {len(cells) - 1} cells"
        rows[name] = {col: NODE.findall(cell) for col, cell in zip(COLUMNS, cells[1:])}
    return rows


def defined(file: str, test: str) -> list[str] | None:
    """The string constants of the module that defines `test` at top level, or None when none does."""
    tree = ast.parse((ROOT / file).read_text())
    if not any(isinstance(n, ast.FunctionDef) and n.name == test for n in tree.body):
        return None
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_every_kind_has_its_rows():
    rows = set(table())
    assert rows == set(ROWS), f"rows in the README but not the matrix: {sorted(rows - set(ROWS))}; " \
                              f"in the matrix but not the README: {sorted(set(ROWS) - rows)}"
    for e in registry.entries():
        mine = [row for row, kind in ROWS.items() if kind == e.kind]
        assert mine, f"drafter kind {e.kind} has no row in the lossless matrix (tests/README.md)"
        if e.trees:
            assert {f"{e.kind}-chain", f"{e.kind}-tree"} <= set(mine), f"{e.kind} drafts trees: it needs both rows"
    assert "draft-simple-cross" in ROWS  # a draft model with another tokenizer runs other code


def test_every_cell_names_tests_that_exist():
    for row, cells in table().items():
        for col in COLUMNS:
            named = cells[col]
            assert named, f"the README matrix has no test for {row} x {col}"
            assert (OWN[col].split("::")[0], OWN[col].split("::")[1], row) in named, \
                f"{row} x {col} does not name {OWN[col]}[{row}]"
            for file, test, param in named:
                assert (ROOT / file).is_file(), f"{row} x {col}: no file {file}"
                constants = defined(file, test)
                assert constants is not None, f"{row} x {col}: {file} defines no test {test}"
                if param:
                    known = set(ROWS) | set(constants)
                    assert param in known, f"{row} x {col}: {file}::{test} has no parameter {param}"


def test_the_table_check_can_fail(tmp_path, monkeypatch):
    """A cell naming a test that does not exist, a cell without the matrix's own test and a missing row
    are each caught."""
    import sys

    text = README.read_text()
    first = next(iter(ROWS))

    def message(check, readme: str) -> str:
        (tmp_path / "README.md").write_text(readme)
        monkeypatch.setattr(sys.modules[__name__], "README", tmp_path / "README.md")
        try:
            check()
        except AssertionError as exc:
            return str(exc)
        return "passed"

    renamed = text.replace("::test_cross_tokenizer_drafts_to_the_end_of_a_short_context`", "::test_gone`")
    assert "defines no test test_gone" in message(test_every_cell_names_tests_that_exist, renamed)
    own = text.replace("test_sampled_output_follows_the_target_law[suffix]`", "test_sampled_output_follows_the_target_law`")
    assert "suffix x law does not name" in message(test_every_cell_names_tests_that_exist, own)
    dropped = "\n".join(line for line in text.splitlines() if not line.startswith(f"| `{first}`"))
    assert first in message(test_every_kind_has_its_rows, dropped)
