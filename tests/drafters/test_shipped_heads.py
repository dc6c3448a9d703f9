"""The MTP and EAGLE-3 heads shipped for smollm2-135m: found, small, lossless with the real target."""

from __future__ import annotations

import json

import pytest

from helpers.distribution import engine_law, fit_pvalue, sample_continuations
from specdec.drafters.eagle3 import make_eagle3_drafter
from specdec.drafters.mtp import HEADS_DIR, make_mtp_drafter, shipped_head
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams
from specdec.train.data import load_sequences

pytestmark = pytest.mark.slow

FOLDER = HEADS_DIR / "smollm2-135m"
PROMPTS = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
           "Explain how a hash table handles collisions."]


def chat_ids(model, text: str) -> list[int]:
    tok = model.tokenizer
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))


def drafter_for(model, kind: str, topk: int, budget: int = 0, max_len: int = 1024):
    make = make_mtp_drafter if kind == "mtp" else make_eagle3_drafter
    return make(model, max_len=max_len, topk=topk, budget=budget or 3)


def test_heads_are_shipped_small_and_recorded(smollm):
    for kind in ("mtp", "eagle3"):
        folder = shipped_head(kind, smollm)
        assert folder == FOLDER / kind
        weights = folder / "model.safetensors"
        assert weights.stat().st_size < 20 * 2**20
        summary = json.loads((folder / "train_summary.json").read_text())
        assert summary["kind"] == kind and summary["steps"] > 0
        target = json.loads((folder / "config.json").read_text())["specdec"]["target"]
        assert smollm.info.sha256 in target["sha256"]
    seqs = load_sequences(FOLDER / "train_data.npz")
    assert len(seqs) > 1000 and all(0 <= t < smollm.config.vocab_size for t in seqs[0])


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
@pytest.mark.parametrize("topk,budget", [(1, 0), (2, 5)])
def test_shipped_heads_keep_greedy_output_identical(smollm, kind, topk, budget):
    plain = Engine(smollm, SpecConfig(), max_len=1024)
    drafter = drafter_for(smollm, kind, topk, budget)
    engine = Engine(smollm, SpecConfig(types=(drafter.name,), draft_n_max=3), max_len=1024,
                    drafter_factory=lambda name, spec: drafter)
    accepted = 0
    for text in PROMPTS:
        prompt = chat_ids(smollm, text)
        result = engine.generate(prompt, max_tokens=40)
        assert result.token_ids == plain.generate(prompt, max_tokens=40).token_ids
        accepted += result.stats.accepted
    assert accepted > 10, "the shipped head drafted (almost) nothing right: it is not the trained one"


def test_shipped_heads_through_the_cli_flags(smollm):
    """--spec-type draft-eagle3 with a tree shape, built by the engine's own drafter factory."""
    from specdec.engine.config import spec_config_from_flags

    spec, _ = spec_config_from_flags("draft-eagle3", tree_topk=2, tree_budget=4)
    engine = Engine(smollm, spec, max_len=1024)
    prompt = chat_ids(smollm, PROMPTS[0])
    result = engine.generate(prompt, max_tokens=24)
    assert result.token_ids == Engine(smollm, SpecConfig(), max_len=1024).generate(prompt, max_tokens=24).token_ids
    assert result.stats.drafted > 0


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_sampled_tree_keeps_the_target_distribution(smollm, kind):
    """Seeded chi-square: (t1, t2, t3) sampled with a shipped head's trees vs the exact target law."""
    sampling = dict(temperature=1.0, top_k=3)
    prompt = chat_ids(smollm, "Write a poem about the sea.")
    prompt += Engine(smollm, SpecConfig(), max_len=256).generate(prompt, max_tokens=4).token_ids

    law = engine_law(smollm, prompt, SamplingParams(**sampling))
    drafter = drafter_for(smollm, kind, topk=2, budget=4, max_len=256)
    engine = Engine(smollm, SpecConfig(types=(drafter.name,), draft_n_max=2), max_len=256,
                    drafter_factory=lambda name, spec: drafter)
    counts, _, accepted = sample_continuations(engine, prompt, 800, **sampling)
    assert accepted > 60, "tree drafts were (almost) never accepted: the test would not exercise tree verification"
    assert fit_pvalue(counts, law) > 1e-3, f"sampled continuations do not follow the target's law: {counts}"
