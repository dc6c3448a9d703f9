"""moe.c: a mixture layer's routed experts in one C call (model/kernels/moe_experts.py, model/moe.py).

On random quantized experts wide enough for the gguf kernel's interleaved groups of 256 (hidden 512, width 256;
gate and up Q8_0, down Q4_0): the one call gives bitwise the Python loop over experts it replaces (the same
kernels in the same order), a row alone the bits it gets among n rows, and the mixture the file's weights
dequantized to float32 compute, within the int8 activations' rounding. Its routing (its own exp, row by row)
picks torch's experts with torch's weights to a few ulps, for softmax and for GLM's sigmoid, bias, groups,
floor and scale. step.c runs a mixture model's layers (each mixture one moe.c call) with the per-op path's bits.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.moe import FIXTURE
from specdec.model import kernels
from specdec.model.linear import GGUF_KERNEL_TYPES, QLinear
from specdec.model.load import load_model
from specdec.model.moe import GGUFExperts, MoE
from specdec.model.moe_config import SCORINGS, MoEConfig
from specdec.model.segments import Segment

pytestmark = [pytest.mark.skipif(kernels.moe() is None, reason="no MoE kernel here (no cc or no AVX2)"),
              pytest.mark.usefixtures("one_torch_thread")]  # tests/conftest.py

E, K_USED, H, I = 8, 3, 512, 256


def blocks(kind: str, rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    """(rows, bytes) random blocks of a legacy type (Q8_0: f16 scale + 32 int8; Q4_0: f16 scale + 16 bytes of
    nibbles), scales ~0.02 so that the products stay O(1)."""
    quants = {"Q8_0": 32, "Q4_0": 16}[kind]
    nb = rows * cols // 32
    scale = (0.01 + 0.02 * torch.rand(nb, 1, generator=g)).half().view(torch.uint8)  # (nb, 2)
    q = torch.randint(0, 256, (nb, quants), generator=g, dtype=torch.uint8)
    return torch.cat([scale, q], dim=1).reshape(rows, -1).contiguous()


def gguf_router(g: torch.Generator) -> QLinear:
    """A gguf-format (E, H) router of float32 values, as a file's ffn_gate_inp usually is."""
    return QLinear.from_gguf([("F32", torch.randn(E, H, generator=g))], None)


@pytest.fixture(scope="module")
def layer():
    """(MoE over GGUFExperts, the experts' float32 weights (gate (E, I, H), up (E, I, H), down (E, H, I)))."""
    g = torch.Generator().manual_seed(0)
    raw = [("Q8_0", blocks("Q8_0", E * I, H, g)), ("Q8_0", blocks("Q8_0", E * I, H, g)),
           ("Q4_0", blocks("Q4_0", E * H, I, g))]
    dense = [kernels.gguf_rows(GGUF_KERNEL_TYPES[kind], t, torch.arange(t.shape[0]), cols)
             for (kind, t), cols in zip(raw, (H, H, I))]
    cfg = MoEConfig(experts=E, experts_per_token=K_USED, expert_intermediate=I, layers=(0,))
    moe = MoE(cfg, gguf_router(g), None, GGUFExperts(*raw, E, H, I), None, None, "silu", torch.ones(H))
    assert moe.experts.native is not None and moe._route(torch.ones(1, H)) is not None
    return moe, (dense[0].view(E, I, H), dense[1].view(E, I, H), dense[2].view(E, H, I))


def python_loop(moe: MoE, h: torch.Tensor) -> torch.Tensor:
    """The layer through moe.py's loop over experts (the path the kernel replaces)."""
    native, moe.experts.native = moe.experts.native, None
    try:
        return moe(h)
    finally:
        moe.experts.native = native


@pytest.mark.parametrize("n", [1, 2, 3, 5, 9])
def test_one_call_gives_the_python_loops_bits_and_a_rows_bits_alone(layer, n):
    moe, _ = layer
    h = torch.randn(n, H, generator=torch.Generator().manual_seed(n))
    out = moe(h)
    assert torch.equal(out, python_loop(moe, h)), f"max |diff| {(out - python_loop(moe, h)).abs().max():.3e}"
    assert torch.equal(out, torch.cat([moe(h[i : i + 1]) for i in range(n)]))
    if n > 1:
        ids, _ = moe.route(h)
        assert len(torch.unique(ids)) > K_USED, "every row chose the same experts: this would prove little"


@pytest.mark.parametrize("threads", [2, 3])
def test_the_thread_count_changes_no_bit(layer, threads):
    """3 threads split a decode step's 3 down products by expert (moe.c), 2 split each one's columns."""
    moe, _ = layer
    h = torch.randn(5, H, generator=torch.Generator().manual_seed(3))
    one = [moe(h[:1]), moe(h)]
    torch.set_num_threads(threads)
    try:
        many = [moe(h[:1]), moe(h)]
    finally:
        torch.set_num_threads(1)
    assert all(torch.equal(a, b) for a, b in zip(one, many))


def test_the_mixture_is_the_dequantized_weights_one(layer):
    """Against float32 on the blocks' own values: sum_j w_j * down_e (silu(gate_e h) * up_e h), e = ids[j]."""
    moe, (gate, up, down) = layer
    h = torch.randn(6, H, generator=torch.Generator().manual_seed(1))
    ids, weights = moe.route(h)
    want = torch.zeros(6, H)
    for r in range(6):
        for e, w in zip(ids[r].tolist(), weights[r].tolist()):
            a = torch.nn.functional.silu(gate[e] @ h[r]) * (up[e] @ h[r])
            want[r] += w * (down[e] @ a)
    got = moe(h)
    scale = want.abs().max()
    assert scale > 0.1
    assert (got - want).abs().max() < 0.02 * scale  # int8 activations in blocks of 32, twice


def test_bad_ids_are_refused(layer):
    moe, _ = layer
    h = torch.randn(1, H)
    with pytest.raises(ValueError, match="expert ids must lie in 0..7"):
        kernels.moe_experts(h, torch.tensor([[0, 1, E]]), torch.ones(1, 3), moe.experts.native[0], "silu")
    with pytest.raises(ValueError, match="do not fit 8 experts"):
        kernels.moe_experts(h, torch.tensor([[0, 1, 2]]), torch.ones(2, 3), moe.experts.native[0], "silu")


ROUTINGS = {"softmax": {}, "glm": dict(scoring="sigmoid", score_bias=True, groups=4, groups_used=2, norm_floor=1e-20,
                                       routed_scale=2.5)}


@pytest.mark.parametrize("routing", ROUTINGS)
def test_the_routing_is_torchs(routing):
    g = torch.Generator().manual_seed(2)
    cfg = MoEConfig(experts=E, experts_per_token=K_USED, expert_intermediate=I, layers=(0,), **ROUTINGS[routing])
    bias = torch.rand(E, generator=g) * 0.1 if cfg.score_bias else None
    moe = MoE(cfg, gguf_router(g), bias, None, None, None, "silu", torch.ones(H))
    h = torch.randn(64, H, generator=g) * 0.05
    ids, weights = moe.route(h)
    assert moe._c_route is not None
    moe._c_route = None  # torch's routing, moe.py's formulas
    want_ids, want_weights = moe.route(h)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights, rtol=4e-7, atol=0)
    assert len(torch.unique(ids)) == E and weights.std() > 0.01


# -- step.c runs a mixture model's layers with moe.c ---------------------------------------------------------
def test_step_c_runs_the_mixture_layers_with_the_per_op_bits():
    """Qwen3-MoE (llama.cpp's conversion, FIXTURE): single steps, a verify after a rollback and a batch of two
    sequences through step.c (its mixture layers one moe.c call each) give the per-op path's bits."""
    model = load_model(str(FIXTURE / "qwen3_moe.gguf"), "gguf", progress=False, weight_cache=False)
    tr = model.transformer
    assert tr._step_layers() is not None, "step.c must take this model"
    prompt, new = [(7 * i + 3) % 270 for i in range(12)], [40, 41, 200, 201, 7]

    def run(step_kernel: bool):
        tr.step_kernel = step_kernel
        try:
            cache = tr.new_cache(64, num_slots=2)
            for slot, n in ((cache.allocate(), 12), (cache.allocate(), 7)):
                tr.forward(torch.tensor([prompt[:n]]), cache, [slot], exact=False, last_only=True)
            outs = [tr.forward(torch.tensor([[t]]), cache, [0], hidden_layers=(1,)) for t in new]
            cache.truncate(0, 12)
            outs.append(tr.forward(torch.tensor([new]), cache, [0]))
            outs += tr.forward_batch([Segment(torch.tensor(new[:3]), 0), Segment(torch.tensor(new[2:]), 1)], cache)
            return outs
        finally:
            tr.step_kernel = True

    fused, per_op = run(True), run(False)
    for a, b in zip(fused, per_op):
        assert torch.equal(a.logits, b.logits) and all(torch.equal(a.hidden[k], b.hidden[k]) for k in a.hidden)
    assert torch.equal(fused[5].logits[0, 2], fused[2].logits[0, 0])  # a verify's rows are single steps


def test_moe_c_knows_every_routing_setting():
    """A tripwire: moe.c computes the MoEConfig fields and scorings below (the shared expert's two: MoE._rows,
    after the kernel); a new one must be computed there too (or MoE._route must leave such a layer to torch),
    else the kernel would route without it."""
    known = {"experts", "experts_per_token", "expert_intermediate", "layers", "scoring", "norm_topk", "norm_floor",
             "routed_scale", "groups", "groups_used", "score_bias", "shared_intermediate", "shared_gate"}
    assert {f.name for f in dataclasses.fields(MoEConfig)} == known
    assert SCORINGS == ("softmax", "sigmoid")
