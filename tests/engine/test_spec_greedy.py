"""Greedy speculative output equals plain greedy output, token for token, on real models."""

from __future__ import annotations

import pytest

from helpers.prompts import EDIT_PROMPT
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.slow

CODE_PROMPT = "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n"
PROSE_PROMPT = "Once upon a time, in a small village by the sea, there lived"
PROMPTS = [EDIT_PROMPT, CODE_PROMPT, PROSE_PROMPT]
MODEL_FREE = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "suffix"]


@pytest.fixture(scope="module")
def engine(smollm):
    return Engine(smollm, max_len=1024)


@pytest.fixture(scope="module")
def plain(engine):
    tok = engine.model.tokenizer
    return {p: engine.generate(tok.encode(p), SamplingParams(), max_tokens=64).token_ids for p in PROMPTS}


@pytest.mark.parametrize("kind", MODEL_FREE)
def test_model_free_drafters_keep_greedy_output(engine, plain, kind):
    tok = engine.model.tokenizer
    spec = SpecConfig(drafters=(kind,), draft_n_max=4)
    drafted = 0
    for p in PROMPTS:
        out = engine.generate(tok.encode(p), SamplingParams(), max_tokens=64, spec=spec)
        assert out.token_ids == plain[p], f"{kind} changed the output of {p[:30]!r}"
        drafted += out.stats.drafted
        assert out.stats.accepted <= out.stats.drafted
    assert drafted > 0, f"{kind} never drafted on these prompts (an editing prompt among them)"


def test_editing_prompt_engages_ngram_and_accepts(engine, plain):
    tok = engine.model.tokenizer
    out = engine.generate(tok.encode(EDIT_PROMPT), SamplingParams(), max_tokens=64,
                          spec=SpecConfig(drafters=("ngram-simple",), draft_n_max=5))
    assert out.token_ids == plain[EDIT_PROMPT]
    assert out.stats.engaged and out.stats.accepted > 0
    assert out.stats.mean_acceptance_length > 1.0


def test_several_drafters_at_once(engine, plain):
    tok = engine.model.tokenizer
    spec = SpecConfig(drafters=("ngram-simple", "suffix"), draft_n_max=3)
    out = engine.generate(tok.encode(EDIT_PROMPT), SamplingParams(), max_tokens=64, spec=spec)
    assert out.token_ids == plain[EDIT_PROMPT]
    assert sum(c.drafted for c in out.stats.by_drafter.values()) == out.stats.drafted


def test_adaptive_and_min_length_keep_output(engine, plain):
    tok = engine.model.tokenizer
    for spec in (SpecConfig(drafters=("ngram-simple",), draft_n_max=6, adaptive=True),
                 SpecConfig(drafters=("ngram-simple",), draft_n_max=4, draft_n_min=3)):
        out = engine.generate(tok.encode(EDIT_PROMPT), SamplingParams(), max_tokens=64, spec=spec)
        assert out.token_ids == plain[EDIT_PROMPT]


def test_draft_model_equal_to_target_accepts_everything(smollm, engine, plain):
    """All-accept case: the draft is the target itself (same weights, same numerics)."""
    tok = engine.model.tokenizer
    spec = SpecConfig(drafters=("draft-simple",), draft_model="smollm2-135m", draft_n_max=4)
    out = engine.generate(tok.encode(CODE_PROMPT), SamplingParams(), max_tokens=48, spec=spec)
    assert out.token_ids == plain[CODE_PROMPT][:48]
    assert out.stats.drafted > 0 and out.stats.acceptance_rate == 1.0


def test_unrelated_draft_model_is_rejected_but_output_unchanged(engine, plain, random_smollm_dir):
    """All-reject case: random weights with the same tokenizer propose nonsense."""
    tok = engine.model.tokenizer
    spec = SpecConfig(drafters=("draft-simple",), draft_model=str(random_smollm_dir), draft_n_max=3)
    out = engine.generate(tok.encode(PROSE_PROMPT), SamplingParams(), max_tokens=32, spec=spec)
    assert out.token_ids == plain[PROSE_PROMPT][:32]
    assert out.stats.drafted > 0 and out.stats.acceptance_rate < 0.2


@pytest.fixture(scope="module")
def random_smollm_dir(smollm, tmp_path_factory):
    """A 2-layer random model that shares smollm2's tokenizer (so the compatibility check passes)."""
    import json

    from helpers.tiny import random_weights, tiny_config
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("rand") / "random-smollm"
    folder.mkdir()
    cfg = tiny_config("llama", vocab=smollm.config.vocab_size, hidden=64, layers=2)
    cfg["eos_token_id"] = smollm.tokenizer.eos_ids[0]
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(random_weights(cfg, seed=7), str(folder / "model.safetensors"))
    smollm.tokenizer.backend.save(str(folder / "tokenizer.json"))
    bos = smollm.tokenizer.token_text(smollm.tokenizer.bos_id)
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False, "bos_token": bos}))
    return folder


def test_stops_inside_an_accepted_run_match_plain_decoding(engine):
    """Stop strings and max_tokens cut exactly where plain decoding cuts."""
    tok = engine.model.tokenizer
    ids = tok.encode(EDIT_PROMPT)
    spec = SpecConfig(drafters=("ngram-simple",), draft_n_max=6)
    for stop, max_tokens in ((["print("], 64), (["running_sum"], 64), ([], 7), ([], 13)):
        a = engine.generate(ids, SamplingParams(), max_tokens=max_tokens, stop=stop)
        b = engine.generate(ids, SamplingParams(), max_tokens=max_tokens, stop=stop, spec=spec)
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
        if stop:
            assert stop[0] not in b.text


def test_a_stop_string_ends_the_output_where_the_whole_text_first_holds_it(engine):
    """The engine looks for stop strings only in the text each token adds (model.text_stream.StreamDecoder):
    the output still ends with the first token after which the decoded output holds one of them, and the
    text is that decoded output cut before the first of them (in the request's order) that it holds."""
    tok = engine.model.tokenizer
    ids = tok.encode(EDIT_PROMPT)
    full = engine.generate(ids, SamplingParams(), max_tokens=40)
    text = full.text
    assert len(text) > 60
    stops = [[text[3:5]], [text[10:16]], [text[len(text) // 2 : len(text) // 2 + 3]], [text[-4:]],
             [text[40:44], text[12:14]], [text[12:14], text[40:44]], ["never in this text"]]
    for stop in stops:
        got = engine.generate(ids, SamplingParams(), max_tokens=40, stop=stop)
        holds = [n for n in range(1, len(full.token_ids) + 1) if any(s in tok.decode(full.token_ids[:n]) for s in stop)]
        if not holds:
            assert (got.token_ids, got.text, got.finish_reason) == (full.token_ids, text, full.finish_reason)
            continue
        whole = tok.decode(full.token_ids[: holds[0]])
        first = next(s for s in stop if s in whole)
        assert (got.token_ids, got.text, got.finish_reason) == (full.token_ids[: holds[0]], whole[: whole.find(first)],
                                                                "stop"), stop


def test_an_empty_stop_string_is_refused(engine):
    with pytest.raises(ValueError, match=r"stop strings must be non-empty strings, got \['x', ''\]"):
        engine.generate([1, 2, 3], SamplingParams(), max_tokens=4, stop=["x", ""])
    with pytest.raises(ValueError, match=r"stop strings must be non-empty strings, got \[3\]"):
        engine.generate([1, 2, 3], SamplingParams(), max_tokens=4, stop=[3])


def test_a_stop_string_given_as_a_str_is_one_stop_string(engine):
    """stop="xy" stopped at any "x" or "y" (a str iterated by character); stop=None was a TypeError."""
    ids = engine.model.tokenizer.encode("One, two, three, four, five, six,")
    full = engine.generate(ids, SamplingParams(), max_tokens=12)
    text = full.text
    assert engine.generate(ids, SamplingParams(), max_tokens=12, stop=None).token_ids == full.token_ids
    # two characters of the answer, one of which occurs before the pair does (so per-character stops differ)
    rare = next(text[k:k + 2] for k in range(len(text) // 2, len(text) - 1)
                if min(text.find(c) for c in text[k:k + 2]) < text.find(text[k:k + 2]))
    as_str = engine.generate(ids, SamplingParams(), max_tokens=12, stop=rare)
    as_list = engine.generate(ids, SamplingParams(), max_tokens=12, stop=[rare])
    assert (as_str.text, as_str.token_ids) == (as_list.text, as_list.token_ids) and as_str.text == text[: text.find(rare)]


def test_prompt_ids_that_are_not_integers_are_refused(engine):
    with pytest.raises(ValueError, match="prompt token ids must be integers, got 5.7"):
        engine.generate([5.7, 3], SamplingParams(), max_tokens=2)
    assert engine.generate([5.0, 3], SamplingParams(), max_tokens=2).token_ids == \
        engine.generate([5, 3], SamplingParams(), max_tokens=2).token_ids


def test_eos_stops_generation(engine):
    """Where plain decoding meets EOS, speculation stops at the same token. Short chat answers end in EOS,
    but which of them does within 200 tokens moves with the last bits of the numerics, so several are asked."""
    tok = engine.model.tokenizer
    stopped = 0
    for question in ("Say just: OK", "Answer with one word: what color is the sky?", "What is 2 + 2? Reply with the number."):
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": question}]), add_bos=False)
        a = engine.generate(ids, SamplingParams(), max_tokens=200)
        b = engine.generate(ids, SamplingParams(), max_tokens=200, spec=SpecConfig(drafters=("suffix",)))
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert not set(a.token_ids) & set(tok.eos_ids)
        stopped += a.finish_reason == "stop" and len(a.token_ids) < 200
    assert stopped > 0


def test_a_stop_string_does_not_match_a_half_decoded_character(engine):
    """The first byte token of an emoji decodes to U+FFFD until the rest arrives: a stop string holding
    U+FFFD matched it and ended the answer after one token."""
    ids = engine.model.tokenizer.encode("🍎🍌🍒 🍎🍌🍒 🍎🍌🍒 🍎🍌🍒 🍎")
    full = engine.generate(ids, SamplingParams(), max_tokens=8)
    assert "\ufffd" not in full.text[:-1] and len(full.text) > 1  # the answer holds whole emoji
    cut = engine.generate(ids, SamplingParams(), max_tokens=8, stop=["\ufffd"])
    assert (cut.token_ids, cut.finish_reason) == (full.token_ids, "length")
