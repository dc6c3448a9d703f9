"""Log-probabilities of emitted tokens (engine/logprobs.py): the target's own, from the row each token was
chosen from, bitwise the same with and without speculation."""

from __future__ import annotations

import pytest
import torch
from helpers.drafts import perturbed_hf_model

from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model.load import load_model
from specdec.model.segments import Segment
from specdec.sampling import SamplingParams

PROMPT = list(range(5, 60)) + list(range(100, 130))  # the tiny model's answer loops from token ~20
LOOP = SpecConfig(drafters=("ngram-simple",), draft_n_max=4)


@pytest.fixture(scope="module")
def model(tiny_hf_dir):
    return load_model(str(tiny_hf_dir), "int8", progress=False)


def run(engine, sampling=SamplingParams(), spec=None, top=3, max_tokens=30):
    req = engine.admit(PROMPT, sampling, max_tokens, spec=spec, logprobs=top)
    while not req.finished:
        engine.step_batch([req])
    engine.finish(req)
    return req


def reference_rows(model, prompt: list[int], output: list[int]) -> torch.Tensor:
    """(len(output), V): log_softmax of the row each output token was chosen from, by plain decoding's numerics:
    the prompt prefilled in one forward (its last row), then the output in one exact forward (a row per step)."""
    cache = model.transformer.new_cache(256, num_slots=1)
    slot = cache.allocate()
    (first,) = model.transformer.forward_batch([Segment(torch.tensor(prompt), slot, exact=False, last_only=True)],
                                               cache)
    (rest,) = model.transformer.forward_batch([Segment(torch.tensor(output[:-1]), slot)], cache)
    return torch.log_softmax(torch.cat([first.logits[0, -1:], rest.logits[0]]).float(), dim=-1)


def test_greedy_logprobs_are_bitwise_the_same_with_speculation(model):
    engine = Engine(model, max_len=256)
    plain, spec = run(engine), run(engine, spec=LOOP)
    assert spec.stats.accepted > 0 and spec.output == plain.output
    assert spec.logprobs == plain.logprobs and len(plain.logprobs) == len(plain.output)
    for entry, token in zip(plain.logprobs, plain.output):
        assert entry.token == token == entry.top[0][0] and entry.logprob == entry.top[0][1] <= 0
        assert len(entry.top) == 3 and entry.top[0][1] >= entry.top[1][1] >= entry.top[2][1]


def test_sampled_logprobs_are_the_targets_at_each_position(model, tmp_path):
    """Each token's logprob is the target's distribution at its position, whatever chose the token (an accepted
    draft, a recovered or a bonus token), and not the sampling settings' (temperature, top-k)."""
    engine = Engine(model, max_len=256)
    sampling = SamplingParams(temperature=1.5, top_k=5, seed=3)
    draft = SpecConfig(drafters=("draft-simple",), draft_model=str(perturbed_hf_model(tmp_path / "d")), draft_n_max=3)
    req = run(engine, sampling, spec=draft, top=0)
    assert req.stats.accepted > 0 and req.stats.accepted < req.stats.drafted  # accepted and rejected drafts
    rows = reference_rows(model, PROMPT, req.output)
    want = rows[torch.arange(len(req.output)), torch.tensor(req.output)].tolist()
    assert [e.logprob for e in req.logprobs] == want  # bitwise: verify rows are decode steps' rows
    assert all(e.top == () for e in req.logprobs)


def test_no_logprobs_unless_asked(model):
    engine = Engine(model, max_len=256)
    req = engine.admit(PROMPT, SamplingParams(), 4)
    while not req.finished:
        engine.step_batch([req])
    engine.finish(req)
    assert req.logprobs == [] and engine.result(req).logprobs is None


@pytest.mark.parametrize("top, error, message", [
    (21, ValueError, "logprobs must be between 0 and 20, got 21"),
    (-1, ValueError, "logprobs must be between 0 and 20, got -1"),
    (True, TypeError, "logprobs must be an integer, got bool"),
])
def test_a_bad_count_is_refused_before_a_slot_is_taken(model, top, error, message):
    engine = Engine(model, max_len=64)
    with pytest.raises(error, match=message):
        engine.admit([5, 6], SamplingParams(), 4, logprobs=top)
    assert len(engine.cache.free_slots) == 1


def test_under_a_grammar_they_are_the_masked_distribution_and_speculation_changes_none(model):
    """Under a JSON schema each logprob is the target's after the grammar's mask (renormalised over the tokens
    it allows: above the unmasked value wherever it forbids some), the same with the grammar drafter on."""
    from dataclasses import replace

    from helpers.grammars import SCHEMA_TEXT

    from specdec.engine.constrain import compile_for

    sampling = replace(SamplingParams(), grammar=compile_for(model, "json_schema", SCHEMA_TEXT))
    engine = Engine(model, max_len=256)
    plain, spec = run(engine, sampling, top=2), run(engine, sampling, spec=LOOP, top=2)
    assert spec.stats.by_drafter.get("grammar") and spec.output == plain.output
    assert spec.logprobs == plain.logprobs
    rows = reference_rows(model, PROMPT, plain.output)
    unmasked = rows[torch.arange(len(plain.output)), torch.tensor(plain.output)].tolist()
    masked = [e.logprob for e in plain.logprobs]
    assert all(m >= u - 1e-5 for m, u in zip(masked, unmasked)) and any(m > u + 0.1 for m, u in zip(masked, unmasked))
