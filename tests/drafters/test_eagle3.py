"""draft-eagle3: the head's config and file format, its draft vocabulary, load errors, and
greedy exactness with the engine, on the tiny random target and a random head.

The shipped smollm2 head (real weights, sampled trees): test_shipped_heads.py; heads that
`specdec train eagle3` writes: tests/train/test_train.py.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.tiny import EAGLE3_DRAFT_IDS as DRAFT_IDS
from helpers.tiny import random_eagle3_head as random_head
from specdec.drafters.eagle3 import (Eagle3Config, Eagle3Error, Eagle3Head, default_taps, load_eagle3_head,
                                     make_eagle3_drafter, save_eagle3_head)
from specdec.drafters.eagle_formats import EAGLE
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine

@pytest.fixture
def head_dir(tiny_model, tmp_path):
    """In the flat layout, whose config.json keys the edits below change (the speculators one: test_published)."""
    return save_eagle3_head(random_head(tiny_model), tmp_path / "eagle3", layout=EAGLE)


def test_taps_default_to_eagle3s_layers_unless_the_config_names_them():
    raw = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512}
    assert default_taps(30) == (2, 15, 27)
    assert default_taps(6) == (2, 3, 3)
    assert default_taps(2) == (2, 1, 0) and default_taps(1) == (1, 0, 0)  # N - 3 was -1: a KeyError in training
    assert Eagle3Config.from_json(raw, 30).taps == (2, 15, 27)
    raw["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, 5, 9]}
    assert Eagle3Config.from_json(raw, 30).taps == (1, 5, 9)
    cfg = Eagle3Config.from_json(raw, 30)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.draft_vocab_size) == (4, 16, 512)  # what an absent key means


def test_config_round_trips_through_json(tiny_model):
    cfg = random_head(tiny_model).cfg
    raw = cfg.to_json()
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"] and raw["draft_vocab_size"] == len(DRAFT_IDS)
    assert Eagle3Config.from_json(json.loads(json.dumps(raw)), tiny_model.config.num_layers) == cfg


def test_saved_head_loads_back_as_saved(tiny_model, head_dir):
    """Weights are stored in bf16 (d2t and t2d exactly); loading gives the same tensors back."""
    original = random_head(tiny_model)
    loaded = load_eagle3_head(head_dir, tiny_model)
    assert loaded.cfg == original.cfg
    theirs = loaded.state_dict()
    for name, tensor in original.state_dict().items():
        if name.startswith("rope_"):
            continue
        want = tensor if name in ("d2t", "t2d") else tensor.to(torch.bfloat16).float()
        assert torch.equal(theirs[name], want), name
    assert torch.equal(loaded.draft_to_target(), DRAFT_IDS)
    assert torch.equal(loaded.t2d.nonzero().flatten(), DRAFT_IDS)


def test_logits_outside_the_draft_vocabulary_are_minus_infinity(tiny_model):
    head = random_head(tiny_model)
    H = tiny_model.config.hidden_size
    feats = torch.randn(1, 3, H, generator=torch.Generator().manual_seed(1))  # (B, T, H)
    mask = torch.ones(1, 3, 3, dtype=torch.bool).tril()
    with torch.no_grad():
        logits, out, _, _ = head.step(0, feats, torch.tensor([[11, 12, 13]]), torch.tensor([[3, 4, 5]]), None, None,
                                      mask)
    assert logits.shape == (1, 3, tiny_model.config.vocab_size) and out.shape == (1, 3, H)
    for row in logits[0]:  # (V,) per position: finite exactly at the draft vocabulary's target ids
        assert torch.equal(torch.isfinite(row).nonzero().flatten(), DRAFT_IDS)
        assert torch.isneginf(row[~torch.isfinite(row)]).all()


def _edit(folder, config=None, drop=(), tensors=None):
    if config is not None:
        raw = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**raw, **config}))
    weights = load_file(str(folder / "model.safetensors"))
    weights = {k: v for k, v in {**weights, **(tensors or {})}.items() if k not in drop}
    save_file(weights, str(folder / "model.safetensors"))


@pytest.mark.parametrize("edit, message", [
    (lambda f: (f / "config.json").unlink(), r"not an EAGLE-3 head folder \(no config.json\)"),
    (lambda f: _edit(f, {"vocab_size": 100_000}),
     r"was trained for a vocabulary of 100000 tokens; the target .* has 512: it belongs to another model"),
    (lambda f: _edit(f, {"hidden_size": 32, "head_dim": 8}),
     r"expects target hidden size 32; the target .* has 64: it belongs to another model"),
    (lambda f: _edit(f, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 9]}}),
     r"taps layers \(0, 1, 9\), beyond the target's 2 layers"),
    (lambda f: (f / "model.safetensors").unlink(), r"no weights \(\*.safetensors, or EAGLE's pytorch_model.bin\)"),
    (lambda f: _edit(f, drop=("d2t",)), r"has a reduced vocabulary but no d2t tensor"),
    (lambda f: _edit(f, drop=("fc.weight",)), r"missing tensors \['fc.weight'\], unexpected \[\]"),
    (lambda f: _edit(f, tensors={"d2t": torch.full((len(DRAFT_IDS),), 600)}),
     r"d2t maps draft ids outside the target vocabulary"),
    (lambda f: _edit(f, tensors={"fc.weight": torch.zeros(64, 128)}),
     r"tensors of the wrong shape: fc.weight \(64, 128\) \(its config.json implies \(64, 192\)\)"),
    (lambda f: _edit(f, tensors={"t2d": torch.ones(2, 512, dtype=torch.bool)}),  # was torch's RuntimeError
     r"tensors of the wrong shape: t2d \(2, 512\) \(one flag per target token\)"),
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:1000]),
     r"model.safetensors: not a readable safetensors file"),
    # its own embedding with a row short of the target's tokens (it crashed when the target emitted a large id)
    (lambda f: _edit(f, tensors={"embed_tokens.weight": torch.zeros(412, 64)}),
     r"embed_tokens.weight \(412, 64\) \(at least \(512, 64\)"),
    (lambda f: _edit(f, {"num_attention_heads": 0, "head_dim": None}), r"ZeroDivisionError"),  # were tracebacks
    (lambda f: _edit(f, {"eagle_config": "yes"}), r"wrong type or out of range \(AttributeError"),
    (lambda f: _edit(f, {"intermediate_size": -128}), r"intermediate_size must be at least 1, got -128"),
    # read as other layers: "012" as 0, 1, 2; 1.7 as 1; true as 1
    (lambda f: _edit(f, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": "012"}}),
     r"eagle_aux_hidden_state_layer_ids must be a list of layer numbers, got '012'"),
    (lambda f: _edit(f, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1.7, 0, 1]}}),
     r"must be a list of layer numbers, got \[1.7, 0, 1\]"),
    (lambda f: _edit(f, {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [True, 0, 1]}}),
     r"must be a list of layer numbers"),
    (lambda f: _edit(f, {"target_hidden_size": "64"}), r"target_hidden_size must be a whole number, got '64'"),
    # RoPE scaling was ignored: a scaling specdec does not compute is refused, a llama3 one must be whole
    (lambda f: _edit(f, {"rope_scaling": {"rope_type": "yarn", "factor": 4}}), r"rope scaling 'yarn' is not supported"),
    (lambda f: _edit(f, {"rope_scaling": {"rope_type": "llama3"}}), r"llama3 rope_scaling lacks 'factor'"),
])
def test_a_bad_head_folder_is_one_clear_error(tiny_model, head_dir, edit, message):
    edit(head_dir)
    with pytest.raises(Eagle3Error, match=message):
        load_eagle3_head(head_dir, tiny_model)


def test_llama3_rope_scaling_of_a_head_is_applied(tiny_model, head_dir):
    from specdec.model.config import llama3_rope_factors
    from specdec.model.layers import rope_tables

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    _edit(head_dir, {"rope_scaling": scaling})
    head = load_eagle3_head(head_dir, tiny_model)
    c = head.cfg
    factors = llama3_rope_factors(c.head_dim, c.rope_theta, scaling)
    assert any(f != 1.0 for f in factors)
    cos, _ = rope_tables(c.head_dim, c.rope_theta, 64, factors)
    assert torch.equal(head.rope_cos[:64], cos)
    assert not torch.equal(cos, rope_tables(c.head_dim, c.rope_theta, 64)[0])
    assert c.to_json()["rope_scaling"] == scaling  # saved as read


def test_a_narrower_head_without_its_own_embedding_is_one_clear_error(tiny_model, tmp_path):
    """hidden_size below target_hidden_size needs the head's own embed_tokens: the target's rows are wider
    (it loaded, then crashed in the first draft's norm)."""
    c = tiny_model.config
    cfg = Eagle3Config(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                       vocab_size=c.vocab_size, draft_vocab_size=c.vocab_size, target_hidden_size=c.hidden_size,
                       taps=(0, 1, 2))
    folder = save_eagle3_head(Eagle3Head(cfg), tmp_path / "narrow")
    with pytest.raises(Eagle3Error, match="has hidden size 32, the target .* 64, and no embed_tokens.weight"):
        load_eagle3_head(folder, tiny_model)


def test_no_head_for_this_target_says_what_to_do(tiny_model):
    with pytest.raises(Eagle3Error, match="needs an EAGLE-3 head for .*: pass its folder with --model-draft, or train "
                                          "one with `specdec train eagle3`"):
        make_eagle3_drafter(tiny_model)


@pytest.mark.parametrize("topk, budget", [(1, 3), (3, 8)], ids=["chain", "tree"])
def test_greedy_equals_plain_decoding(tiny_model, head_dir, topk, budget):
    """A random head's drafts are (almost) all rejected; the output must still be plain greedy,
    and every drafted token comes from the draft vocabulary."""
    drafter = make_eagle3_drafter(tiny_model, str(head_dir), max_len=256, topk=topk, budget=budget)
    drafted = []
    propose = drafter.propose

    def recording(context, k):
        draft = propose(context, k)
        drafted.extend(draft.tokens)
        return draft

    drafter.propose = recording
    engine = Engine(tiny_model, SpecConfig(drafters=("draft-eagle3",), draft_n_max=3), max_len=256,
                    drafter_factory=lambda name, spec: drafter)
    prompt = list(range(5, 40))
    plain = Engine(tiny_model, SpecConfig(), max_len=256).generate(prompt, max_tokens=30).token_ids
    result = engine.generate(prompt, max_tokens=30)
    assert result.token_ids == plain
    assert result.stats.drafted > 0 and len(drafted) >= result.stats.drafted
    assert set(drafted) <= set(DRAFT_IDS.tolist())


@pytest.mark.parametrize("topk, budget, max_len", [(4, 4, 64), (2, 3, 13), (2, 3, 8)])
def test_a_wide_tree_drafts_to_the_end_of_a_short_context(tiny_model, head_dir, topk, budget, max_len):
    """A greedy tree runs up to topk nodes a depth through the head before it prunes them to the budget:
    near the end of the context they ran past the head's cache (IndexError) when the budget was smaller."""
    spec = SpecConfig(drafters=("draft-eagle3",), draft_model=str(head_dir), draft_n_max=8, tree_topk=topk,
                      tree_budget=budget)
    prompt = list(range(5, 5 + max_len // 2))
    plain = Engine(tiny_model, SpecConfig(), max_len=max_len).generate(prompt, max_tokens=40)
    result = Engine(tiny_model, spec, max_len=max_len).generate(prompt, max_tokens=40)
    assert result.token_ids == plain.token_ids and result.finish_reason == plain.finish_reason == "length"
    assert result.stats.drafted > 0


def test_p_min_cuts_trees_too(tiny_model, head_dir):
    """--spec-draft-p-min stopped chains only: a tree (--spec-tree-topk > 1) drafted as if it were 0. A
    random head is never that sure, so at 0.99 nothing is drafted, greedy or sampled; at 0 it drafts."""
    from specdec.sampling import SamplingParams

    prompt = list(range(5, 40))
    for sampling in (SamplingParams(), SamplingParams(temperature=1.0, seed=3)):
        drafted = {}
        for p_min in (0.0, 0.99):
            spec = SpecConfig(drafters=("draft-eagle3",), draft_model=str(head_dir), draft_n_max=3, tree_topk=3,
                              tree_budget=8, draft_p_min=p_min)
            result = Engine(tiny_model, spec, max_len=256).generate(prompt, sampling, max_tokens=20)
            drafted[p_min] = result.stats.drafted
        assert drafted[0.0] > 0 and drafted[0.99] == 0, (sampling, drafted)


def test_the_first_draft_is_the_heads_last_row_over_the_whole_prompt(tiny_model, head_dir):
    """The first proposal catches the head up over every pair of the prompt at once (logits of the
    last row only); its token is the argmax of a from-scratch run's last row."""
    drafter = make_eagle3_drafter(tiny_model, str(head_dir), max_len=256)
    seen = []
    propose = drafter.propose

    def recording(context, k):
        draft = propose(context, k)
        seen.append((list(context), draft.tokens[0] if draft.tokens else None))
        return draft

    drafter.propose = recording
    engine = Engine(tiny_model, SpecConfig(drafters=("draft-eagle3",), draft_n_max=1), max_len=256,
                    drafter_factory=lambda name, spec: drafter)
    engine.generate(list(range(5, 25)), max_tokens=4)
    context, first = seen[0]
    n, head = len(context) - 1, drafter.head
    out = tiny_model.transformer.forward(torch.tensor([context[:n]]), tiny_model.transformer.new_cache(256), [0],
                                         hidden_layers=head.hidden_layers)
    feats = head.feature({k: v[0] for k, v in out.hidden.items()})[None]
    with torch.no_grad():
        logits, *_ = head.step(0, feats, torch.tensor([context[1:]]), torch.arange(n)[None], None, None,
                               torch.ones(1, n, n, dtype=torch.bool).tril())
    assert logits.shape[1] == n and int(logits[0, -1].argmax()) == first


def test_positions_past_the_heads_rope_table_get_their_own_rows(tiny_model):
    """The head's table grows to a position past it (it used to clamp: every far position read the
    last row) with the rows a table computed whole holds."""
    head = random_head(tiny_model)
    c = tiny_model.config
    head.init_rope(c.head_dim, c.rope_theta, 16)
    H = c.hidden_size
    feats = torch.randn(1, 3, H, generator=torch.Generator().manual_seed(2))
    tokens, positions = torch.tensor([[11, 12, 13]]), torch.tensor([[40, 41, 42]])
    mask = torch.ones(1, 3, 3, dtype=torch.bool).tril()
    with torch.no_grad():
        grown = head.step(0, feats, tokens, positions, None, None, mask)[0]
        assert head.rope_cos.shape[0] == 43
        head.init_rope(c.head_dim, c.rope_theta, 64)
        whole = head.step(0, feats, tokens, positions, None, None, mask)[0]
    assert torch.equal(grown, whole)
