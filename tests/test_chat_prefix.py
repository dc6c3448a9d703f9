"""`specdec chat` keeps the conversation's KV rows between turns (the prefix cache, on by default): each turn
prefills what is new, and the answers are those of a chat without it (tiny fp32 model: its prefill rows do
not depend on where a prompt is cut)."""

from __future__ import annotations

import builtins

import pytest

from specdec.cli import main
from specdec.engine.prefix_cache import PrefixCache

TAKE = PrefixCache.take_slot


def chat(capsys, monkeypatch, tiny_hf_dir, *flags) -> tuple[str, list[int]]:
    """(stdout, the cached tokens of each turn) of a three-line chat."""
    typed, cached = iter(["hello", "and then?", "thanks", ""]), []
    def counting(self, prompt, running, reuse=True):
        slot, n = TAKE(self, prompt, running, reuse)
        cached.append(n)
        return slot, n

    monkeypatch.setattr(builtins, "input", lambda prompt="": next(typed))
    monkeypatch.setattr(PrefixCache, "take_slot", counting)
    assert main(["chat", "--model", str(tiny_hf_dir), "--weights", "fp32", "--spec-type", "none", "-n", "6",
                 *flags]) == 0
    return capsys.readouterr().out, cached


def test_later_turns_reuse_the_conversation(capsys, monkeypatch, tiny_hf_dir):
    warm, cached = chat(capsys, monkeypatch, tiny_hf_dir)
    cold, none = chat(capsys, monkeypatch, tiny_hf_dir, "--prefix-cache", "off")
    assert cached[0] == 0 < cached[1] < cached[2] and none == [0, 0, 0]  # each turn reuses rows of the turns before it
    assert warm == cold


def test_a_bad_mode_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["chat", "--prefix-cache", "sometimes"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err
