"""model/kernels/step.c: an exact forward's layers in C give the per-op path's bits, for every family
(Llama with quantized GGUF blocks, Qwen2's biases, Qwen3's q/k norms, Gemma 3's windows and four norms),
with hidden states, batches, trees and rollback."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import make_gemma3_gguf_model, make_gguf_model, make_hf_model
from specdec.drafters.base import TokenTree
from specdec.model import kernels
from specdec.model.linear import QLinear
from specdec.model.load import load_model
from specdec.model.segments import Segment

pytestmark = pytest.mark.skipif(kernels.step() is None, reason=f"no step kernel here ({kernels.why_unavailable('step')})")

PROMPT = [(7 * i + 3) % 500 for i in range(12)]
NEW = [40, 41, 300, 301, 7]


def _as_gguf_f32(tr):
    """An HF folder's fp32 model with every matrix a gguf-format QLinear over F32 values (no GGUF file of
    Qwen2 or Qwen3 is at hand): what step.c runs, with the folder's biases and norms."""
    for layer in tr.layers:
        for name in ("qkv", "o", "gate_up", "down"):
            m = getattr(layer, name)
            setattr(layer, name, QLinear.from_gguf([("F32", m.weight)], m.bias))
    return tr


@pytest.fixture(scope="module", params=["llama-q4k", "qwen2", "qwen3", "gemma3"])
def model(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp("step")
    if request.param == "llama-q4k":
        path = make_gguf_model(folder / "m.gguf", tensor_type=["Q4_K", "Q8_0", "Q6_K", "Q5_0"], hidden=256,
                               intermediate=512, heads=8, kv_heads=2)
        return load_model(str(path), "gguf", progress=False).transformer
    if request.param == "gemma3":
        path = make_gemma3_gguf_model(folder / "g.gguf", window=3, tensor_type="Q8_0")  # 5 local layers, 1 global
        return load_model(str(path), "gguf", progress=False).transformer
    return _as_gguf_f32(load_model(str(make_hf_model(folder / request.param, request.param)), "fp32",
                                   progress=False).transformer)


def _run(tr, step_kernel: bool, call):
    """call(tr, cache) on a fresh prefilled cache of 2 slots, through step.c or the per-op path."""
    tr.step_kernel = step_kernel
    try:
        cache = tr.new_cache(64, num_slots=2)
        for slot, n in ((cache.allocate(), 12), (cache.allocate(), 7)):
            tr.forward(torch.tensor([PROMPT[:n]]), cache, [slot], exact=False, last_only=True)
        return call(tr, cache)
    finally:
        tr.step_kernel = True


def _same(a, b) -> bool:
    return torch.equal(a.logits, b.logits) and a.hidden.keys() == b.hidden.keys() and all(
        torch.equal(a.hidden[k], b.hidden[k]) for k in a.hidden)


def test_the_step_kernel_runs_and_gives_the_per_op_bits(model):
    assert model._step_layers() is not None, "step.c must take these weights"

    def steps(tr, cache):  # single steps, a verify after a rollback, with hidden states
        singles = [tr.forward(torch.tensor([[t]]), cache, [0], hidden_layers=(0, 1, 2)) for t in NEW]
        cache.truncate(0, 12)
        return singles + [tr.forward(torch.tensor([NEW]), cache, [0], hidden_layers=(2,))]

    fused, per_op = _run(model, True, steps), _run(model, False, steps)
    assert all(_same(a, b) for a, b in zip(fused, per_op))
    assert torch.equal(fused[-1].logits[0, 2], fused[2].logits[0, 0])  # and rows = single steps, as always


def test_a_batch_with_a_tree_gives_the_per_op_bits(model):
    tree = TokenTree((40, 99, 300, 12, 7), (-1, -1, 0, 0, 2))

    def batch(tr, cache):
        start = cache.lengths[1]
        return tr.forward_batch([
            Segment(torch.tensor(NEW[:3]), 0),
            Segment(torch.tensor(list(tree.tokens)), 1, positions=torch.tensor([start + d - 1 for d in tree.depths()]),
                    tree_mask=tree.attention_mask())], cache, hidden_layers=(1,))

    fused, per_op = _run(model, True, batch), _run(model, False, batch)
    assert all(_same(a, b) for a, b in zip(fused, per_op))


def test_a_batch_with_a_prefill_takes_the_per_op_path_and_agrees(model):
    def mixed(tr, cache):
        return tr.forward_batch([Segment(torch.tensor(PROMPT[7:]), 1, exact=False, last_only=True),
                                 Segment(torch.tensor(NEW[:2]), 0)], cache)

    fused, per_op = _run(model, True, mixed), _run(model, False, mixed)
    assert all(_same(a, b) for a, b in zip(fused, per_op))
