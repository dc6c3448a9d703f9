"""The one decoder layer (model/layers.py) as every user runs it: inference, heads, training target."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import make_hf_model
from specdec.model.layers import ROPE_INITIAL_ROWS, MaskedAttention, RopeTable, rms_norm, rope_rows, rope_tables
from specdec.model.load import load_model, open_checkpoint
from specdec.train.target import DenseTarget

PROMPT = [5, 17, 33, 101, 7, 250, 64, 9, 3, 12]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def arch_dir(request, tmp_path_factory):
    return make_hf_model(tmp_path_factory.mktemp(request.param) / request.param, arch=request.param, layers=3)


@pytest.fixture(scope="module")
def target(arch_dir):
    """The training target: the checkpoint's layers as frozen DecoderLayer modules."""
    return DenseTarget(open_checkpoint(arch_dir)[0])


def test_module_layer_equals_the_inference_layer(arch_dir, target):
    """A DecoderLayer (nn.Linear, transformers' names, SDPA over a mask) on the checkpoint's float
    weights computes what the runtime's fused-QLinear layer over its KV cache computes."""
    model = load_model(str(arch_dir), "fp32", progress=False)
    tr = model.transformer
    out = tr.forward(torch.tensor([PROMPT]), tr.new_cache(64), [0], hidden_layers=(0, 1, 2), exact=True)
    layers = target.layers
    T = len(PROMPT)
    cos, sin = rope_rows(*tr.rope.tables, torch.arange(T)[None])
    for i in (0, 1):
        causal = MaskedAttention(1, None, None, torch.ones(1, T, T, dtype=torch.bool).tril())
        x = layers[i](out.hidden[i][0], causal, cos, sin)
        torch.testing.assert_close(x, out.hidden[i + 1][0], rtol=1e-5, atol=1e-5)


def test_module_layer_over_past_keys_equals_one_pass(target):
    """Keys kept from an earlier call (a head's cache) give what one pass over all rows gives."""
    layer = target.layers[0]
    T, H = len(PROMPT), layer.mlp_norm.shape[0]
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_rows(target.cos, target.sin, torch.arange(T)[None])
    whole = layer(x, MaskedAttention(1, None, None, torch.ones(1, T, T, dtype=torch.bool).tril()), cos, sin)
    first = MaskedAttention(1, None, None, torch.ones(1, 4, 4, dtype=torch.bool).tril())
    a = layer(x[:4], first, cos[:4], sin[:4])
    rest = MaskedAttention(1, first.k, first.v, torch.ones(1, T - 4, T, dtype=torch.bool).tril(diagonal=4))
    b = layer(x[4:], rest, cos[4:], sin[4:])
    torch.testing.assert_close(torch.cat([a, b]), whole, rtol=1e-5, atol=1e-5)


def test_training_target_equals_the_runtime(arch_dir, target):
    """DenseTarget (padded batches) gives the runtime's logits and hidden rows; padding changes nothing."""
    model = load_model(str(arch_dir), "fp32", progress=False)
    tr = model.transformer
    out = tr.forward(torch.tensor([PROMPT]), tr.new_cache(64), [0], hidden_layers=(2,), exact=True)
    tokens = torch.tensor([PROMPT, PROMPT[:6] + [0] * 4])
    valid = torch.ones_like(tokens, dtype=torch.bool)
    valid[1, 6:] = False
    logits, hidden = target.forward(tokens, valid, hidden_layers=(2,))
    torch.testing.assert_close(logits[0], out.logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hidden[2][0], out.hidden[2][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1, :6], out.logits[0, :6], rtol=1e-4, atol=1e-4)


def test_rms_norm_of_bf16_rows_with_float_weights_is_transformers_formula():
    """Under autocast the activations are bf16 and the norm weights float32: round, then scale."""
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    w = 1 + 0.1 * torch.randn(64, generator=torch.Generator().manual_seed(2))
    x32 = x.float()
    expected = w * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    out = rms_norm(x, w, 1e-6)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_training_target_computes_gemma3_as_the_runtime(tmp_path):
    """Gemma 3's parts in the training target (embedding scale, four norms, GeGLU, attention scale,
    sliding-window layers with their own RoPE base, linear RoPE scaling, logit softcap, an untied
    head): a prompt three windows long, a padded row, and generation through the target's cache
    give the runtime's numbers."""
    from helpers.tiny import make_gemma3_hf_model

    folder = make_gemma3_hf_model(
        tmp_path / "gemma", layers=4, window=3, query_pre_attn_scalar=12, final_logit_softcapping=3.0,
        tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}})
    target = DenseTarget(open_checkpoint(folder)[0])
    model = load_model(str(folder), "fp32", progress=False)
    c = model.config
    assert c.sliding_layers and c.final_logit_softcap == 3.0 and c.sandwich_norms and c.mlp_act == "gelu_tanh"
    tr = model.transformer
    out = tr.forward(torch.tensor([PROMPT]), tr.new_cache(64), [0], hidden_layers=(3,), exact=True)
    tokens = torch.tensor([PROMPT, [0] * 3 + PROMPT[:7]])  # the second row left-padded, as generate pads
    valid = torch.ones_like(tokens, dtype=torch.bool)
    valid[1, :3] = False
    logits, hidden = target.forward(tokens, valid, hidden_layers=(3,))
    torch.testing.assert_close(logits[0], out.logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hidden[3][0], out.hidden[3][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits[1, 3:], out.logits[0, :7], rtol=1e-4, atol=1e-4)
    assert logits.abs().max() <= 3.0  # capped

    from specdec.engine.engine import Engine

    eos = set(model.tokenizer.eos_ids)
    generated = target.generate([PROMPT, PROMPT[:7]], 12, 0.0, eos, torch.Generator().manual_seed(0))
    engine = Engine(model, max_len=64)
    for prompt, row in zip([PROMPT, PROMPT[:7]], generated):
        expected = [t for t in engine.generate(prompt, max_tokens=12).token_ids if t not in eos]
        assert row[len(prompt):] == expected


# -- RoPE tables sized on demand ----------------------------------------------------------------
@pytest.mark.parametrize("theta, factors", [(10000.0, None), (1e6, None), (500000.0, tuple(1.0 + i for i in range(8)))])
def test_rope_table_grown_in_steps_is_bitwise_the_whole_table(theta, factors):
    table = RopeTable(16, theta, 5000, factors, initial=7)
    for n in (3, 8, 15, 100, 1000, 4133, 5000):  # within, just past, far past, up to the limit
        table.cover(n)
        assert len(table) >= n
    whole = rope_tables(16, theta, 5000, factors)
    assert len(table) == 5000
    assert torch.equal(table.tables[0], whole[0]) and torch.equal(table.tables[1], whole[1])


def test_rope_table_refuses_positions_past_its_limit():
    table = RopeTable(16, 10000.0, 64, initial=8)
    cos, sin = table.rows(torch.tensor([[63]]))  # the last position is fine
    assert len(table) == 64 and cos.shape == (1, 1, 16)
    with pytest.raises(ValueError, match="position 64 is beyond the context length 64"):
        table.rows(torch.tensor([[10, 64]]))


def test_a_long_context_model_starts_small_and_grows_without_changing_a_logit(tmp_path):
    """A 1M-position model holds ROPE_INITIAL_ROWS rows at start (not 1 GB of table); a forward past them
    gives bitwise the logits of the same model over tables computed whole."""
    folder = make_hf_model(tmp_path / "long", extra_config={"max_position_embeddings": 1 << 20})
    grown, whole = (load_model(str(folder), "fp32", progress=False).transformer for _ in range(2))
    assert len(grown.rope) == ROPE_INITIAL_ROWS and grown.rope.nbytes() == 2 * 4 * ROPE_INITIAL_ROWS * 16
    c = whole.config
    whole.rope.tables = rope_tables(c.head_dim, c.rope_theta, 2 * ROPE_INITIAL_ROWS, c.rope_freq_factors)
    T = ROPE_INITIAL_ROWS + 50
    tokens = torch.tensor([[(7 * i + 3) % 500 for i in range(T)]])
    logits = []
    for tr in (grown, whole):
        cache = tr.new_cache(T)
        logits.append(tr.forward(tokens, cache, [cache.allocate()], exact=True).logits[0, -60:])
    assert len(grown.rope) == 2 * ROPE_INITIAL_ROWS
    assert torch.equal(logits[0], logits[1])
