"""draft-mtp: loading MTP weights in each real layout, drafting, and exactness with the engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from helpers.tiny import make_hf_model, tiny_config  # noqa: E402
from mtp_helpers import deepseek_layout, mimo_layout, mtp_block, qwen3next_layout  # noqa: E402

from specdec.drafters.mtp import MTPError, find_layout, load_mtp_head, make_mtp_drafter  # noqa: E402
from specdec.engine.config import SpecConfig  # noqa: E402
from specdec.engine.engine import Engine  # noqa: E402
from specdec.model.load import load_model  # noqa: E402

LAYERS = 2


def _model(tmp_path, name, tensors, config_key="num_nextn_predict_layers", n=1, arch="llama"):
    folder = make_hf_model(tmp_path / name, arch=arch, extra_config={config_key: n}, extra_tensors=tensors)
    return load_model(str(folder), "fp32", progress=False)


def _head_output(model, positions=(3, 4, 5)):
    head, _ = load_mtp_head(model)
    g = torch.Generator().manual_seed(7)
    feats = torch.randn(1, 3, model.config.hidden_size, generator=g)
    tokens = torch.tensor([[11, 12, 13]])
    mask = torch.ones(1, 3, 3, dtype=torch.bool).tril()
    with torch.no_grad():
        logits, out, _, _ = head.step(0, feats, tokens, torch.tensor([list(positions)]), None, None, mask)
    return head, feats, tokens, logits


@pytest.fixture
def blocks():
    return [mtp_block(tiny_config(), seed=1)]


def test_deepseek_layout_matches_the_formula(tmp_path, blocks):
    """One pair, no cache: h' = eh_proj([enorm(e); hnorm(h)]), block, shared norm, target head."""
    m = _model(tmp_path, "ds", deepseek_layout(blocks, LAYERS))
    head, feats, tokens, logits = _head_output(m)
    b = blocks[0]
    eps = m.config.rms_norm_eps

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    e = m.checkpoint.get("model.embed_tokens.weight")[11]
    h = feats[0, 0]
    x = b["eh_proj.weight"] @ torch.cat([norm(e, b["enorm.weight"]), norm(h, b["hnorm.weight"])])
    v = b["self_attn.v_proj.weight"] @ norm(x, b["input_layernorm.weight"])  # one key: attention = its value
    group = m.config.num_heads // m.config.num_kv_heads
    v = v.reshape(m.config.num_kv_heads, -1).repeat_interleave(group, 0).reshape(-1)
    x = x + b["self_attn.o_proj.weight"] @ v
    y = norm(x, b["post_attention_layernorm.weight"])
    x = x + b["mlp.down_proj.weight"] @ (torch.nn.functional.silu(b["mlp.gate_proj.weight"] @ y) * (b["mlp.up_proj.weight"] @ y))
    expected = m.checkpoint.get("lm_head.weight") @ norm(x, b["shared_head.norm.weight"])
    torch.testing.assert_close(logits[0, 0], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout,key", [("mimo", "num_nextn_predict_layers"), ("qwen3next", "mtp_num_hidden_layers")])
def test_other_layouts_give_the_same_logits(tmp_path, blocks, layout, key):
    ref = _head_output(_model(tmp_path, "ds", deepseek_layout(blocks, LAYERS)))[3]
    tensors = mimo_layout(blocks) if layout == "mimo" else qwen3next_layout(blocks)
    m = _model(tmp_path, layout, tensors, key)
    head, _, _, logits = _head_output(m)
    assert head.layout.name == layout
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)


def test_mimo_zeroes_the_embedding_at_position_0(tmp_path, blocks):
    m = _model(tmp_path, "mimo", mimo_layout(blocks))
    a = _head_output(m, positions=(0, 1, 2))[3]
    b = _head_output(m, positions=(3, 4, 5))[3]
    assert not torch.allclose(a[0, 0], b[0, 0])


def test_qwen3_block_with_qk_norms_loads(tmp_path):
    cfg = tiny_config("qwen3")
    m = _model(tmp_path, "q3", qwen3next_layout([mtp_block(cfg, 2)]), "mtp_num_hidden_layers", arch="qwen3")
    head, _ = load_mtp_head(m)
    assert hasattr(head.mods[0].block.self_attn, "q_norm")


def _write_gguf_with_nextn(path: Path, blocks: list[dict]) -> Path:
    """A tiny llama GGUF with one extra block and its blk.N.nextn.* tensors (llama.cpp's naming)."""
    from helpers.tiny import make_gguf_model

    return make_gguf_model(path, extra_weights=deepseek_layout(blocks, LAYERS), nextn_layers=1)


def test_gguf_nextn_tensors_load_like_the_hf_layout(tmp_path, blocks):
    ref = _head_output(_model(tmp_path, "ds", deepseek_layout(blocks, LAYERS)))[3]
    path = _write_gguf_with_nextn(tmp_path / "m.gguf", blocks)
    m = load_model(str(path), "fp32", progress=False)
    assert m.config.num_layers == LAYERS and m.config.mtp_layers_declared == 1
    assert find_layout(m.checkpoint.names(), LAYERS).name == "deepseek"
    logits = _head_output(m)[3]
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=1e-4)


def test_config_declares_mtp_but_the_file_lacks_it(tmp_path):
    from helpers.spec import spec_for_model

    m = _model(tmp_path, "nomtp", {})
    with pytest.raises(MTPError, match="declares 1 MTP layer\\(s\\) but the file has no MTP weights"):
        make_mtp_drafter(m)
    spec, reasons = spec_for_model(m)
    assert "draft-mtp" not in spec.types
    assert any("lacks their weights" in r for r in reasons)
    out = Engine(m, spec, max_len=128).generate(list(range(5, 15)), max_tokens=8)
    assert len(out.token_ids) == 8  # plain decoding goes on


def test_auto_turns_mtp_on_and_says_so(tmp_path, blocks):
    from helpers.spec import spec_for_model

    m = _model(tmp_path, "ds", deepseek_layout(blocks, LAYERS))
    spec, reasons = spec_for_model(m)
    assert "draft-mtp" in spec.types
    assert any("draft-mtp, used without being asked" in r for r in reasons)


@pytest.mark.parametrize("n_modules", [1, 2])
@pytest.mark.parametrize("topk", [1, 3])
def test_greedy_equals_plain_decoding(tmp_path, n_modules, topk):
    blocks = [mtp_block(tiny_config(), seed=s) for s in range(n_modules)]
    m = _model(tmp_path, "ds", deepseek_layout(blocks, LAYERS), n=n_modules)
    prompt = list(range(5, 40))
    plain = Engine(m, SpecConfig(), max_len=256).generate(prompt, max_tokens=40).token_ids
    engine = Engine(m, SpecConfig(drafters=("draft-mtp",), draft_n_max=4), max_len=256)
    drafter = make_mtp_drafter(m, max_len=256, topk=topk, budget=10)
    engine.drafter_factory = lambda name, spec: drafter
    result = engine.generate(prompt, max_tokens=40)
    assert result.token_ids == plain
    assert result.stats.drafted > 0


def test_drafts_are_what_a_from_scratch_head_run_predicts(tmp_path, blocks):
    """The head's incremental cache (catch-up after each commit, the first over the whole prompt) equals
    recomputing all pairs."""
    m = _model(tmp_path, "ds", deepseek_layout(blocks, LAYERS))
    drafter = make_mtp_drafter(m, max_len=256)
    engine = Engine(m, SpecConfig(drafters=("draft-mtp",), draft_n_max=1), max_len=256,
                    drafter_factory=lambda name, spec: drafter)
    seen = []
    original = drafter.propose

    def spy(context, k):
        draft = original(context, k)
        seen.append((list(context), draft.tokens[0]))
        return draft

    drafter.propose = spy
    engine.generate(list(range(5, 25)), max_tokens=12)
    head = drafter.head
    for context, first in seen[:1] + seen[-3:]:
        n = len(context) - 1
        cache = m.transformer.new_cache(256)
        slot = cache.allocate()
        out = m.transformer.forward(torch.tensor([context[:n]]), cache, [slot], hidden_layers=head.hidden_layers)
        feats = head.feature({k: v[0] for k, v in out.hidden.items()})[None]
        mask = torch.ones(1, n, n, dtype=torch.bool).tril()
        with torch.no_grad():
            logits, *_ = head.step(0, feats, torch.tensor([context[1:]]), torch.arange(n)[None], None, None, mask)
        assert int(logits[0, -1].argmax()) == first


def test_a_mimo_checkpoint_runs_as_a_target_and_its_mtp_layers_light_up(tmp_path):
    """model_type mimo (a Qwen2 body + model.mtp_layers.*) was refused; it loads, and auto drafts with its MTP."""
    from helpers.spec import spec_for_model
    from specdec.cli.inspect import inspect_model

    import json

    folder = make_hf_model(tmp_path / "mimo", arch="qwen2", extra_config={"num_nextn_predict_layers": 1},
                           extra_tensors=mimo_layout([mtp_block(tiny_config("qwen2"), seed=1)]))
    raw = json.loads((folder / "config.json").read_text())
    raw.update(model_type="mimo", architectures=["MiMoForCausalLM"])  # MiMo's published config names
    (folder / "config.json").write_text(json.dumps(raw))
    m = load_model(str(folder), "fp32", progress=False)
    assert m.config.arch == "qwen2" and m.config.qkv_bias and m.config.mtp_layers_declared == 1
    spec, reasons = spec_for_model(m)
    assert spec.types == ("suffix", "draft-mtp")
    assert any("model carries MTP layers: draft-mtp, used without being asked" in r for r in reasons)
    prompt = list(range(5, 40))
    plain = Engine(m, SpecConfig(), max_len=256).generate(prompt, max_tokens=30).token_ids
    result = Engine(m, spec.with_overrides(drafters=("draft-mtp",)), max_len=256).generate(prompt, max_tokens=30)
    assert result.token_ids == plain and result.stats.drafted > 0
    report = inspect_model(str(folder))
    assert report["auto"]["types"] == ["suffix", "draft-mtp"] and report["mtp"]["weights_present"]


def test_a_damaged_head_beside_the_model_is_not_offered_and_is_named_when_asked(tmp_path):
    """An interrupted `specdec train mtp` leaves a truncated model.safetensors beside the model: auto does
    not count it as MTP layers (plain runs go on), and asking for draft-mtp names the file."""
    from specdec.model.errors import SpecdecError
    from specdec.model.checkpoint_facts import sidecar_path, target_facts

    folder = make_hf_model(tmp_path / "m")
    side = sidecar_path(folder)
    side.mkdir()
    (side / "model.safetensors").write_bytes(b"\x40\x00\x00\x00\x00\x00\x00\x00{\"w\": ")
    model = load_model(str(folder), "fp32", progress=False)
    assert not target_facts(model.checkpoint, folder, "m", "fp32").mtp_weights
    with pytest.raises(SpecdecError, match="model.safetensors: not a readable safetensors file"):
        make_mtp_drafter(model, max_len=64)
