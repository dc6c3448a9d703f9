"""A draft model whose vocabulary is smaller than the target's: a context holding an id it has no row for
gets no draft (it crashed mid-generation), and output stays plain decoding's."""

from __future__ import annotations

import pytest

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
