"""The docs stay true to the tree: docs/usage.md's flag tables are what scripts/usage_doc.py writes from
the parser now, and every relative link in README.md and docs/**/*.md names a file inside the repository
(and, for file.md#heading, a heading that file has)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"(`+).+?\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")  # [text](target "title"), ![alt](target)
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)  # [name]: target


def _usage_doc():
    spec = importlib.util.spec_from_file_location("usage_doc", ROOT / "scripts" / "usage_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text that are paths (no scheme, not a bare #anchor), outside code."""
    text = INLINE_CODE.sub("", FENCE.sub("", text))
    targets = LINK.findall(text) + REFERENCE.findall(text)
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t) and not t.startswith("#")]


def anchors(text: str) -> set[str]:
    """The #fragments a Markdown text's headings get, as GitHub makes them: lower case, punctuation dropped
    (hyphens and underscores kept), spaces to hyphens, a repeated one numbered (-1, -2, ...)."""
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        if seen[slug]:
            seen[f"{slug}-{seen[slug]}"] = 0
    return set(seen)


def broken_links(doc: Path, root: Path = ROOT) -> list[str]:
    """The relative links of `doc` that name nothing, something outside `root`, or a heading a Markdown file
    lacks (file.md#heading)."""
    broken = []
    for target in relative_links(doc.read_text()):
        name, _, fragment = target.partition("#")
        path = (doc.parent / name).resolve()
        if not path.is_relative_to(root.resolve()):
            broken.append(f"{target} (outside the repository)")
        elif not path.exists():
            broken.append(target)
        elif fragment and path.suffix == ".md" and fragment not in anchors(path.read_text()):
            broken.append(f"{target} (no such heading)")
    return broken


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_usage_flag_tables_match_the_parser():
    usage_doc = _usage_doc()
    written = usage_doc.generated_part((ROOT / "docs" / "usage.md").read_text())
    assert written == usage_doc.render(), \
        "docs/usage.md's flag tables differ from the parser's flags: run `python scripts/usage_doc.py`"


def test_every_relative_link_names_a_file_in_the_repository():
    broken = {str(doc.relative_to(ROOT)): links for doc in markdown_files() if (links := broken_links(doc))}
    assert not broken, f"links to nothing: {broken}"


def test_the_checks_can_fail(tmp_path):
    usage_doc = _usage_doc()
    rendered = usage_doc.render()
    stale = rendered.replace(" |\n", " | a cell the parser no longer has |\n", 1)
    assert stale != rendered  # what the drift test compares
    assert usage_doc.generated_part(f"hand-written\n{stale}\nmore") == stale
    with pytest.raises(ValueError, match="markers"):
        usage_doc.generated_part("no markers here")

    repo = tmp_path / "repo"
    repo.mkdir()
    (tmp_path / "outside.md").write_text("x")
    doc = repo / "doc.md"
    (repo / "there.md").write_text("# Part\n## The `x` flag, again\n")
    doc.write_text("[ok](there.md) [ok](there.md#part) [ok](there.md#the-x-flag-again) [web](https://example.com)"
                   " [anchor](#top) [no](there.md#nowhere)\n"
                   "[gone](missing.md) ![img](gone.png) `[code](not-a-link.md)`\n"
                   "```\n[fenced](not-a-link-either.md)\n```\n[ref]: also-missing.md\n[up](../outside.md)\n")
    assert broken_links(doc, root=repo) == ["there.md#nowhere (no such heading)", "missing.md", "gone.png",
                                            "../outside.md (outside the repository)", "also-missing.md"]
    assert anchors("# A\n# A\n```\n# not a heading\n```\n") == {"a", "a-1"}
