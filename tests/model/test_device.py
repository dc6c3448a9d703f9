"""The device runtime (model/device.py) run eagerly on the CPU: the fixed-shape programs that CUDA
graphs capture on a GPU, checked for what speculation rests on (a k-token forward is bitwise k
single steps, trees and chunks included, greedy speculative output equals plain) and for computing
the same model as the CPU runtime. The CUDA test at the end skips without a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers.tiny import make_gemma3_hf_model, make_hf_model
from specdec.drafters.base import TokenTree
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model.device import DeviceTransformer, pick_device
from specdec.model.device_program import KEY_ALIGN, DeviceKVCache, chain_masks, row_masks
from specdec.model.load import load_model
from specdec.model.segments import Segment
from specdec.sampling import SamplingParams

PROMPT = [(7 * i + 3) % 500 for i in range(12)]
NEW = [40, 41, 300, 301, 7, 8, 99]  # 7 rows: two calls of a 4-row program
ROWS = 4
GEMMA = dict(layers=4, kv_heads=1, window=3, query_pre_attn_scalar=24, final_logit_softcapping=5.0,
             tie_word_embeddings=False,
             layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"])


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "gemma3"])
def models(request, tmp_path_factory):
    """(CPU model, the same weights as a 4-row device model on the CPU)."""
    folder = tmp_path_factory.mktemp("device") / request.param
    if request.param == "gemma3":
        make_gemma3_hf_model(folder, **GEMMA)
    else:
        make_hf_model(folder, request.param)
    model = load_model(str(folder), "fp32", progress=False)
    return model, DeviceTransformer.from_transformer(model.transformer, "cpu", rows=ROWS)


def _prefilled(tr, ids=PROMPT, max_len=64):
    cache = tr.new_cache(max_len)
    slot = cache.allocate()
    tr.forward(torch.tensor([ids]), cache, [slot], exact=False, last_only=True)
    return cache, slot


def _singles(tr, cache, slot, tokens) -> list[torch.Tensor]:
    return [tr.forward(torch.tensor([[t]]), cache, [slot]).logits[0, 0] for t in tokens]


def test_multi_token_forward_equals_single_steps_bitwise(models):
    _, dev = models
    cache, slot = _prefilled(dev)
    start = cache.lengths[slot]
    singles = _singles(dev, cache, slot, NEW)
    cache.truncate(slot, start)
    multi = dev.forward(torch.tensor([NEW]), cache, [slot]).logits[0]
    for i in range(len(NEW)):
        assert torch.equal(multi[i], singles[i]), f"row {i}"
    cache.truncate(slot, start)  # the rows past a rollback are written again, with the same result
    assert all(torch.equal(a, b) for a, b in zip(_singles(dev, cache, slot, NEW), singles))


def test_the_device_model_computes_the_cpu_model(models):
    """Not bitwise (other kernels), but the same model: prefill, single steps and a 7-row verify agree
    closely with the CPU runtime's (under Gemma's window of 3, past it)."""
    cpu, dev = models
    outs = []
    for tr in (cpu.transformer, dev):
        cache = tr.new_cache(64)
        slot = cache.allocate()
        pre = tr.forward(torch.tensor([PROMPT]), cache, [slot], exact=False).logits[0]
        steps = torch.stack(_singles(tr, cache, slot, NEW[:3]))
        verify = tr.forward(torch.tensor([NEW]), cache, [slot]).logits[0]
        outs.append((pre, steps, verify))
    for mine, theirs in zip(*outs):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)


def test_trees_are_refused_and_a_chain_given_as_a_tree_is_not(models):
    """A tree's rows would not be bitwise its paths' single steps here (model/device.py): a clear error,
    in the forward and before a request runs; a causal mask at consecutive positions is a chain."""
    cpu, dev = models
    cache, slot = _prefilled(dev)
    start = cache.lengths[slot]
    tree = TokenTree((40, 99, 300), (-1, -1, 0))
    with pytest.raises(ValueError, match="verifies chains only"):
        dev.forward(torch.tensor([list(tree.tokens)]), cache, [slot],
                    positions=torch.tensor([[start + d - 1 for d in tree.depths()]]),
                    tree_mask=tree.attention_mask()[None])
    assert cache.lengths[slot] == start
    chain = TokenTree.chain(NEW[:3])
    as_tree = dev.forward(torch.tensor([NEW[:3]]), cache, [slot], positions=start + torch.arange(3)[None],
                          tree_mask=chain.attention_mask()[None]).logits[0]
    cache.truncate(slot, start)
    assert torch.equal(as_tree, dev.forward(torch.tensor([NEW[:3]]), cache, [slot]).logits[0])
    engine = Engine(dataclasses.replace(cpu, transformer=dev), max_len=64)
    refused = "--spec-tree-topk 2: the target runs on cpu, where tree rows .* so specdec verifies chains only"
    with pytest.raises(ValueError, match=refused):
        spec = SpecConfig(drafters=("draft-mtp",), tree_topk=2)
        engine.build_drafter(spec.drafters[0], spec)


def test_bf16_rows_equal_single_steps_bitwise(models):
    """The dtype a GPU runs: the same argument, with bf16 matmuls."""
    cpu, _ = models
    dev = DeviceTransformer.from_transformer(cpu.transformer, "cpu", torch.bfloat16, rows=ROWS)
    cache, slot = _prefilled(dev)
    start = cache.lengths[slot]
    singles = _singles(dev, cache, slot, NEW)
    cache.truncate(slot, start)
    multi = dev.forward(torch.tensor([NEW]), cache, [slot]).logits[0]
    assert all(torch.equal(multi[i], singles[i]) for i in range(len(NEW)))


def test_a_batch_gives_each_sequence_its_solo_outputs_and_hidden_states(models):
    _, dev = models

    def run(which):
        cache = dev.new_cache(64, num_slots=3)
        slots = [cache.allocate() for _ in range(3)]
        for slot, n in zip(slots, (5, 10, 7)):
            dev.forward(torch.tensor([PROMPT[:n]]), cache, [slot], exact=False, last_only=True)
        segments = [Segment(torch.tensor(PROMPT[5:]), slots[0], exact=False, last_only=True),
                    Segment(torch.tensor(NEW[:4]), slots[1]),
                    Segment(torch.tensor(NEW[1:6]), slots[2])]
        return dev.forward_batch([segments[i] for i in which], cache, hidden_layers=(0, 2))

    together = run([0, 1, 2])
    assert [o.logits.shape[1] for o in together] == [1, 4, 5]
    for i in range(3):
        (alone,) = run([i])
        assert torch.equal(together[i].logits, alone.logits), f"sequence {i}"
        assert all(torch.equal(together[i].hidden[h], alone.hidden[h]) for h in (0, 2))
    assert together[1].hidden[2].shape == (1, 4, dev.config.hidden_size)


@pytest.mark.parametrize("drafter", ["ngram-simple", "suffix"])
def test_greedy_speculation_equals_plain_decoding(models, drafter):
    """Drafts up to 6 tokens, so verifies run in one and two program calls."""
    cpu, dev = models
    model = dataclasses.replace(cpu, transformer=dev)
    engine = Engine(model, max_len=256)
    drafted = accepted = 0
    for prompt in ([174, 381] * 3, [427, 336, 44, 3, 307, 101] * 8, PROMPT * 3):
        plain = engine.generate(prompt, SamplingParams(), max_tokens=40, spec=SpecConfig(drafters=()))
        out = engine.generate(prompt, SamplingParams(), max_tokens=40,
                              spec=SpecConfig(drafters=(drafter,), draft_n_max=6))
        assert out.token_ids == plain.token_ids
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert 0 < accepted < drafted, "both the accepted and the rejected branch must have run"


def test_a_program_makes_the_masks_of_a_chain_as_row_masks_does():
    """The programs make their masks from the rows' cache offsets (chain_masks); row_masks is the reference."""
    width, rows = 24, 6
    for start, n in ((0, 1), (5, 4), (12, 6), (20, 3)):
        positions = start + torch.arange(n)
        for window in (0, 1, 3, 8):
            for lo in range(0, n, 4):  # a chain split over calls of 4 rows: rows lo.. of it
                k = min(4, n - lo)
                writes = torch.full((rows,), width - 1)  # padding writes the spare position
                writes[:k] = positions[lo : lo + k]
                want = row_masks(None, start, positions, window, range(lo, lo + k), rows, width)
                assert torch.equal(chain_masks(writes, width, window), want), (start, n, window, lo)


def test_row_masks_give_each_row_its_keys():
    positions = torch.tensor([5, 6, 7])
    chain = row_masks(None, 5, positions, 0, range(1, 3), 4, 10)  # rows 1, 2 of a segment at offset 5
    assert chain.int().tolist() == [[1] * 7 + [0] * 3, [1] * 8 + [0] * 2, [0] * 9 + [1], [0] * 9 + [1]]
    windowed = row_masks(None, 5, positions, 3, range(3), 3, 9)  # a window of 3: positions p-2 .. p
    assert [row.nonzero().flatten().tolist() for row in windowed] == [[3, 4, 5], [4, 5, 6], [5, 6, 7]]
    tree = TokenTree((1, 2, 3), (-1, -1, 0))  # two roots, the second's child
    mask = row_masks(tree.attention_mask(), 4, torch.tensor([4, 4, 5]), 0, range(3), 3, 9)
    assert [row.nonzero().flatten().tolist() for row in mask] == [[0, 1, 2, 3, 4], [0, 1, 2, 3, 5],
                                                                  [0, 1, 2, 3, 4, 6]]


def test_bad_use_is_a_clear_error(models):
    cpu, dev = models
    with pytest.raises(TypeError, match="its own cache"):
        dev.forward(torch.tensor([[1]]), cpu.transformer.new_cache(16), [0])
    cache = dev.new_cache(8)
    assert isinstance(cache, DeviceKVCache) and cache.k.shape[3] == cache.width == KEY_ALIGN  # spare positions
    assert dev.new_cache(KEY_ALIGN).width == 2 * KEY_ALIGN  # at least one spare
    slot = cache.allocate()
    with pytest.raises(ValueError, match="exceed the cache length 8"):
        dev.forward(torch.tensor([list(range(9))]), cache, [slot], exact=False)
    with pytest.raises(ValueError, match="at least one row"):
        DeviceTransformer.from_transformer(cpu.transformer, "cpu", rows=0)
    bare = DeviceTransformer(dev.config, *dev.weights, "cpu")
    with pytest.raises(RuntimeError, match="without a CPU model"):
        bare.lm_head


def test_memory_counts_the_device_tensors(models):
    """The bench's memory figure for a device model: its own tensors (matrices, embedding, head, tables)."""
    from specdec.bench.memory import transformer_bytes

    _, dev = models
    c = dev.config
    matrices = sum(4 * (c.q_size + 2 * c.kv_size) * c.hidden_size + 4 * c.hidden_size * c.q_size
                   + 4 * 3 * c.intermediate_size * c.hidden_size for _ in range(c.num_layers))
    assert matrices < transformer_bytes(dev) == dev.device_bytes() < matrices + 4 * 4 * c.vocab_size * c.hidden_size


def test_pick_device():
    assert pick_device("cpu") == "cpu"
    assert pick_device(None) == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        pick_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device"):
            pick_device("cuda")


def test_pick_device_checks_the_gpu_index(monkeypatch):
    """With one GPU (as torch would report it): cuda:0 is it, cuda:1 and cuda:x are clear errors."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert pick_device("cuda:0") == "cuda:0" and pick_device("cuda") == "cuda"
    for bad in ("cuda:1", "cuda:x"):
        with pytest.raises(ValueError, match="sees 1 CUDA device"):
            pick_device(bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_graphs_give_greedy_speculation_equal_to_plain(tiny_hf_dir):
    model = load_model(str(tiny_hf_dir), "fp32", progress=False, device="cuda")
    assert isinstance(model.transformer, DeviceTransformer) and model.info.device == "cuda"
    engine = Engine(model, max_len=256)
    prompt = [174, 381] * 3
    plain = engine.generate(prompt, SamplingParams(), max_tokens=40, spec=SpecConfig(drafters=()))
    out = engine.generate(prompt, SamplingParams(), max_tokens=40, spec=SpecConfig(drafters=("suffix",)))
    assert out.token_ids == plain.token_ids
    assert all(p.graph is not None for p in engine.cache.programs.values())


def test_an_mtp_head_reads_the_device_models_hidden_states(tmp_path):
    """draft-mtp over a device target: the head runs on the CPU on the hidden states the programs hand
    back and the host model's embedding and output head; greedy output equals plain decoding."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "drafters"))
    from helpers.tiny import tiny_config
    from mtp_helpers import deepseek_layout, mtp_block

    from specdec.drafters.mtp import make_mtp_drafter

    folder = make_hf_model(tmp_path / "ds", extra_config={"num_nextn_predict_layers": 1},
                           extra_tensors=deepseek_layout([mtp_block(tiny_config(), seed=1)], 2))
    cpu = load_model(str(folder), "fp32", progress=False)
    model = dataclasses.replace(cpu, transformer=DeviceTransformer.from_transformer(cpu.transformer, "cpu", rows=ROWS))
    prompt = list(range(5, 40))
    plain = Engine(model, max_len=256).generate(prompt, max_tokens=40).token_ids
    engine = Engine(model, SpecConfig(drafters=("draft-mtp",), draft_n_max=4), max_len=256)
    drafter = make_mtp_drafter(model, max_len=256)
    engine.drafter_factory = lambda name, spec: drafter
    result = engine.generate(prompt, max_tokens=40)
    assert result.token_ids == plain
    assert result.stats.drafted > 0 and drafter.hidden_layers


@pytest.mark.slow
def test_the_real_smollm2_file_on_the_device_runtime():
    """smollm2-135m's GGUF (its blocks' values as the device runtime holds them, bf16, as on a GPU): greedy
    suffix speculation equals plain decoding token for token, with drafts accepted and rejected."""
    from helpers.models import real_model

    cpu = real_model("smollm2-135m", "gguf")
    model = dataclasses.replace(cpu, transformer=DeviceTransformer.from_transformer(cpu.transformer, "cpu",
                                                                                    torch.bfloat16))
    engine = Engine(model, max_len=256)
    ids = model.tokenizer.encode("def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\n"
                                 "def fib2(n):\n")
    plain = engine.generate(ids, SamplingParams(), max_tokens=48, spec=SpecConfig(drafters=()))
    out = engine.generate(ids, SamplingParams(), max_tokens=48, spec=SpecConfig(drafters=("suffix",), draft_n_max=8))
    assert out.token_ids == plain.token_ids and len(plain.token_ids) == 48
    assert 0 < out.stats.accepted < out.stats.drafted
