"""Speculation on a Qwen3.5 hybrid (tests/model/data/qwen35-tiny: written by transformers' own classes, converted
by llama.cpp's own converter): its MTP layer against a float64 reference of the block (helpers/qwen35.py, read
from vLLM and llama.cpp), draft-mtp lit up by itself in the folder and in the GGUF file, greedy speculative
output bitwise plain decoding alone and in a batch while drafts are accepted and rejected (the recurrent state
rolled back), and the exact law of sampled output.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers.distribution import engine_law
from helpers.drafts import Biased, likely_bias, random_mtp_head
from helpers.oracle import assert_batched_oracles_keep_plain, assert_oracle_keeps_plain, plain
from helpers.qwen35 import FIXTURE, mtp_reference
from helpers.spec import spec_for_model
from helpers.tree_law import mtp_law
from specdec.bench.memory import KV_VALUE_BYTES
from specdec.cli.inspect import inspect_model
from specdec.drafters.mtp import load_mtp_head
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model import kernels
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

TOKENS = [(7 * i + 3) % 260 for i in range(40)]
HF, F32, Q8 = FIXTURE / "hf", FIXTURE / "f32.gguf", FIXTURE / "q8_0.gguf"
PROMPTS = [TOKENS[2:12], TOKENS[12:19], TOKENS[20:33]]  # answers of 24 tokens in every format (no early EOS)



pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def load(path, fmt="fp32"):
    return load_model(str(path), fmt, progress=False, weight_cache=False)


MODELS = [(HF, "fp32"), (HF, "int8"), (Q8, "gguf")]


@pytest.fixture(scope="module", params=MODELS, ids=[f for _, f in MODELS])
def target(request):
    path, fmt = request.param
    if fmt == "gguf" and kernels.gguf() is None:
        pytest.skip("no GGUF kernel here (no cc or no AVX2)")
    return load(path, fmt)


# -- the MTP layer ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [HF, F32], ids=["folder", "llama.cpp-f32"])
def test_the_mtp_layer_is_the_reference_block(path):
    """Logits and the fed-forward output of Qwen3.5's MTP block over the target's own rows, as the float64
    reference computes them from the checkpoint's tensors and transformers' final hidden rows."""
    from transformers import AutoModelForCausalLM

    model = load(path)
    head, _ = load_mtp_head(model, 128)
    T, L = 24, model.config.num_layers
    tr = model.transformer
    cache = tr.new_cache(64)
    out = tr.forward(torch.tensor([TOKENS[:T]]), cache, [cache.allocate()], exact=True, hidden_layers=(L,))
    feats = head.feature({L: out.hidden[L][0, : T - 1]})[None]  # (1, T-1, H) the target's normed rows
    positions = torch.arange(T - 1)[None]
    with torch.no_grad():
        logits, fed, _, _ = head.step(0, feats, torch.tensor([TOKENS[1:T]]), positions, None, None,
                                      torch.ones(1, T - 1, T - 1, dtype=torch.bool).tril())
        ref = AutoModelForCausalLM.from_pretrained(HF, dtype=torch.float32).eval()
        hidden = ref.model(input_ids=torch.tensor([TOKENS[:T]])).last_hidden_state[0, : T - 1]
    t = load_file(str(HF / "model.safetensors"))
    cfg = json.loads((HF / "config.json").read_text())
    want, want_fed = mtp_reference(t, cfg, t["model.embed_tokens.weight"], t["lm_head.weight"], hidden, TOKENS[1:T],
                                   list(range(T - 1)))
    scale = want.abs().max().item()
    assert (logits[0].double() - want).abs().max().item() < 1e-4 * scale
    assert torch.equal(logits[0].argmax(-1), want.argmax(-1))
    assert (fed[0].double() - want_fed).abs().max().item() < 1e-4 * want_fed.abs().max().item()


@pytest.mark.parametrize("path,fmt", [(HF, "fp32"), (Q8, "fp32")], ids=["folder", "llama.cpp-q8_0"])
def test_draft_mtp_lights_up_by_itself_and_drafts(path, fmt):
    model = load(path, fmt)
    assert model.config.mtp_layers_declared == 1
    spec, _ = spec_for_model(model)
    assert "draft-mtp" in [d.kind for d in spec.drafters]
    report = inspect_model(str(path))
    assert report["runnable"] and report["mtp"]["weights_present"] and "draft-mtp" in report["auto"]["types"]
    # memory: keys and values in the one full-attention layer; 8 + 1 states of the 3 linear layers a sequence
    memory, cache = report["memory"], model.transformer.new_cache(64)
    assert memory["kv_bytes_per_1k_tokens"] == 1024 * 2 * 1 * 16 * KV_VALUE_BYTES[memory["kv_cache"]]
    assert memory["recurrent_bytes_per_sequence"] == (cache.history + 1) * cache.state_bytes() == 9 * 3 * 4 * (
        3 * 64 + 4 * 8 * 8)
    engine = Engine(model, SpecConfig(drafters=("draft-mtp",)), max_len=128)
    r = engine.generate(PROMPTS[0], SamplingParams(), max_tokens=12)
    assert r.stats.drafted > 0 and r.token_ids == plain(model, PROMPTS[0], 12)


# -- greedy: bitwise plain decoding -------------------------------------------------------------------------
def test_greedy_speculation_is_plain_decoding_through_every_rollback(target):
    n = 24
    for prompt in PROMPTS:
        answer = assert_oracle_keeps_plain(target, prompt, n)
        mtp = Engine(target, SpecConfig(drafters=("draft-mtp",)), max_len=128)
        r = mtp.generate(prompt, SamplingParams(), max_tokens=n)
        assert r.token_ids == answer and r.stats.drafted > 0


def test_batched_requests_give_their_solo_answers(target):
    """Three requests in one forward a step, the third joining late and prefilling beside the others' verify."""
    n = [20, 14, 16]
    assert_batched_oracles_keep_plain(target, PROMPTS, n)


def test_a_batched_verify_is_bitwise_each_sequence_alone_with_draft_mtp(target):
    reqs_alone = [Engine(target, SpecConfig(drafters=("draft-mtp",)), max_len=128).generate(
        p, SamplingParams(), max_tokens=10).token_ids for p in PROMPTS]
    engine = Engine(target, SpecConfig(drafters=("draft-mtp",)), max_len=128, max_sequences=3)
    reqs = [engine.admit(p, SamplingParams(), 10) for p in PROMPTS]
    while not all(r.finished for r in reqs):
        engine.step_batch([r for r in reqs if not r.finished])
    assert [r.output for r in reqs] == reqs_alone
    assert all(r.stats.drafted > 0 for r in reqs)


# -- sampling: the target's law -----------------------------------------------------------------------------
SAMPLING = dict(temperature=1.0, top_k=2)


def test_sampled_output_follows_the_target_law(monkeypatch):
    """Exact law (every random draw enumerated, helpers/tree_law.py) of 4 sampled tokens with a random MTP
    head biased towards the tokens the target can emit: drafts accepted at some steps, rejected at others."""
    model = load(HF)
    prompt = PROMPTS[0]
    likely = {t for seq in engine_law(model, prompt, SamplingParams(**SAMPLING), depth=3) for t in seq[1:]}
    head = random_mtp_head(model, Biased(model.transformer.lm_head, likely_bias(model, likely)), max_len=64)
    law, gap = mtp_law(monkeypatch, model, head, prompt, **SAMPLING)
    assert 0 < law.accepted < 2
    assert gap < 1e-6


def test_a_hybrid_draft_model_drafts_past_its_ring_and_rolls_back(monkeypatch):
    """draft-simple with a hybrid draft model (the GGUF Q8_0 of the target: near it, not equal) drafting 10
    tokens a step, more than the 8 states its ring holds: a rollback past them prefills the draft again."""
    from specdec.cache.recurrent import HybridCache

    seen = []
    restorable = HybridCache.restorable
    monkeypatch.setattr(HybridCache, "restorable",
                        lambda self, slot, length: seen.append(restorable(self, slot, length)) or seen[-1])
    model = load(HF)
    for prompt in PROMPTS:
        answer = plain(model, prompt, 30)
        engine = Engine(model, SpecConfig(drafters=("draft-simple",), draft_model=str(Q8), draft_n_max=10),
                        max_len=128)
        r = engine.generate(prompt, SamplingParams(), max_tokens=30)
        assert r.token_ids == answer
        assert 0 < r.stats.accepted < r.stats.drafted
    assert False in seen and True in seen  # both: rolled back within the ring, and prefilled again past it
