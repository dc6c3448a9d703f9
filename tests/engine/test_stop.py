"""engine/stop.py: stop strings matched in an answer's text as it grows."""

from __future__ import annotations

from specdec.engine.engine import Engine
from specdec.engine.stop import StopStrings


def test_the_earliest_stop_string_wins_when_one_step_ends_two(tiny_model):
    """stop=("ld", "o w") on "Hello world": a step that completes both (Qwen's " world" token, or a verify
    that commits several) is cut before the earliest of them ('Hell'), as llama-server cuts, not at the
    first of the list ('Hello wor', which still holds "o w")."""
    tok = tiny_model.tokenizer
    ids = tok.encode("Hello world", add_bos=False)
    assert StopStrings(tok, ("ld", "o w"), skip_special=True).find(ids) == "Hell"  # all in one step
    engine = Engine(tiny_model, max_len=64)
    req = engine.admit(tok.encode("Say it:", add_bos=False), stop=("ld", "o w"))
    try:
        assert req.stop.find(ids) == "Hell"  # a request's own, with the engine's skip_special
    finally:
        engine.finish(req)


def test_a_stop_string_is_found_once_its_last_token_arrives(tiny_model):
    tok = tiny_model.tokenizer
    ids = tok.encode("Hello world", add_bos=False)
    stop = StopStrings(tok, ("world",), skip_special=True)
    output = []
    cuts = []
    for t in ids:
        output.append(t)
        cuts.append(stop.find(output))
    assert cuts[-1] == "Hello " and all(c is None for c in cuts[:-1])
