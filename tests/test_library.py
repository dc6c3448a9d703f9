"""The library (specdec.LLM): its contract on the tiny model (text and ids, batches, streams, limits, one
ValueError per mistake), and on smollm2-135m the guide's examples as written (docs/library.md) and greedy
answers equal to `specdec generate --json`'s, token for token."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import specdec
from specdec.cli import main

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "library.md"
MISSING = "/nonexistent/model.gguf"  # a setting checked before loading is refused before this is looked for
CHAT = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def llm(tiny_hf_dir):
    return specdec.LLM(str(tiny_hf_dir), weights="fp32", spec_type="suffix", ctx_size=192, max_batch=2,
                       progress=False)


def cli_json(capsys, argv) -> dict:
    assert main(["generate", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_text_ids_and_chat_give_the_command_lines_answers(capsys, tiny_hf_dir, llm):
    model = ["--model", str(tiny_hf_dir), "--weights", "fp32", "--spec-type", "suffix", "-c", "192", "-n", "12"]
    cli = cli_json(capsys, [*model, "hello world"])
    out = llm.generate("hello world", max_tokens=12)
    assert list(out.token_ids) == cli["token_ids"] and out.text == cli["text"]
    assert (out.finish_reason, out.prompt_tokens, out.completion_tokens) == \
        (cli["finish_reason"], cli["prompt_tokens"], cli["completion_tokens"])
    assert llm.generate(llm.tokenizer.encode("hello world"), max_tokens=12).token_ids == out.token_ids
    cli = cli_json(capsys, [*model, "--chat", "hello there"])
    assert list(llm.chat(CHAT, max_tokens=12).token_ids) == cli["token_ids"]


def test_a_batch_gives_each_prompt_its_solo_answer_in_order(llm):
    prompts = ["the cat", [5, 6, 7, 8], "on the mat", "a"]  # four prompts, two slots: two wait for a place
    solo = [llm.generate(p, max_tokens=10, stop="ff") for p in prompts]
    batch = llm.generate(prompts, max_tokens=10, stop="ff")
    assert [b.token_ids for b in batch] == [s.token_ids for s in solo]
    assert [b.text for b in batch] == [s.text for s in solo]
    assert {s.finish_reason for s in solo} == {"stop", "length"}  # answers of several lengths ran together
    assert isinstance(llm.generate(["the cat"], max_tokens=3), list)
    assert [c.token_ids for c in llm.chat([CHAT, CHAT], max_tokens=4)] == [llm.chat(CHAT, max_tokens=4).token_ids] * 2
    assert len(llm.engine.cache.free_slots) == 2


def test_a_stream_sends_the_answer_in_pieces_and_ends_with_it(llm):
    whole = llm.generate("the cat", max_tokens=40)
    stream = llm.stream("the cat", max_tokens=40)
    assert stream.result is None  # nothing runs before it is read
    pieces = list(stream)
    assert len(pieces) > 1 and "".join(pieces) == whole.text == stream.result.text
    assert stream.result.token_ids == whole.token_ids
    stop = whole.text[len(whole.text) // 2 : len(whole.text) // 2 + 3]
    cut = llm.generate("the cat", max_tokens=40, stop=stop)
    stream = llm.stream("the cat", max_tokens=40, stop=stop)
    pieces = list(stream)
    assert cut.finish_reason == "stop" and "".join(pieces) == cut.text == whole.text[: whole.text.index(stop)]
    chat = llm.stream_chat(CHAT, max_tokens=6)
    assert "".join(chat) == llm.chat(CHAT, max_tokens=6).text == chat.result.text


def test_leaving_a_stream_early_gives_its_place_back(llm):
    stream = llm.stream("the cat", max_tokens=40)
    next(stream)
    assert len(llm.engine.cache.free_slots) == 1
    stream.close()
    assert stream.result is None and len(llm.engine.cache.free_slots) == 2
    held = llm.stream("the cat", max_tokens=40)
    next(held)  # one slot held by a stream left unread: a batch runs in the other
    assert len(llm.generate(["a", "b", "c"], max_tokens=3)) == 3
    held.close()


def test_an_answer_cut_by_a_limit_says_which(llm):
    out = llm.generate("the cat", max_tokens=5)
    assert (out.finish_reason, out.cut_by, len(out.token_ids)) == ("length", "max_tokens", 5)
    for answer in (llm.chat(CHAT), llm.generate("the cat", max_tokens=None), llm.generate("the cat", max_tokens=-1)):
        assert (answer.finish_reason, answer.cut_by) == ("length", "context")  # a random model never ends a turn
        assert answer.prompt_tokens + len(answer.token_ids) == llm.context == 192  # past 128: chat has no -n
    ended = llm.generate("the cat", max_tokens=40, stop="ff")
    assert (ended.finish_reason, ended.cut_by) == ("stop", None)


@pytest.mark.parametrize("call, message", [
    (lambda llm: llm.generate(""), "the prompt is empty"),
    (lambda llm: llm.generate([]), "no prompt: give a text, a list of token ids, or a list of those"),
    (lambda llm: llm.generate([[]]), "a prompt is a text or a list of token ids"),
    (lambda llm: llm.generate([1, 2.5]), "a prompt is a text or a list of token ids (whole numbers)"),
    (lambda llm: llm.generate([1, True]), "a prompt is a text or a list of token ids"),
    (lambda llm: llm.generate({"prompt": "hi"}), "a prompt is a text or a list of token ids"),
    (lambda llm: llm.generate([1, 10**6]), "prompt token id 1000000 is outside the vocabulary (0..511)"),
    (lambda llm: llm.generate("word " * 300), "the context holds 192"),
    (lambda llm: llm.generate("caf\udce9"), "the text is not valid UTF-8"),
    (lambda llm: llm.generate("hi", max_tokens=0), "max_tokens must be a whole number of at least 1, or None"),
    (lambda llm: llm.generate("hi", max_tokens=2.5), "max_tokens must be a whole number"),
    (lambda llm: llm.generate("hi", stop=[1]), "stop must be a string or a list of strings"),
    (lambda llm: llm.generate("hi", stop=[""]), "stop strings must be non-empty strings"),
    (lambda llm: llm.generate("hi", temperature=-1), "temperature must be a finite number >= 0"),
    (lambda llm: llm.generate("hi", top_p=0), "top_p must be in (0, 1]"),
    (lambda llm: llm.stream(["a", "b"]), "stream takes one prompt"),
    (lambda llm: llm.chat("hello"), "messages must be a non-empty list of"),
    (lambda llm: llm.chat([]), "messages must be a non-empty list of"),
    (lambda llm: llm.chat([{"role": "user"}]), "message 0 must be a dict with 'role' and 'content' strings"),
    (lambda llm: llm.stream_chat([{"role": "user", "content": 5}]), "message 0 must be a dict"),
])
def test_each_mistake_is_one_value_error_and_costs_nothing(llm, call, message):
    with pytest.raises(ValueError) as exc:
        call(llm)
    assert message in str(exc.value)
    assert len(llm.engine.cache.free_slots) == 2 and llm.generate("a", max_tokens=2).completion_tokens == 2


@pytest.mark.parametrize("settings, message", [
    ({"threads": 0}, "--threads must be a whole number of at least 1, got 0"),
    ({"ctx_size": -1}, "--ctx-size must be 0 (the model's context length) or more, got -1"),
    ({"spec_type": "no-such-kind"}, "no-such-kind"),
    ({"spec_type": "none", "spec_draft_n_max": 3}, "turns speculation off, so --spec-draft-n-max would not be used"),
    ({"speculative_config": {"method": "ngram", "bogus": 1}}, "--speculative-config has unknown keys: bogus"),
    ({"max_batch": 0}, "max_batch must be a whole number of at least 1, got 0"),
    ({"spec_adaptive": "yes"}, "spec_adaptive must be True or False, got 'yes'"),
])
def test_a_bad_setting_is_refused_before_the_model_loads(settings, message):
    with pytest.raises(ValueError) as exc:
        specdec.LLM(MISSING, **settings)
    assert message in str(exc.value) and MISSING not in str(exc.value)


def test_prompts_and_settings_as_other_libraries_pass_them(llm):
    """numpy / torch ids (vLLM takes them), stop=None and top_k=-1 (vLLM's and OpenAI's "none")."""
    import numpy as np

    ids = llm.tokenizer.encode("the cat")
    want = llm.generate(ids, max_tokens=6).token_ids
    assert llm.generate(np.array(ids), max_tokens=6, stop=None, top_k=-1).token_ids == want
    assert [c.token_ids for c in llm.generate(torch.tensor([ids, ids]), max_tokens=6)] == [want, want]


def test_speculative_config_is_vllms_object_as_a_dict(tiny_hf_dir, llm):
    ngram = specdec.LLM(str(tiny_hf_dir), weights="fp32", ctx_size=128, progress=False,
                        speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert (ngram.speculation, llm.speculation) == ("ngram-simple", "suffix")
    assert ngram.generate("the cat", max_tokens=20).token_ids == llm.generate("the cat", max_tokens=20).token_ids


def guide_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", GUIDE.read_text(), re.M | re.S)


@pytest.fixture(scope="module")
def guide():
    """The guide's Python blocks run in order in one namespace, as a reader would paste them."""
    threads = torch.get_num_threads()
    namespace: dict = {}
    try:
        for i, block in enumerate(guide_blocks()):
            exec(compile(block, f"docs/library.md block {i + 1}", "exec"), namespace)
    finally:
        torch.set_num_threads(threads)  # threads= holds for the process: the tests after keep theirs
    return namespace


@pytest.mark.slow
def test_the_guides_examples_run_as_written(guide):
    assert len(guide_blocks()) >= 8
    assert isinstance(guide["llm"], specdec.LLM) and guide["out"].cut_by == "max_tokens"
    assert guide["answer"].text and guide["stream"].result is not None


@pytest.mark.slow
def test_greedy_answers_are_the_command_lines_token_for_token(capsys, guide):
    llm = guide["llm"]  # smollm2-135m's GGUF blocks, suffix drafting, a 1024-token context
    model = ["-m", "smollm2-135m", "--spec-type", "suffix", "-c", "1024"]
    prompt = "Write a Python function that checks whether a string is a palindrome."
    cli = cli_json(capsys, [*model, "-n", "24", prompt])
    assert list(llm.generate(prompt, max_tokens=24).token_ids) == cli["token_ids"]
    batch = llm.generate([prompt, "def fib(n):", "The capital of France is"], max_tokens=24)
    assert list(batch[0].token_ids) == cli["token_ids"]  # in a batch of three too
    cli = cli_json(capsys, [*model, "-n", "24", "--chat", prompt])
    assert list(llm.chat([{"role": "user", "content": prompt}], max_tokens=24).token_ids) == cli["token_ids"]
