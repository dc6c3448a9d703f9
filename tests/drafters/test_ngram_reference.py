"""ngram-map-k, ngram-map-k4v and ngram-mod draft what llama.cpp drafts, step for step.

data/llama_cpp_ngram_drafts.json was written by llama.cpp itself (scripts/llama_ngram_drafts.py replays
token texts through its common_speculative API, scripts/llama_ngram_replay.cpp): for each case, texts
that a greedy target answers, and every draft llama.cpp made while the text was decoded. Here the same
texts are decoded the same way (a draft keeps its longest prefix the text goes on with; on_accept hears
how many) and every draft must be the same. ngram-mod's cases run two requests on one drafter, the
second answering with text only the first one saw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec.drafters.ngram_mod import NgramMod
from specdec.drafters.registry import BuildContext, DrafterSpec, create

DATA = json.loads((Path(__file__).parent / "data" / "llama_cpp_ngram_drafts.json").read_text())
CASES = {f"{c['kind']}:{','.join(f'{k}={v}' for k, v in c['options'].items()) or 'defaults'}": c
         for c in DATA["cases"]}


def decode(drafter, text: list[int], prompt_len: int, draft_length: int) -> tuple[list[tuple[int, ...]], list[int]]:
    """(every draft, how many of each the text kept) while a greedy target writes `text` after its prompt."""
    drafter.begin(text[:prompt_len])
    pos, drafts, kept_counts = prompt_len, [], []
    while pos < len(text):  # text[pos] was just sampled
        draft = drafter.propose(text[: pos + 1], draft_length).tokens
        kept = 0
        while kept < len(draft) and pos + 1 + kept < len(text) and draft[kept] == text[pos + 1 + kept]:
            kept += 1
        drafts.append(draft)
        if draft:
            drafter.on_accept(kept)
            kept_counts.append(kept)
        pos += kept + 1
    return drafts, kept_counts


@pytest.mark.parametrize("name", list(CASES))
def test_drafts_are_llama_cpps(name, monkeypatch):
    case = CASES[name]
    clears = []
    original = NgramMod._clear
    monkeypatch.setattr(NgramMod, "_clear", lambda self: (clears.append(1), original(self)))
    drafter = create(DrafterSpec.of(case["kind"], **case["options"]), BuildContext(target=None))
    kept = []
    for r, (request, expected) in enumerate(zip(case["requests"], case["drafts"])):
        drafts, kept_here = decode(drafter, request["text"], request["prompt_len"], case["draft_length"])
        for step, (ours, theirs) in enumerate(zip(drafts, expected)):
            assert ours == tuple(theirs), f"{name}, request {r}, step {step}: drafted {ours}, llama.cpp {theirs}"
        assert len(drafts) == len(expected)
        kept += kept_here
    # the case is worth comparing: drafts kept whole, in part and not at all
    assert 0 in kept and any(0 < k < case["draft_length"] for k in kept) and case["draft_length"] in kept, name
    if case["kind"] == "ngram-mod" and case["options"]:
        assert clears, f"{name}: no streak of poor drafts emptied the table"


def test_ngram_mod_drafts_from_what_an_earlier_request_wrote():
    """The second request of each ngram-mod case copies the first one's answer: only the table's memory
    of that request drafts there, so a drafter that starts over at begin() drafts less."""
    for name, case in CASES.items():
        if case["kind"] != "ngram-mod":
            continue
        first, second = case["requests"]
        remembering = NgramMod(**case["options"])
        decode(remembering, first["text"], first["prompt_len"], case["draft_length"])
        with_memory, _ = decode(remembering, second["text"], second["prompt_len"], case["draft_length"])
        without, _ = decode(NgramMod(**case["options"]), second["text"], second["prompt_len"], case["draft_length"])
        assert sum(map(len, with_memory)) > sum(map(len, without)), name
