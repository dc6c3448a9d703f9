"""Gemma 4's assistant drafter (gemma4_assistant, drafters/gemma4_assistant.py) as draft-mtp, against the reference:
tests/model/data/gemma4-tiny (the text model and a centroid-clustered assistant, both written by transformers).

Its logits and greedy drafts are transformers' (Gemma4AssistantForCausalLM stepped as its candidate generator
steps it, from the target's shared_kv_states and last hidden state); speculative greedy output is plain
decoding's, alone, in a batch and with trees; sampled output follows the target's law exactly; auto lights it
up when it is given with -md or sits beside the model."""

from __future__ import annotations

import shutil

import pytest
import torch

from helpers.distribution import engine_law, generate_law, law_gap
from helpers.gemma4 import FIXTURE, assistant_folder, echo_assistant_folder
from helpers.spec import spec_for_model
from specdec.drafters.gemma4_assistant import AssistantError, make_assistant_drafter
from specdec.drafters.mtp import make_mtp_drafter
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

HF, ASSISTANT = FIXTURE / "hf", FIXTURE / "assistant"
PROMPTS = [[5, 9, 33, 70, 12, 8, 100, 3, 44, 91, 17, 23], [5, 9, 3]]

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def target():
    return load_model(str(HF), "fp32", progress=False, weight_cache=False)


def reference_drafts(prompt, k, assistant=ASSISTANT):
    """transformers' drafts and logits after `prompt` (the target's greedy token x_m, then k assistant steps)."""
    from transformers import AutoModelForCausalLM, Gemma4AssistantForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(HF, dtype=torch.float32).eval()
    helper = Gemma4AssistantForCausalLM.from_pretrained(assistant, dtype=torch.float32).eval()
    m = len(prompt)
    with torch.no_grad():
        out = ref(torch.tensor([prompt]), output_hidden_states=True, return_shared_kv_states=True, use_cache=False)
        token, hidden = out.logits[:, -1:].argmax(-1), out.hidden_states[-1][:, -1:]
        x_m, tokens, logits = int(token), [], []
        for _ in range(k):
            step = helper(inputs_embeds=torch.cat([ref.get_input_embeddings()(token), hidden], -1),
                          position_ids=torch.tensor([[m]]), shared_kv_states=out.shared_kv_states,
                          attention_mask=torch.ones(1, m + 1, dtype=torch.long), use_cache=False)
            token, hidden = step.logits.argmax(-1), step.last_hidden_state
            tokens.append(int(token))
            logits.append(step.logits[0, 0])
    return x_m, tokens, torch.stack(logits)


def our_drafts(target, prompt, x_m, k, folder=ASSISTANT):
    drafter = make_mtp_drafter(target, folder=folder)
    tr = target.transformer
    cache = tr.new_cache(64)
    out = tr.forward(torch.tensor([prompt]), cache, [cache.allocate()], hidden_layers=drafter.hidden_layers,
                     exact=False)
    drafter.begin(prompt)
    drafter.on_target_hidden({layer: h[0] for layer, h in out.hidden.items()}, prompt)
    seen = []
    step = drafter.assistant.step
    drafter.assistant.step = lambda *a: seen.append(step(*a)) or seen[-1]
    draft = drafter.propose(prompt + [x_m], k)
    return list(draft.tokens), torch.cat([logits for logits, _ in seen])


@pytest.mark.parametrize("centroids", [16, 0], ids=["centroid-head", "full-head"])
def test_drafts_and_logits_are_the_reference_assistants(target, tmp_path, centroids):
    folder = ASSISTANT if centroids else assistant_folder(tmp_path / "full", seed=4)
    for prompt in PROMPTS:  # 12 tokens: past the sliding window of 4; 3 tokens: within it
        x_m, tokens, theirs = reference_drafts(prompt, 4, folder)
        ours, logits = our_drafts(target, prompt, x_m, 4, folder)
        assert ours == tokens
        err = (logits - theirs).abs().max().item()
        assert err <= 1e-5 * max(1.0, theirs.abs().max().item()), f"max |specdec - transformers| = {err:.2e}"


def _engines(target, assistant=ASSISTANT, **spec):
    plain = Engine(target, SpecConfig(), max_len=128, max_sequences=2)
    fast = Engine(target, SpecConfig(drafters=("draft-mtp",), draft_model=str(assistant), draft_n_max=3, **spec),
                  max_len=128, max_sequences=2)
    return plain, fast


@pytest.fixture(scope="module")
def echo(tmp_path_factory):
    return echo_assistant_folder(tmp_path_factory.mktemp("echo") / "assistant")


@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("which", ["random", "echo"])
def test_greedy_output_is_plain_decoding_alone_and_in_a_batch(target, echo, tree, which):
    """The random assistant's drafts are rejected, the echo assistant's (helpers/gemma4) accepted: both keep
    plain decoding's tokens, alone and two requests stepped together."""
    plain, fast = _engines(target, ASSISTANT if which == "random" else echo,
                           **({"tree_topk": 2, "tree_budget": 5} if tree else {}))
    want = [plain.generate(p, SamplingParams(), max_tokens=24).token_ids for p in PROMPTS]
    alone = [fast.generate(p, SamplingParams(), max_tokens=24) for p in PROMPTS]
    assert [r.token_ids for r in alone] == want
    drafted, accepted = sum(r.stats.drafted for r in alone), sum(r.stats.accepted for r in alone)
    assert drafted > 0 and (accepted == 0 if which == "random" else accepted > drafted / 2)
    reqs = [fast.start(p, SamplingParams(), 24) for p in PROMPTS]
    while not all(r.finished for r in reqs):
        fast.step_batch([r for r in reqs if not r.finished])
    assert [list(r.output) for r in reqs] == want


def test_sampled_output_follows_the_target_law_exactly(target, echo, monkeypatch):
    """Every random draw of generate enumerated (helpers/distribution.generate_law): the law of 3 tokens
    with the assistant's sampled drafts is the target's own."""
    sampling = dict(temperature=1.0, top_k=3)
    prompt = PROMPTS[1]
    _, fast = _engines(target, echo)
    law, accepted = generate_law(monkeypatch, fast, prompt, **sampling)
    assert accepted > 0.1, "the drafts are never accepted: verification of them is not tested"
    assert law_gap(law, engine_law(target, prompt, SamplingParams(**sampling))) < 1e-6


def test_auto_lights_it_up_given_with_md_or_found_beside_the_model(target, tmp_path):
    spec, reasons = spec_for_model(target, spec_type="auto", model_draft=str(ASSISTANT))
    assert "draft-mtp" in [d.kind for d in spec.drafters] and spec.draft_model == str(ASSISTANT), reasons
    shutil.copytree(HF, tmp_path / "g4")
    shutil.copytree(ASSISTANT, tmp_path / "g4-assistant")
    model = load_model(str(tmp_path / "g4"), "fp32", progress=False, weight_cache=False)
    spec, reasons = spec_for_model(model, spec_type="auto")
    assert "draft-mtp" in [d.kind for d in spec.drafters], reasons
    assert any("assistant" in r for r in reasons), reasons
    assert "g4-assistant" in make_mtp_drafter(model).source_note


def test_unfit_assistants_are_refused_with_a_reason(target, tmp_path):
    with pytest.raises(AssistantError, match="give its folder with -md"):
        make_assistant_drafter(target)
    wide = assistant_folder(tmp_path / "wide", head_dim=8)
    with pytest.raises(AssistantError, match="key heads of 8"):
        make_assistant_drafter(target, wide)
