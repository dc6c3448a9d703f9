"""A draft model whose vocabulary is smaller than the target's: a context holding an id it has no row for
gets no draft (it crashed mid-generation), and output stays plain decoding's."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import make_hf_model
from specdec.drafters.draft_model import CrossTokenizerDrafter, DraftModelDrafter
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model.load import load_model
from specdec.sampling import SamplingParams


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory):
    folder = make_hf_model(tmp_path_factory.mktemp("draft") / "d", vocab=300, seed=3)
    return load_model(str(folder), "fp32", progress=False)


@pytest.mark.parametrize("cross", [False, True], ids=["same-tokenizer", "cross-tokenizer"])
def test_ids_past_the_draft_vocabulary_get_no_draft_and_output_is_plain(tiny_model, small_draft, cross):
    def drafter(*_):
        if cross:
            return CrossTokenizerDrafter(small_draft, tiny_model.tokenizer, max_len=128)
        return DraftModelDrafter(small_draft, tiny_model.config.vocab_size, max_len=128)

    spec = SpecConfig(drafters=("draft-simple",), draft_model="small-draft", draft_n_max=3)  # built by drafter()
    plain = Engine(tiny_model, max_len=128)
    engine = Engine(tiny_model, spec, max_len=128, drafter_factory=drafter)
    for prompt in ([5, 6, 7, 8], [5, 400, 7, 8], [5, 6, 7, 499]):
        out = engine.generate(prompt, SamplingParams(), 12)
        assert out.token_ids == plain.generate(prompt, SamplingParams(), 12).token_ids
        if not cross:  # the draft has no row for an id >= 300: nothing fed, nothing drafted
            assert (out.stats.drafted == 0) == (max(prompt) >= 300)


def test_a_smaller_vocabulary_drafts_sampled_requests_too(tiny_model, small_draft):
    """Its processed rows were the draft's width (300), and verification refuses rows not of the target's
    (512): every sampled request with such a draft failed at its first verify. Padded with zeros now (the
    target's ids past the draft's rows have draft probability 0)."""
    drafter = DraftModelDrafter(small_draft, tiny_model.config.vocab_size, max_len=128)
    spec = SpecConfig(drafters=("draft-simple",), draft_model="small-draft", draft_n_max=3)
    engine = Engine(tiny_model, spec, max_len=128, drafter_factory=lambda *_: drafter)
    out = engine.generate([5, 6, 7, 8], SamplingParams(temperature=1.0, seed=1), 20)
    assert len(out.token_ids) == 20 and out.stats.drafted > 0
    drafter.begin([5, 6, 7, 8], SamplingParams(temperature=1.0), None)
    draft = drafter.propose([5, 6, 7, 8], 3)
    assert draft.draft_probs.shape == (3, tiny_model.config.vocab_size)
    assert draft.draft_probs[:, 300:].abs().sum() == 0 and torch.allclose(draft.draft_probs.sum(-1), torch.ones(3))


@pytest.mark.parametrize("prompt_len", [10, 40])
def test_a_draft_model_of_a_shorter_context_stops_drafting_at_its_end(tiny_model, tmp_path, prompt_len):
    """Its cache is its own context (32 here): past it the request failed ('would exceed the cache length');
    now it drafts while it fits and the answer is plain decoding's."""
    folder = make_hf_model(tmp_path / "short", seed=1, extra_config={"max_position_embeddings": 32})
    draft = load_model(str(folder), "fp32", progress=False)
    spec = SpecConfig(drafters=("draft-simple",), draft_model="short", draft_n_max=3)
    prompt = list(range(5, 5 + prompt_len))
    plain = Engine(tiny_model, max_len=128).generate(prompt, SamplingParams(), 30)
    for cross in (False, True):
        drafter = (CrossTokenizerDrafter(draft, tiny_model.tokenizer, max_len=128) if cross
                   else DraftModelDrafter(draft, tiny_model.config.vocab_size, max_len=128))
        out = Engine(tiny_model, spec, max_len=128, drafter_factory=lambda *_: drafter).generate(
            prompt, SamplingParams(), 30)
        assert out.token_ids == plain.token_ids
        if not cross:  # a prompt past its context: nothing to draft from
            assert (out.stats.drafted > 0) == (prompt_len < 32)


def test_cross_tokenizer_drafts_to_the_end_of_a_short_context(tiny_model):
    """The inner draft's cache is the target's context, and the draft's ids can outnumber the target's: it
    overflowed ('would exceed the cache length 48') where plain decoding ends with 'length'."""
    drafter = CrossTokenizerDrafter(tiny_model, tiny_model.tokenizer, max_len=48)
    spec = SpecConfig(drafters=("draft-simple",), draft_model="self", draft_n_max=3, cross_tokenizer=True)
    prompt = tiny_model.tokenizer.encode("the then there")
    plain = Engine(tiny_model, max_len=48).generate(prompt, SamplingParams(), 100)
    out = Engine(tiny_model, spec, max_len=48, drafter_factory=lambda *_: drafter).generate(
        prompt, SamplingParams(), 100)
    assert out.token_ids == plain.token_ids and out.finish_reason == plain.finish_reason
