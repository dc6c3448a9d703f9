"""draft-dflash / draft-dspark: the published file layouts (written, read back), the block's attention
(against a direct computation), greedy exactness and sampled fits through Engine.generate, and a clear
error for every bad input. All on the tiny random target (2 layers, hidden 64, vocabulary 512)."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.distribution import engine_law, fit_pvalue, sample_continuations
from specdec.drafters import registry
from specdec.drafters.block.config import BlockConfig, DFlashError
from specdec.drafters.block.drafter import BlockDrafter, make_block_drafter
from specdec.drafters.block.io import load_block_drafter, read_config, save_block_drafter
from specdec.drafters.block.model import BlockDraftModel, TargetParts
from specdec.drafters.registry import BuildContext, DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams

MASK = 300
PROMPT = list(range(5, 30))


def tiny_cfg(model, layout: str = "dflash", **changes) -> BlockConfig:
    """A 2-layer drafter for the tiny target. DFlash reads target layers 0 and 1 (hidden indices 1 and 2;
    2 is the last layer, so the target's final norm applies); DSpark the embeddings (-1) and layer 1."""
    c = model.config
    cfg = BlockConfig(layout=layout, hidden_size=c.hidden_size, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=16, intermediate_size=96, vocab_size=c.vocab_size,
                      target_layer_ids=(0, 1) if layout == "dflash" else (-1, 1), mask_token_id=MASK, block_size=4,
                      num_target_layers=c.num_layers, rms_norm_eps=1e-6, rope_theta=10000.0, max_positions=512)
    if layout == "dspark":
        cfg = replace(cfg, markov_rank=8, markov_head_type="vanilla", confidence_head=True,
                      confidence_with_markov=True, num_anchors=64)
    return replace(cfg, **changes)


def random_model(model, cfg: BlockConfig, seed: int = 0, parts: TargetParts | None = None) -> BlockDraftModel:
    torch.manual_seed(seed)
    drafter = BlockDraftModel(cfg, parts or TargetParts.of(model), max_positions=512)
    with torch.no_grad():  # norms away from 1, so a swapped norm would show
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn_like(p) * 0.1)
    return drafter.eval()


def drafter_for(model, cfg, p_min=0.0, seed=0, parts=None) -> BlockDrafter:
    return BlockDrafter(random_model(model, cfg, seed, parts), f"draft-{cfg.layout}", model.config.vocab_size,
                        p_min=p_min, max_len=256)


@pytest.fixture(params=["dflash", "dspark"])
def layout(request):
    return request.param


@pytest.fixture
def folder(tiny_model, tmp_path, layout):
    return save_block_drafter(random_model(tiny_model, tiny_cfg(tiny_model, layout)), tmp_path / layout,
                              dtype=torch.float32)


def feed(drafter, model, tokens):
    """What the engine does after a prefill: the target's hidden rows of `tokens` to the drafter."""
    tr = model.transformer
    cache = tr.new_cache(64)
    slot = cache.allocate()
    out = tr.forward(torch.tensor([tokens]), cache, [slot], exact=False, hidden_layers=drafter.hidden_layers)
    drafter.on_target_hidden({i: out.hidden[i][0] for i in drafter.hidden_layers}, tokens)
    return out


# -- formats ----------------------------------------------------------------------------------
def test_config_round_trips_in_both_published_layouts(tiny_model, layout):
    cfg = tiny_cfg(tiny_model, layout)
    raw = cfg.to_json()
    if layout == "dflash":
        assert raw["architectures"] == ["DFlashDraftModel"] and raw["block_size"] == 4
        assert raw["dflash_config"] == {"target_layer_ids": [0, 1], "mask_token_id": MASK, "block_size": 4}
    else:
        assert raw["architectures"] == ["Qwen3DSparkModel"]
        assert (raw["target_layer_ids"], raw["mask_token_id"], raw["markov_rank"], raw["markov_head_type"],
                raw["enable_confidence_head"], raw["confidence_head_with_markov"]) == ([-1, 1], MASK, 8, "vanilla",
                                                                                       True, True)
    assert BlockConfig.from_json(json.loads(json.dumps(raw))) == cfg
    assert cfg.hidden_layers == ((1, 2) if layout == "dflash" else (0, 2))
    assert cfg.drafts_per_block == (3 if layout == "dflash" else 4)


def test_a_z_lab_style_config_reads_block_size_from_either_place():
    raw = {"architectures": ["DFlashDraftModel"], "hidden_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96,
           "vocab_size": 512, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}, "num_target_layers": 2,
           "block_size": 16, "dflash_config": {"mask_token_id": 300, "target_layer_ids": [0, 1]}}
    cfg = BlockConfig.from_json(raw)
    assert (cfg.block_size, cfg.mask_token_id, cfg.target_layer_ids, cfg.rope_theta) == (16, 300, (0, 1), 5e5)
    raw = {**raw, "block_size": None, "dflash_config": {**raw["dflash_config"], "block_size": 8}}
    assert BlockConfig.from_json(raw).block_size == 8
    # no layer ids: z-lab and SGLang derive them from num_target_layers (36 target layers, 5 drafter layers)
    raw = {**raw, "num_hidden_layers": 5, "num_target_layers": 36, "block_size": 16,
           "dflash_config": {"mask_token_id": 300}}
    assert BlockConfig.from_json(raw).target_layer_ids == (1, 9, 17, 25, 33)


def test_saved_drafter_loads_back_with_identical_tensors_and_config(tiny_model, tmp_path, layout):
    cfg = tiny_cfg(tiny_model, layout)
    original = random_model(tiny_model, cfg)
    tr = tiny_model.transformer
    extra = dict(embed_tokens=tr.embed, lm_head=torch.zeros(512, 64)) if layout == "dspark" else {}
    exact = save_block_drafter(original, tmp_path / "fp32", dtype=torch.float32, **extra)
    half = save_block_drafter(original, tmp_path / "bf16", **extra)  # published checkpoints are bf16
    names = set(load_file(str(exact / "model.safetensors")))
    published = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
        f"layers.{i}.{n}" for i in range(2) for n in (
            "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
            "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
            "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")}
    if layout == "dspark":
        published |= {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
                      "confidence_head.proj.bias", "embed_tokens.weight", "lm_head.weight"}
    assert names == published
    assert read_config(exact) == cfg and read_config(half) == cfg
    parts = TargetParts.of(tiny_model)
    for path, dtype in ((exact, torch.float32), (half, torch.bfloat16)):
        loaded = load_block_drafter(path, parts, tiny_model.config)
        theirs = loaded.state_dict()
        assert theirs.keys() == original.state_dict().keys()
        for name, tensor in original.state_dict().items():
            assert torch.equal(theirs[name], tensor.to(dtype).float()), name


# -- the block's attention ----------------------------------------------------------------------
def reference_block(model: BlockDraftModel, ctx: torch.Tensor, tokens: list[int], start: int) -> torch.Tensor:
    """The block's normed outputs (T, H) computed directly: per layer, softmax over [context keys at
    positions 0..m-1; block keys at start..], no mask; context rows enter k/v without an input norm."""
    cfg = model.cfg
    nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2).float() / hd))

    def rope(x, pos):  # x (n, heads, hd)
        ang = torch.tensor(pos, dtype=torch.float32)[:, None] * inv[None]
        cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
        return x * cos + torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w

    m, T = ctx.shape[0], len(tokens)
    x = model.target.embed[torch.tensor(tokens)].float()
    for layer in model.layers:
        a = layer.self_attn
        h = norm(x, layer.input_layernorm.weight)
        q = rope(norm(a.q_proj(h).view(T, nh, hd), a.q_norm.weight), list(range(start, start + T)))
        k_ctx = rope(norm(a.k_proj(ctx).view(m, nkv, hd), a.k_norm.weight), list(range(m)))
        k_blk = rope(norm(a.k_proj(h).view(T, nkv, hd), a.k_norm.weight), list(range(start, start + T)))
        k = torch.cat([k_ctx, k_blk]).repeat_interleave(nh // nkv, dim=1)  # (m+T, nh, hd)
        v = torch.cat([a.v_proj(ctx).view(m, nkv, hd), a.v_proj(h).view(T, nkv, hd)]).repeat_interleave(nh // nkv, 1)
        weights = torch.softmax(torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd), dim=-1)
        x = x + a.o_proj(torch.einsum("hts,shd->thd", weights, v).reshape(T, nh * hd))
        g = norm(x, layer.post_attention_layernorm.weight)
        x = x + layer.mlp.down_proj(torch.nn.functional.silu(layer.mlp.gate_proj(g)) * layer.mlp.up_proj(g))
    return norm(x, model.norm.weight)


@torch.no_grad()
def test_block_outputs_equal_a_direct_computation(tiny_model, layout):
    drafter = drafter_for(tiny_model, tiny_cfg(tiny_model, layout))
    out = feed(drafter, tiny_model, PROMPT)
    m = len(PROMPT)
    drafter._catch_up()
    got = drafter.block_outputs(PROMPT[-1], m)  # (B, H)
    tr, c = tiny_model.transformer, tiny_model.config
    hidden = {i: out.hidden[i][0] for i in drafter.hidden_layers}
    taps = [torch.nn.functional.rms_norm(hidden[i], (c.hidden_size,), tr.norm.float(), c.rms_norm_eps)
            if i == c.num_layers else hidden[i] for i in drafter.hidden_layers]
    model = drafter.model
    ctx = model.hidden_norm(model.fc(torch.cat(taps, -1)))  # (m, H)
    want = reference_block(model, ctx, [PROMPT[-1]] + [MASK] * 3, m)
    assert got.shape == (4, c.hidden_size)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


@torch.no_grad()
def test_block_sees_the_context_and_itself_in_both_directions_and_nothing_beyond(tiny_model, layout):
    drafter = drafter_for(tiny_model, tiny_cfg(tiny_model, layout))
    feed(drafter, tiny_model, PROMPT)
    m = len(PROMPT)
    drafter._catch_up()
    base = drafter.block_outputs(PROMPT[-1], m)
    # cache slots past the context (stale rows of an earlier, longer request) change nothing
    for c in drafter.caches:
        c.k[:, m:] = torch.randn_like(c.k[:, m:])
        c.v[:, m:] = torch.randn_like(c.v[:, m:])
    assert torch.equal(drafter.block_outputs(PROMPT[-1], m), base)
    # the first context row moves every block row
    saved = [(c.k[:, 0].clone(), c.v[:, 0].clone()) for c in drafter.caches]
    for c in drafter.caches:
        c.v[:, 0] += 1.0
    moved = drafter.block_outputs(PROMPT[-1], m)
    assert all(not torch.allclose(moved[i], base[i]) for i in range(4))
    for c, (k, v) in zip(drafter.caches, saved):
        c.k[:, 0], c.v[:, 0] = k, v
    # a token at the END of the block moves the anchor row: attention inside the block is not causal
    model = drafter.model
    past = [(c.k[None, :, :m], c.v[None, :, :m]) for c in drafter.caches]
    mask = torch.ones(1, 4, m + 4, dtype=torch.bool)
    run = lambda toks: model.blocks(model.embed(torch.tensor([toks])), torch.arange(m, m + 4)[None], past, mask)[0]
    assert torch.allclose(run([PROMPT[-1], MASK, MASK, MASK]), base)
    changed = run([PROMPT[-1], MASK, MASK, 7])
    assert not torch.allclose(changed[0], base[0]) and not torch.allclose(changed[2], base[2])


@torch.no_grad()
def test_cache_fed_in_steps_equals_one_fed_at_once(tiny_model, layout):
    """The engine feeds the prompt, then a few committed rows per step; the context cache must equal one
    built in a single pass (the published crop-to-accepted-length, here: only committed rows are kept)."""
    cfg = tiny_cfg(tiny_model, layout)
    whole = drafter_for(tiny_model, cfg)
    steps = drafter_for(tiny_model, cfg)
    text = PROMPT + [40, 41, 42, 43, 44]
    feed(whole, tiny_model, text)
    whole._catch_up()
    tr = tiny_model.transformer
    cache = tr.new_cache(64)
    slot = cache.allocate()
    for a, b in ((0, 20), (20, 23), (23, 24), (24, len(text))):
        out = tr.forward(torch.tensor([text[a:b]]), cache, [slot], hidden_layers=steps.hidden_layers)
        steps.on_target_hidden({i: out.hidden[i][0] for i in steps.hidden_layers}, text[a:b])
        if b < len(text):
            steps.propose(text[:b + 1], 3)  # catches up on the way
    steps._catch_up()
    m = len(text)
    for c1, c2 in zip(whole.caches, steps.caches):
        assert c1.length == c2.length == m
        assert torch.allclose(c1.k[:, :m], c2.k[:, :m], atol=1e-5)
        assert torch.allclose(c1.v[:, :m], c2.v[:, :m], atol=1e-5)


def test_proposal_shapes(tiny_model, layout):
    cfg = tiny_cfg(tiny_model, layout)
    drafter = drafter_for(tiny_model, cfg)
    feed(drafter, tiny_model, PROMPT)
    context = PROMPT + [50]
    most = cfg.drafts_per_block
    assert [len(drafter.propose(context, k)) for k in (0, 1, 2, 10)] == [0, 1, 2, most]
    assert drafter.propose(context[:-1], 3).tokens == ()  # the context does not continue what was fed
    drafter.begin(PROMPT, SamplingParams(temperature=1.0, top_k=5, seed=0), torch.Generator().manual_seed(0))
    feed(drafter, tiny_model, PROMPT)
    draft = drafter.propose(context, 10)
    assert len(draft) == most and draft.draft_probs.shape == (most, tiny_model.config.vocab_size)
    for token, row in zip(draft.tokens, draft.draft_probs):
        assert row[token] > 0 and abs(float(row.sum()) - 1) < 1e-5 and int((row > 0).sum()) <= 5


def test_dspark_drafts_left_to_right_with_the_markov_bias(tiny_model):
    """Greedy DSpark: token i = argmax(lm_head(row i) + w2(w1[token i-1])), the anchor first."""
    drafter = drafter_for(tiny_model, tiny_cfg(tiny_model, "dspark"))
    feed(drafter, tiny_model, PROMPT)
    draft = drafter.propose(PROMPT + [50], 4)
    with torch.no_grad():
        rows = drafter.block_outputs(50, len(PROMPT))
        logits = drafter.model.logits(rows)
        head = drafter.model.markov_head
        prev, want = 50, []
        for i in range(4):
            prev = int((logits[i] + head.markov_w2(head.markov_w1(torch.tensor(prev)))).argmax())
            want.append(prev)
    assert list(draft.tokens) == want


def test_p_min_cuts_the_dspark_block_where_confidence_drops(tiny_model):
    cfg = tiny_cfg(tiny_model, "dspark")
    full = drafter_for(tiny_model, cfg)
    feed(full, tiny_model, PROMPT)
    tokens = full.propose(PROMPT + [50], 4).tokens
    with torch.no_grad():  # row by row, as the drafter asks (a torch Linear's bits may vary with the row count)
        rows = full.block_outputs(50, len(PROMPT))
        prev = torch.tensor([50, *tokens[:-1]])
        conf = torch.cat([torch.sigmoid(full.model.confidence(rows[i : i + 1], prev[i : i + 1])) for i in range(4)])
    for p_min in sorted(set(conf.tolist())) + [0.999]:
        cut = drafter_for(tiny_model, cfg, p_min=p_min)
        feed(cut, tiny_model, PROMPT)
        below = [i for i, c in enumerate(conf.tolist()) if c < p_min]
        assert cut.propose(PROMPT + [50], 4).tokens == tokens[: below[0] if below else 4]


# -- through the engine -------------------------------------------------------------------------
def test_greedy_equals_plain_decoding(tiny_model, layout):
    drafter = drafter_for(tiny_model, tiny_cfg(tiny_model, layout), p_min=0.3 if layout == "dspark" else 0.0)
    engine = Engine(tiny_model, SpecConfig(drafters=(f"draft-{layout}",), draft_n_max=4), max_len=256,
                    drafter_factory=lambda name, spec: drafter)
    plain = Engine(tiny_model, SpecConfig(), max_len=256).generate(PROMPT, max_tokens=30).token_ids
    result = engine.generate(PROMPT, max_tokens=30)
    assert result.token_ids == plain and result.stats.drafted > 0


def test_the_registry_builds_it_from_the_draft_model_flag(tiny_model, folder, layout):
    spec = SpecConfig(drafters=(f"draft-{layout}",), draft_model=str(folder), draft_n_max=4)
    plain = Engine(tiny_model, SpecConfig(), max_len=128).generate(PROMPT, max_tokens=12).token_ids
    result = Engine(tiny_model, spec, max_len=128).generate(PROMPT, max_tokens=12)
    assert result.token_ids == plain and result.stats.drafted > 0
    assert registry.entry(f"draft-{layout}").runnable


def test_flags_without_a_draft_length_draft_the_whole_block(folder, layout):
    """One drafter pass gives a whole block: the default draft length is its drafts, not 3."""
    from specdec.drafters.describe import block_draft_length
    from helpers.spec import spec_of

    block = block_draft_length(folder)
    spec, notes = spec_of(spec_type=f"draft-{layout}", model_draft=str(folder))
    assert spec.draft_n_max == block and any("draft length" in n for n in notes)
    spec, _ = spec_of(spec_type=f"draft-{layout}", model_draft=str(folder), draft_n_max=2)
    assert spec.draft_n_max == 2


def test_auto_drafts_the_whole_block_too(tiny_model, tmp_path, layout):
    """auto with the folder as -md kept the default draft length 3, where --spec-type draft-<layout> drafts the
    whole block."""
    from specdec.drafters.describe import block_draft_length
    from helpers.spec import spec_for_model

    cfg = replace(tiny_cfg(tiny_model, layout), block_size=7)
    folder = save_block_drafter(random_model(tiny_model, cfg), tmp_path / layout, dtype=torch.float32)
    block = block_draft_length(folder)
    assert block in (6, 7)  # not the default 3
    spec, reasons = spec_for_model(tiny_model, spec_type="auto", model_draft=str(folder))
    assert spec.model_kind == f"draft-{layout}" and spec.draft_n_max == block
    assert any(f"draft length {block}: the drafts of one" in r for r in reasons)
    assert any(f"draft length 0..{block} chosen each step" in r for r in reasons)
    spec, _ = spec_for_model(tiny_model, spec_type="auto", model_draft=str(folder), draft_n_max=2)
    assert spec.draft_n_max == 2


def _target_tokens(model, prompt, top_k: int, depth: int = 3) -> set[int]:
    law = engine_law(model, prompt, SamplingParams(temperature=1.0, top_k=top_k), depth=depth)
    return {t for seq in law for t in seq}


@pytest.mark.parametrize("layout_name", ["dflash", "dspark"])
def test_sampled_output_fits_the_target_distribution(tiny_model, layout_name):
    """Seeded chi-square fit of 3-token continuations (temperature 1, top-k 2: 8 sequences). The drafter's
    lm_head is nudged towards the tokens the target can emit here, so drafts are accepted at some steps
    and rejected at others (a random drafter alone is almost never accepted)."""
    prompt = PROMPT[:12]
    params = dict(temperature=1.0, top_k=2)
    law = engine_law(tiny_model, prompt, SamplingParams(**params))
    assert abs(sum(law.values()) - 1) < 1e-5 and len(law) == 8
    likely = torch.zeros(tiny_model.config.vocab_size)
    likely[sorted(_target_tokens(tiny_model, prompt, 2))] = 6.0
    real = TargetParts.of(tiny_model)
    parts = replace(real, lm_head=lambda h: real.lm_head(h) + likely)
    cfg = tiny_cfg(tiny_model, layout_name)
    drafter = drafter_for(tiny_model, cfg, parts=parts, p_min=0.2 if layout_name == "dspark" else 0.0)
    engine = Engine(tiny_model, SpecConfig(drafters=(f"draft-{layout_name}",), draft_n_max=3), max_len=64,
                    drafter_factory=lambda name, spec: drafter)
    counts, drafted, accepted = sample_continuations(engine, prompt, 400, **params)
    assert drafted > 0 and 0 < accepted < drafted, (drafted, accepted)  # both branches of the verifier ran
    p = fit_pvalue(counts, law)
    assert p > 1e-3, f"chi-square p = {p:.2e}; counts {counts}"
    hot = engine_law(tiny_model, prompt, SamplingParams(temperature=3.0, top_k=2))
    assert fit_pvalue(counts, hot) < p  # the same samples fit another law worse: the test can tell


# -- errors -------------------------------------------------------------------------------------
def _edit(folder, config=None, drop=(), tensors=None, remove=()):
    raw = json.loads((folder / "config.json").read_text())
    raw.update(config or {})
    for key in remove:
        raw.pop(key, None)
        (raw.get("dflash_config") or {}).pop(key, None)
    (folder / "config.json").write_text(json.dumps(raw))
    weights = load_file(str(folder / "model.safetensors"))
    weights = {k: v for k, v in {**weights, **(tensors or {})}.items() if k not in drop}
    save_file(weights, str(folder / "model.safetensors"))


@pytest.mark.parametrize("edit, message", [
    (lambda f: (f / "config.json").unlink(), r"not a DFlash/DSpark drafter folder \(no config.json\)"),
    (lambda f: _edit(f, {"vocab_size": 100_000}),
     r"was trained for a vocabulary of 100000 tokens; the target .*tiny-llama has 512: it belongs to another model"),
    (lambda f: _edit(f, {"hidden_size": 32}), r"expects target hidden size 32; the target .*tiny-llama has 64"),
    (lambda f: _edit(f, {"num_target_layers": 36}),
     r"was trained on a target with 36 layers; the target .*tiny-llama has 2: it belongs to another model"),
    (lambda f: _edit(f, {"target_layer_ids": [0, 5], "dflash_config": None}), r"reads target layers \[0, 5\], beyond"),
    (lambda f: _edit(f, remove=("mask_token_id",)), r"has no mask_token_id .*add the id the drafter was trained with"),
    (lambda f: _edit(f, {"mask_token_id": 9999, "dflash_config": None, "target_layer_ids": [0, 1], "block_size": 4}),
     r"mask_token_id 9999 is outside the target .*tiny-llama's embedding \(512 rows\)"),
    (lambda f: _edit(f, remove=("target_layer_ids", "num_target_layers")), r"names no target_layer_ids"),
    (lambda f: _edit(f, {"architectures": ["DFlash2DraftModel"]}), r"is a DFlash2 drafter"),
    (lambda f: _edit(f, {"layer_types": ["sliding_attention"] * 2}), r"causal or sliding-window drafter layers"),
    (lambda f: _edit(f, {"architectures": ["LlamaForCausalLM"], "dflash_config": None}),
     r"is not a DFlash or DSpark drafter"),
    (lambda f: (f / "model.safetensors").unlink(), r"no .safetensors weights"),
    (lambda f: _edit(f, drop=("fc.weight",)), r"missing tensors \['fc.weight'\], unexpected \[\]"),
    (lambda f: _edit(f, tensors={"fc.weight": torch.zeros(64, 64)}),
     r"tensor fc.weight has shape \(64, 64\), expected \(64, 128\)"),
    # each was a traceback
    (lambda f: _edit(f, remove=("hidden_size",)), r"config.json lacks 'hidden_size'"),
    (lambda f: _edit(f, {"num_hidden_layers": "two"}), r"config.json has a value of the wrong type"),
    (lambda f: _edit(f, {"num_hidden_layers": 0}), r"num_hidden_layers must be at least 1, got 0"),
    (lambda f: _edit(f, {"block_size": 3.7, "dflash_config": None, "target_layer_ids": [0, 1], "mask_token_id": 3}),
     r"block_size must be at least 2, got 3.7"),  # read as 3
    (lambda f: _edit(f, {"target_layer_ids": "01", "dflash_config": None, "block_size": 4, "mask_token_id": 3}),
     r"target_layer_ids must be a list of layer numbers, got '01'"),  # read as layers 0 and 1
    (lambda f: _edit(f, {"num_attention_heads": 0, "head_dim": None}), r"out of range \(ZeroDivisionError"),
    (lambda f: _edit(f, {"markov_rank": -4}), r"markov_rank must be a whole number of at least 0, got -4"),  # torch's
    (lambda f: _edit(f, {"markov_rank": 8.7}), r"markov_rank must be a whole number of at least 0, got 8.7"),  # 8
    (lambda f: _edit(f, {"rope_scaling": {"rope_type": "llama3"}}),  # a bare ValueError naming no folder
     r"d: config.json has a value of the wrong type or out of range \(ValueError: llama3 rope_scaling lacks 'factor'"),
    (lambda f: (f / "config.json").write_text("[]"), r"config.json: holds a JSON list"),
    (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:1000]),
     r"model.safetensors: not a readable safetensors file"),
])
def test_a_bad_drafter_folder_is_one_clear_error(tiny_model, tmp_path, edit, message):
    # written in the DFlash layout; the keys that layout keeps in dflash_config are moved to the top level
    # where an edit overrides them, which from_json reads too
    folder = save_block_drafter(random_model(tiny_model, tiny_cfg(tiny_model)), tmp_path / "d")
    edit(folder)
    with pytest.raises(DFlashError, match=message):
        make_block_drafter(tiny_model, folder, "draft-dflash")


def test_the_kind_asked_for_must_be_the_folders(tiny_model, tmp_path):
    """draft-dflash given a DSpark folder ran DSpark (and the reverse), its stats filed under the other name."""
    dflash = save_block_drafter(random_model(tiny_model, tiny_cfg(tiny_model)), tmp_path / "dflash")
    dspark = save_block_drafter(random_model(tiny_model, tiny_cfg(tiny_model, "dspark")), tmp_path / "dspark")
    with pytest.raises(DFlashError, match="is a DSpark drafter: run it with --spec-type draft-dspark"):
        make_block_drafter(tiny_model, dspark, "draft-dflash")
    with pytest.raises(DFlashError, match="is a DFlash drafter: run it with --spec-type draft-dflash"):
        make_block_drafter(tiny_model, dflash, "draft-dspark")
    assert make_block_drafter(tiny_model, dspark, "draft-dspark").name == "draft-dspark"


def test_p_min_needs_a_confidence_head(tiny_model, tmp_path):
    plain = save_block_drafter(random_model(tiny_model, tiny_cfg(tiny_model)), tmp_path / "dflash")
    with pytest.raises(DFlashError, match=r"--spec-draft-p-min 0.5 needs a drafter with a confidence head \(DSpark\); "
                                          r"DFlash drafter .* has none: drop --spec-draft-p-min"):
        make_block_drafter(tiny_model, plain, "draft-dflash", p_min=0.5)
    no_head = tiny_cfg(tiny_model, "dspark", confidence_head=False, confidence_with_markov=False)
    folder = save_block_drafter(random_model(tiny_model, no_head), tmp_path / "dspark-plain")
    with pytest.raises(DFlashError, match="needs a drafter with a confidence head"):
        make_block_drafter(tiny_model, folder, "draft-dspark", p_min=0.5)
    spark = save_block_drafter(random_model(tiny_model, tiny_cfg(tiny_model, "dspark")), tmp_path / "dspark")
    assert make_block_drafter(tiny_model, spark, "draft-dspark", p_min=0.5).p_min == 0.5


def test_no_folder_says_what_to_pass(tiny_model):
    for kind, what in (("draft-dflash", "DFlash"), ("draft-dspark", "DSpark")):
        with pytest.raises(DFlashError, match=f"--spec-type {kind} needs a {what} drafter folder trained for "
                                              ".*tiny-llama: pass it with -md/--model-draft"):
            registry.create(DrafterSpec.of(kind), BuildContext(target=tiny_model))
