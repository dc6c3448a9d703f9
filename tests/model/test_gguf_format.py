"""The gguf weight format: a GGUF file's own quantized blocks, computed as stored (model/kernels/gguf_*.c)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from helpers.tiny import make_gguf_model, make_hf_model, random_kquant_blocks
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model import kernels
from specdec.model import linear as linear_module
from specdec.model.kernels import build, cpu
from specdec.model.linear import GGUF_KERNEL_TYPES, BlockRows, QLinear
from specdec.model.load import load_model, weights_format_for
from specdec.sampling import SamplingParams

pytestmark = pytest.mark.skipif(kernels.gguf() is None, reason="no GGUF kernel here (no cc or no AVX2)")
TYPES = list(GGUF_KERNEL_TYPES)
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
# every kernel type, taken in turn by the tiny model's matrices (K-quants where the width is 256)
MIXED = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "Q5_K"]
PROMPT = [5, 9, 77, 100, 3, 250, 17, 42, 8, 300]
NEW = [40, 300, 7, 12, 99, 5]


def blocks_of(kind: str, rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    if kind in K_QUANTS:
        return torch.from_numpy(random_kquant_blocks(rows, cols, kind, seed))
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.1
    return torch.from_numpy(quantize(w, GGMLQuantizationType[kind]))


def file_values(kind: str, blocks: torch.Tensor) -> torch.Tensor:
    """(rows, K) float64: what the file's blocks hold, decoded by the gguf package."""
    values = dequantize(blocks.numpy(), GGMLQuantizationType[kind]).astype(np.float64)
    return torch.from_numpy(values).reshape(blocks.shape[0], -1)


def quantized_input(x: torch.Tensor) -> torch.Tensor:
    """x as the kernel sees it: int8 blocks of 32 times their scales, in float64."""
    xq, xs, _ = kernels.gguf_quantize(x)
    return (xq.double().reshape(x.shape[0], -1, 32) * xs.double()[..., None]).reshape(x.shape)


# -- the kernel ------------------------------------------------------------------------------------
def test_activations_quantize_as_the_scalar_rule():
    """gguf_acts.c's vectorized quantize_rows_sums, bit for bit the rule it states: per block of 32, d = max|v| / 127,
    q = v * (1 / d) rounded half to even, xsum = d * sum(q), all in float32 (ties, zeros and a zero block
    included)."""
    x = torch.randn(5, 320) * torch.logspace(-3, 3, 320)
    x[1, :32] = 0.0  # a block of zeros: d = 0, q = 0
    x[2, :32] = torch.arange(32) - 15.5  # a ramp
    x[3, 32:64] = torch.tensor([127.0, -63.5, 0.5, 1.5, 2.5, -0.5] + [0.25] * 26)
    xq, xs, xsum = kernels.gguf_quantize(x)
    v = x.reshape(5, -1, 32)
    d = v.abs().amax(-1) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(v * inv[..., None])
    assert torch.equal(xs, d)
    assert torch.equal(xq.reshape(5, -1, 32).float(), q)
    assert torch.equal(xsum, d * q.sum(-1))


@pytest.mark.parametrize("kind,width", [(kind, 512) for kind in TYPES] +  # whole groups of 256 values
                         [(kind, 352) for kind in TYPES if kind not in K_QUANTS] +  # and 3 blocks past them
                         [(kind, 96) for kind in TYPES if kind not in K_QUANTS])  # no whole group
def test_kernel_computes_the_files_weights(kind, width):
    b = blocks_of(kind, 37, width)
    x = torch.randn(6, width)
    y = QLinear.from_gguf([(kind, b)], None)(x)
    ref = quantized_input(x) @ file_values(kind, b).T
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


# each type's fp16 fields (bytes start, end): every other byte of its blocks is quant bits or 6/8-bit scales
FP16_FIELDS = {"Q4_0": [(0, 2)], "Q4_1": [(0, 4)], "Q5_0": [(0, 2)], "Q5_1": [(0, 4)], "Q8_0": [(0, 2)],
               "Q4_K": [(0, 4)], "Q5_K": [(0, 4)], "Q6_K": [(208, 210)]}


@pytest.mark.parametrize("kind", TYPES)
def test_the_largest_q_against_the_largest_activations_stays_exact(kind):
    """Every q at its type's largest magnitude (all bits set; Q8_0: -128) against activations that quantize to
    +-127 everywhere: the integer dots' largest sums, which the AVX2 build adds in int16 before widening
    (gguf_linear.c, sums16); a saturated sum would be off by far more than the tolerance."""
    width = 512 if kind in K_QUANTS else 352
    b = blocks_of(kind, 8, width).clone()
    size = {"Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q8_0": 34, "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[kind]
    blocks = b.view(8, -1, size)
    keep = torch.zeros(size, dtype=torch.bool)
    for start, end in FP16_FIELDS[kind]:
        keep[start:end] = True
    blocks[:, :, ~keep] = 0x80 if kind == "Q8_0" else 0xFF
    x = torch.cat([torch.full((1, width), 0.5), torch.full((1, width), -2.0), torch.randn(2, width).sign()])
    for m in (1, 2, 4):
        y = QLinear.from_gguf([(kind, b)], None)(x[:m])
        ref = quantized_input(x[:m]) @ file_values(kind, b).T
        assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max(), f"{m} rows"


@pytest.mark.parametrize("kind", TYPES)
def test_rows_are_bitwise_the_same_in_any_batch_and_at_any_thread_count(kind):
    width = 512 if kind in K_QUANTS else 352
    lin = QLinear.from_gguf([(kind, blocks_of(kind, 40, width, seed=1))], torch.randn(40))
    x = torch.randn(9, width)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(9)])
    for m in (2, 4, 5, 9):  # tiles of 4 rows, full and partial
        assert torch.equal(lin(x[:m]), alone[:m]), f"{m} rows"
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = lin(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one_thread, alone)


@pytest.mark.parametrize("kind", TYPES)
def test_long_rows_taken_in_spans_give_the_bits_of_one_pass(kind):
    """Rows of 24 groups of 256 (+ 3 legacy blocks past them): four activation rows no longer fit in L1 with
    them, so the kernel takes panels of columns span by span of groups (gguf_linear.c, "Spans of groups"), where
    one row takes each column in one pass; 37 columns leave a partial panel."""
    width = 24 * 256 if kind in K_QUANTS else 24 * 256 + 96
    b = blocks_of(kind, 37, width, seed=4)
    lin = QLinear.from_gguf([(kind, b)], torch.randn(37))
    x = torch.randn(9, width)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(9)])
    for m in (2, 3, 4, 5, 8, 9):
        assert torch.equal(lin(x[:m]), alone[:m]), f"{m} rows"
    ref = quantized_input(x[:4]) @ file_values(kind, b).T + lin.bias.double()
    assert (lin(x[:4]).double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    if kernels.has_vnni():  # the AVX2 build's spans too
        parts = kernels.GGUFParts([(GGUF_KERNEL_TYPES[kind], b)])
        assert torch.equal(kernels.gguf_linear(x[:4], parts, lin.bias, lib=kernels.gguf_build(False)), alone[:4])


def test_long_rows_of_several_types_and_float32_in_spans():
    width = 24 * 256
    parts = [("Q4_K", blocks_of("Q4_K", 5, width)), ("F32", torch.randn(3, width)), ("Q6_K", blocks_of("Q6_K", 17, width)),
             ("Q8_0", blocks_of("Q8_0", 2, width))]
    lin = QLinear.from_gguf(parts, None)
    x = torch.randn(4, width)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(4)])
    assert torch.equal(lin(x), alone)
    xd = quantized_input(x)
    ref = torch.cat([x.double() @ t.double().T if kind == "F32" else xd @ file_values(kind, t).T for kind, t in parts], dim=1)
    assert (lin(x).double() - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_large_repacked_weights_sit_in_memory_that_may_take_huge_pages():
    """kernels.empty_huge: 2 MB aligned (so that whole 2 MB pages can back it), writable, any dtype; small
    tensors are plain torch.empty. A repacked part of 3 MB is in such memory and computes as before."""
    import mmap

    t = kernels.empty_huge((3, 1 << 20), torch.float32)
    t.fill_(1.5)
    assert t.shape == (3, 1 << 20) and t.dtype == torch.float32 and t.is_contiguous()
    assert t.sum().item() == 1.5 * 3 * (1 << 20)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert t.data_ptr() % kernels.HUGE_PAGE == 0
    assert kernels.empty_huge((7,), torch.float32).shape == (7,)
    b = blocks_of("Q4_K", 1400, 8192, seed=5)  # 1400 rows of 4608 bytes: 6.2 MB
    parts = kernels.GGUFParts([(GGUF_KERNEL_TYPES["Q4_K"], b)])
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert parts.tensors[0].data_ptr() % kernels.HUGE_PAGE == 0
    x = torch.randn(2, 8192)
    ref = quantized_input(x) @ file_values("Q4_K", b).T
    y = kernels.gguf_linear(x, parts)
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_pieces_repack_into_the_rows_of_one_part():
    """gguf_repack takes a fused weight's pieces (say q, k, v straight from the file's mapping) and gives
    the bytes of repacking them concatenated; pieces of different widths are refused."""
    q, k = blocks_of("Q4_K", 6, 512, seed=1), blocks_of("Q4_K", 2, 512, seed=2)
    kind = GGUF_KERNEL_TYPES["Q4_K"]
    assert torch.equal(kernels.gguf_repack(kind, [q, k]), kernels.gguf_repack(kind, torch.cat([q, k])))
    assert not torch.equal(kernels.gguf_repack(kind, q), q)  # repacking moves bits: the check above can fail
    with pytest.raises(ValueError, match="different row widths"):
        kernels.gguf_repack(kind, [q, blocks_of("Q4_K", 2, 256)])


@pytest.mark.skipif(not kernels.has_vnni(), reason="this CPU has no AVX512-VNNI: only the AVX2 build runs here")
@pytest.mark.parametrize("kind", TYPES)
def test_the_vnni_build_gives_the_avx2_builds_bits(kind):
    width = 512 if kind in K_QUANTS else 352
    b = blocks_of(kind, 45, width, seed=3)
    parts = kernels.GGUFParts([(GGUF_KERNEL_TYPES[kind], b)])
    x, bias = torch.randn(6, width) * 4, torch.randn(45)
    avx2, vnni = kernels.gguf_build(False), kernels.gguf_build(True)
    assert avx2 is not None and vnni is not None and avx2 is not vnni
    for m in (1, 3, 4, 6):
        assert torch.equal(kernels.gguf_linear(x[:m], parts, bias, lib=vnni), kernels.gguf_linear(x[:m], parts, bias, lib=avx2))


def test_parts_of_several_types_stack_row_wise_with_the_bias():
    parts = [("Q4_K", blocks_of("Q4_K", 8, 256)), ("Q4_K", blocks_of("Q4_K", 3, 256, seed=2)),
             ("F32", torch.randn(5, 256)), ("Q6_K", blocks_of("Q6_K", 4, 256)), ("Q8_0", blocks_of("Q8_0", 2, 256))]
    bias = torch.randn(22)
    lin = QLinear.from_gguf(parts, bias)
    assert [kind for kind, _ in lin.parts] == ["Q4_K", "F32", "Q6_K", "Q8_0"]  # neighbours of one type joined
    assert (lin.out_features, lin.in_features) == (22, 256)
    x = torch.randn(3, 256)
    xd = quantized_input(x)
    ref = torch.cat([x.double() @ t.double().T if kind == "F32" else xd @ file_values(kind, t).T
                     for kind, t in parts], dim=1) + bias.double()
    assert (lin(x).double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    dense = torch.cat([t.double() if kind == "F32" else file_values(kind, t) for kind, t in parts])
    assert torch.equal(lin.dense_weight().double(), dense)
    assert lin.nbytes() == sum(t.numel() * t.element_size() for _, t in parts) + 4 * 22


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("width", [512, 352])  # whole groups of 256 values; one and 3 blocks past it (legacy)
def test_prefill_takes_the_files_values_in_dense_gemms(width, dtype, monkeypatch):
    """exact=False with many rows, on the dense paths: GEMMs over the file's values (gguf_to_dense: rounded
    to bf16, or exactly the gguf package's values in float32), not the kernel. In bf16, the bits of one GEMM
    over the whole weight; in float32 (whose GEMM's bits depend on the columns of a call), close to them."""
    monkeypatch.setenv("SPECDEC_PREFILL", dtype)
    kinds = [kind for kind in TYPES if width % 256 == 0 or kind not in K_QUANTS]
    parts = [(kind, blocks_of(kind, 6, width, seed=i)) for i, kind in enumerate(kinds)] + [("F32", torch.randn(3, width))]
    lin = QLinear.from_gguf(parts, torch.randn(6 * len(kinds) + 3))
    x = torch.randn(40, width)
    dense = torch.cat([t.double() if kind == "F32" else file_values(kind, t) for kind, t in parts])
    assert torch.equal(lin.prefill([x])[0], lin(x, exact=False))
    for kind, t in lin.parts:
        if kind != "F32":  # float32: bit for bit what the exact path's dense_weight reads back
            values = kernels.gguf_to_dense(GGUF_KERNEL_TYPES[kind], t, width, torch.float32)
            assert torch.equal(values, kernels.gguf_rows(GGUF_KERNEL_TYPES[kind], t, torch.arange(6), width, True))
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    expected = torch.nn.functional.linear(x.to(torch_dtype), dense.to(torch_dtype)).float() + lin.bias
    if dtype == "bf16":
        assert torch.equal(lin(x, exact=False), expected)
    else:
        assert (lin(x, exact=False) - expected).abs().max() <= 1e-6 * expected.abs().max()
    ref = x.double() @ dense.T + lin.bias.double()
    assert (lin(x, exact=False).double() - ref).abs().max() <= (0.02 if dtype == "bf16" else 1e-5) * ref.abs().max()
    assert torch.equal(lin(x[:31], exact=False), lin(x[:31]))  # fewer rows: the exact kernel


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("fmt", ["gguf", "w8a8", "int8"])
def test_prefill_converts_the_weight_a_few_rows_at_a_time(fmt, dtype, monkeypatch):
    """The dense path converts PREFILL_CHUNK_BYTES of weight values per GEMM (a gguf weight part by part). In
    bf16 that gives the bits of one GEMM over the whole converted weight; in float32 the same values but for
    the last bits (MKL's sgemm sums in another order for other column counts), the same bits at every call."""
    monkeypatch.setenv("SPECDEC_PREFILL", dtype)
    width = 512
    if fmt == "gguf":
        kinds = ["Q4_K", "Q6_K", "Q8_0", "Q4_1"]
        lin = QLinear.from_gguf([(kind, blocks_of(kind, 5, width, seed=i)) for i, kind in enumerate(kinds)]
                                + [("F32", torch.randn(3, width))], torch.randn(23))
    else:
        lin = QLinear(torch.randn(23, width), torch.randn(23), fmt)
    xs = [torch.randn(40, width), torch.randn(3, width), torch.randn(33, width)]
    whole = lin.prefill(xs)
    converted = []
    real = kernels.gguf_to_dense
    monkeypatch.setattr(kernels, "gguf_to_dense", lambda *a: converted.append(a[1].shape[0]) or real(*a))
    per_value = 2 if dtype == "bf16" else 4
    monkeypatch.setattr(linear_module, "PREFILL_CHUNK_BYTES", 4 * width * per_value)  # 4 rows a chunk
    chunked = lin.prefill(xs)
    if fmt == "gguf":  # 5 rows a part: a chunk of 4, then of 1
        assert converted == [4, 1] * 4
    for a, b in zip(whole, chunked):
        assert torch.equal(a, b) if dtype == "bf16" else (a - b).abs().max() <= 1e-6 * a.abs().max()
    assert all(torch.equal(a, b) for a, b in zip(chunked, lin.prefill(xs)))
    assert torch.equal(chunked[1], lin(xs[1]))  # under DENSE_MIN_ROWS: the exact kernel


def test_prefill_on_the_exact_path_is_the_kernel(monkeypatch):
    monkeypatch.setenv("SPECDEC_PREFILL", "exact")
    parts = [("Q4_K", blocks_of("Q4_K", 6, 512)), ("Q5_0", blocks_of("Q5_0", 4, 512))]
    lin = QLinear.from_gguf(parts, torch.randn(10))
    x = torch.randn(40, 512)
    assert torch.equal(lin(x, exact=False), lin(x))
    assert torch.equal(lin.prefill([x, x[:3]])[0], lin(x))


def test_the_prefill_path_follows_the_cpu_unless_asked(monkeypatch):
    monkeypatch.delenv("SPECDEC_PREFILL", raising=False)
    native = bool({"avx512_bf16", "amx_bf16"} & cpu.cpu_flags())
    assert kernels.prefill_path() == ("bf16" if native else "exact")
    monkeypatch.setenv("SPECDEC_PREFILL", "fp32")
    assert kernels.prefill_path() == "fp32"
    monkeypatch.setenv("SPECDEC_PREFILL", "float16")
    with pytest.raises(ValueError, match="bf16, fp32, exact"):
        kernels.prefill_path()


def test_bad_parts_are_refused():
    with pytest.raises(ValueError, match="blocks x 34"):
        QLinear.from_gguf([("Q8_0", torch.zeros(4, 33, dtype=torch.uint8))], None)
    with pytest.raises(ValueError, match="different widths"):
        QLinear.from_gguf([("Q8_0", blocks_of("Q8_0", 2, 64)), ("Q8_0", blocks_of("Q8_0", 2, 96))], None)
    with pytest.raises(ValueError, match="from_gguf"):
        QLinear(torch.zeros(4, 32), None, "gguf")
    with pytest.raises(ValueError, match="never converted or cached"):
        QLinear.from_tensors({}, "gguf", 4, 32)


def test_without_the_kernel_gguf_is_a_clear_error_and_not_the_default(monkeypatch, tmp_path):
    monkeypatch.setattr(kernels, "gguf", lambda: None)
    monkeypatch.setitem(build.reasons, "gguf", "no C compiler (cc) found; install gcc")
    with pytest.raises(ValueError, match="--weights gguf needs specdec's GGUF kernel.*no C compiler.*--weights int8"):
        QLinear.from_gguf([("Q8_0", blocks_of("Q8_0", 2, 64))], None)
    assert weights_format_for(make_gguf_model(tmp_path / "m.gguf")) == "int8"


@pytest.mark.parametrize("kind", TYPES)
def test_embedding_rows_are_the_files_values(kind):
    """gguf_values.c's row lookup gives exactly the gguf package's float32 values."""
    width = 512 if kind in K_QUANTS else 96
    b = blocks_of(kind, 50, width, seed=4)
    rows = BlockRows(kind, b)
    ids = torch.tensor([[3, 7], [49, 0]])
    assert rows.shape == (50, width)
    expected = torch.from_numpy(dequantize(b.numpy(), GGMLQuantizationType[kind])).reshape(50, width)
    assert torch.equal(rows[ids], expected[ids])
    with pytest.raises(IndexError, match="out of range"):
        rows[torch.tensor([50])]
    # a tied output head's blocks, in the kernel's layout, serve the lookups as well
    kernel_blocks = kernels.GGUFParts([(GGUF_KERNEL_TYPES[kind], b)]).tensors[0]
    assert not torch.equal(kernel_blocks, b) or width < 256  # interleaved: the bytes moved
    assert torch.equal(BlockRows(kind, kernel_blocks, interleaved=True)[ids], expected[ids])


# -- a tiny GGUF of mixed types ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed_gguf(tmp_path_factory):
    return make_gguf_model(tmp_path_factory.mktemp("gguf") / "mixed.gguf", tensor_type=MIXED, hidden=256,
                           intermediate=512, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def mixed(mixed_gguf):
    return load_model(str(mixed_gguf), progress=False)  # the default for a GGUF file: gguf


def test_a_gguf_file_loads_in_its_own_blocks_by_default(mixed, mixed_gguf, tmp_path):
    assert mixed.info.weights_dtype == "gguf"
    tr = mixed.transformer
    kinds = {kind for layer in tr.layers for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)
             for kind, _ in lin.parts} | {kind for kind, _ in tr.lm_head.parts} | {tr.embed.kind}
    assert kinds == set(MIXED)
    assert weights_format_for(make_hf_model(tmp_path / "hf")) == "int8"
    with pytest.raises(ValueError, match="--weights gguf keeps a GGUF file's own quantized blocks.*Hugging Face folder"):
        load_model(str(tmp_path / "hf"), "gguf", progress=False)


def test_gguf_computes_the_model_the_file_holds(mixed, mixed_gguf):
    """Against the file's weights dequantized to fp32: only the int8 activations differ."""
    ref = load_model(str(mixed_gguf), "fp32", progress=False).transformer
    tr = mixed.transformer

    def logits(t):
        cache = t.new_cache(64)
        return t.forward(torch.tensor([PROMPT + NEW]), cache, [cache.allocate()]).logits[0].double()

    a, b = logits(tr).log_softmax(-1), logits(ref).log_softmax(-1)
    kl = (b.exp() * (b - a)).sum(-1)
    assert kl.max() < 0.01 and (a.argmax(-1) == b.argmax(-1)).double().mean() >= 0.9
    assert not torch.equal(a, b)


def assert_k_tokens_equal_k_steps(tr, prompt: list[int], label: str = "") -> None:
    """After `prompt`, one exact forward of NEW gives bitwise the logits of len(NEW) one-token forwards."""
    cache = tr.new_cache(128)
    slot = cache.allocate()
    tr.forward(torch.tensor([prompt]), cache, [slot], exact=False, last_only=True)
    start = cache.lengths[slot]
    singles = [tr.forward(torch.tensor([[t]]), cache, [slot]).logits[0, 0] for t in NEW]
    cache.truncate(slot, start)
    multi = tr.forward(torch.tensor([NEW]), cache, [slot]).logits[0]
    for i, single in enumerate(singles):
        assert torch.equal(multi[i], single), f"{label} row {i}"


def test_multi_token_forward_equals_single_steps_bitwise(mixed):
    assert_k_tokens_equal_k_steps(mixed.transformer, PROMPT)


def test_greedy_speculative_output_equals_plain(mixed, mixed_gguf):
    """A draft model of the same file accepts everything, so verify runs 5-token batches throughout."""
    engine = Engine(mixed, max_len=128)
    plain = engine.generate(PROMPT, SamplingParams(), max_tokens=24)
    out = engine.generate(PROMPT, SamplingParams(), max_tokens=24,
                          spec=SpecConfig(drafters=("draft-simple",), draft_model=str(mixed_gguf), draft_n_max=4))
    assert out.token_ids == plain.token_ids
    assert out.stats.accepted >= 12
    assert engine.draft_models.load(str(mixed_gguf)).info.weights_dtype == "gguf"


def test_nothing_is_converted_or_cached(mixed_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    load_model(str(mixed_gguf), "gguf", progress=False)
    assert not list((tmp_path / "home").rglob("*.safetensors"))


# -- the real files ------------------------------------------------------------------------------------
CODE_PROMPT = "def is_prime(n):\n    \"\"\"Return True if n is a prime number.\"\"\"\n"
EDIT_PROMPT = ("Rename the variable `total` to `running_sum` and return the whole code.\n\n"
               "def accumulate(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
               "    return total\n\nAnswer:\ndef accumulate(values):\n")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b", "gemma3-270m"])
def test_real_file_multi_token_forward_equals_single_steps_bitwise(name):
    """Q4_1 + Q8_0 (smollm2), Q5_0 + Q8_0 + Q4_K + Q6_K (qwen 0.5B, gemma3), three architectures."""
    from helpers.models import real_model

    model = real_model(name, "gguf")
    assert_k_tokens_equal_k_steps(model.transformer, model.tokenizer.encode(CODE_PROMPT), name)


@pytest.mark.slow
def test_real_file_gguf_is_closer_to_the_file_than_int8(smollm_fp32, smollm):
    from helpers.models import real_model

    gguf_model = real_model("smollm2-135m", "gguf")
    ids = smollm.tokenizer.encode(EDIT_PROMPT * 3)[:160]

    def logprobs(model):
        tr = model.transformer
        cache = tr.new_cache(len(ids) + 1)
        return tr.forward(torch.tensor([ids]), cache, [cache.allocate()], exact=False).logits[0].double().log_softmax(-1)

    ref = logprobs(smollm_fp32)
    kl = {m.info.weights_dtype: (ref.exp() * (ref - logprobs(m))).sum(-1).mean().item() for m in (gguf_model, smollm)}
    assert kl["gguf"] < kl["int8"], kl  # both quantize activations or round them; only int8 changes weights


@pytest.mark.slow
def test_real_qwen_pair_greedy_equality_in_the_files_blocks():
    from helpers.models import real_model

    target = real_model("qwen2.5-coder-1.5b", "gguf")
    engine = Engine(target, max_len=512)
    ids = target.tokenizer.encode(CODE_PROMPT)
    plain = engine.generate(ids, SamplingParams(), max_tokens=32)
    spec = SpecConfig(drafters=("draft-simple",), draft_model="qwen2.5-coder-0.5b", draft_n_max=3)
    out = engine.generate(ids, SamplingParams(), max_tokens=32, spec=spec)
    assert out.token_ids == plain.token_ids
    assert out.stats.accepted > 8
    assert engine.draft_models.load("qwen2.5-coder-0.5b").info.weights_dtype == "gguf"
