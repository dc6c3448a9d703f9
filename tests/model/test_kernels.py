"""The W8A8 C kernel (model/kernels): exact activation quantization, the math it computes, and the
row invariance every speculative path relies on (a row's result never depends on the batch)."""

from __future__ import annotations

import pytest
import torch

from specdec.model import kernels
from specdec.model.kernels import build, libraries
from specdec.model.linear import QLinear

needs_kernel = pytest.mark.skipif(kernels.w8a8() is None, reason=f"W8A8 kernel unavailable: "
                                                                 f"{kernels.why_unavailable()}")


def reference(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The same math in float64: x quantized per block of 32 (round half to even), integer dots."""
    M, K = x.shape
    blocks = x.reshape(M, K // 32, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127.0
    xq = torch.where(d > 0, torch.round(blocks / torch.where(d > 0, d, 1.0)), 0.0)
    dots = torch.einsum("mbk,nbk->mnb", xq.double(), w.reshape(-1, K // 32, 32).double())  # (M, N, blocks)
    return (dots * d[..., 0].double()[:, None, :]).sum(-1) * scale.double()


@needs_kernel
def test_quantization_is_exactly_blocks_of_32():
    x = torch.randn(3, 96) * torch.tensor([0.01, 1.0, 100.0])[:, None]
    x[1, 32:64] = 0.0  # an all-zero block has scale 0 and codes 0
    xq, xs = torch.empty(3, 96, dtype=torch.int8), torch.empty(3, 3)
    kernels.w8a8().quantize_rows(x.data_ptr(), 3, 96, xq.data_ptr(), xs.data_ptr())
    blocks = x.reshape(3, 3, 32)
    d = blocks.abs().amax(-1) / 127.0
    assert torch.equal(xs, d)
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))  # the kernel multiplies by 1/d, in float32
    assert torch.equal(xq, torch.round(blocks * inv[..., None]).reshape(3, 96).to(torch.int8))


@needs_kernel
@pytest.mark.parametrize("n, k", [(64, 96), (200, 576), (33, 1024)])
def test_matmul_computes_the_w8a8_math(n, k):
    g = torch.Generator().manual_seed(n)
    x, w = torch.randn(5, k, generator=g), torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale, bias = torch.rand(n, generator=g) / 100, torch.randn(n, generator=g)
    y = kernels.w8a8_matmul(x, w, scale)
    ref = reference(x, w, scale)
    assert (y.double() - ref).abs().max() <= 1e-5 * ref.abs().max()
    assert torch.equal(kernels.w8a8_matmul(x, w, scale, bias), y + bias)  # bias added after the scale, no fma


@needs_kernel
def test_every_row_is_the_same_alone_in_any_batch_and_thread_count():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(16, 576, generator=g), torch.randint(-127, 128, (300, 576), generator=g, dtype=torch.int8)
    scale = torch.rand(300, generator=g)
    alone = torch.cat([kernels.w8a8_matmul(x[i : i + 1], w, scale) for i in range(16)])
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for m in (2, 3, 5, 16):  # tiles of 4 rows: full and ragged
                assert torch.equal(kernels.w8a8_matmul(x[:m], w, scale), alone[:m])
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.skipif(not kernels.has_vnni(), reason="this CPU has no AVX512-VNNI: only the AVX2 build runs here")
def test_the_vnni_build_gives_the_avx2_builds_bits():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(6, 576, generator=g) * 3, torch.randint(-127, 128, (70, 576), generator=g, dtype=torch.int8)
    scale, bias = torch.rand(70, generator=g), torch.randn(70, generator=g)
    avx2, vnni = kernels.w8a8_build(False), kernels.w8a8_build(True)
    assert avx2 is not None and vnni is not None and avx2 is not vnni
    for m in (1, 4, 6):
        assert torch.equal(kernels.w8a8_matmul(x[:m], w, scale, bias, lib=vnni),
                           kernels.w8a8_matmul(x[:m], w, scale, bias, lib=avx2))


@pytest.mark.parametrize("build, kernel, wide_only", [(kernels.w8a8_build, "w8a8", r"\bvpdpbusd\b"),
                                                     (kernels.gguf_build, "gguf", r"\bvpdpbusd\b"),
                                                     (kernels.attend_build, "attend", r"\bvfmadd\w+ps\b.*%zmm")],
                         ids=["w8a8", "gguf", "attend"])
def test_the_vnni_builds_hold_their_instructions_on_any_cpu(build, kernel, wide_only):
    """The VNNI builds' bits are compared with the AVX2 builds' only where the CPU runs them (the tests that
    skip on AVX2 alone); every machine with a compiler still builds them, so a compiler error or a lost #if in
    their code shows there: vpdpbusd in the VNNI build, never in the AVX2 build; attend.c's fmas on zmm
    registers, which only its AVX-512 intrinsics make (-ffp-contract=off: the compiler fuses no mul and add)."""
    import re
    import shutil
    import subprocess

    avx2, wide = build(False), build(True)
    if avx2 is None or wide is None:
        pytest.skip(f"{kernel} kernel unavailable: {kernels.why_unavailable(kernel)}")
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump (binutils) here to read the builds' instructions")

    def code(lib) -> str:
        return subprocess.run([objdump, "-d", "--no-show-raw-insn", lib._name], capture_output=True, text=True,
                              check=True, timeout=120).stdout

    assert re.search(wide_only, code(wide)) and not re.search(wide_only, code(avx2))


def test_without_the_kernel_w8a8_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(kernels, "w8a8", lambda: None)
    monkeypatch.setattr(kernels, "why_unavailable", lambda: "no C compiler (cc) found; install gcc")
    with pytest.raises(ValueError, match="--weights w8a8 needs specdec's W8A8 kernel.*no C compiler.*--weights int8"):
        QLinear(torch.randn(8, 64), None, "w8a8")
    assert QLinear(torch.randn(8, 48), None, "w8a8").fmt == "int8"  # rows not in blocks of 32: int8


# -- building and finding the libraries -----------------------------------------------------------------
@pytest.fixture
def private_build(tmp_path, monkeypatch):
    """A private SPECDEC_HOME and temporary directory, so that each build here compiles afresh."""
    import tempfile

    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.delenv("CC", raising=False)
    return tmp_path


def _built(home):
    return sorted((home / "kernels").glob("w8a8-*.so"))


@pytest.mark.skipif(kernels.w8a8() is None, reason="no compiler or no AVX2 here")
def test_a_library_that_does_not_load_is_rebuilt(private_build):
    """An empty or cut .so (a crash after the rename) was loaded as is: OSError 'file too short' at every start."""
    import os
    import subprocess
    import sys

    # each build in a process of its own: this one must not map the library (cutting a file a process has
    # mapped kills it with SIGBUS when it touches the pages), and its dlopen would hand back what it loaded
    code = "from specdec.model.kernels import build; print(build.library('w8a8') is not None)"
    env = {**os.environ, "TMPDIR": str(private_build / "tmp")}

    def build_elsewhere():
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert run.stdout.strip() == "True", run.stderr[-2000:]

    build_elsewhere()
    [lib] = _built(private_build / "home")
    size = lib.stat().st_size
    lib.write_bytes(b"")
    build_elsewhere()
    assert lib.stat().st_size == size


@pytest.mark.skipif(kernels.w8a8() is None, reason="no compiler or no AVX2 here")
def test_an_unwritable_home_builds_in_a_private_temporary_folder(private_build, monkeypatch):
    """A read-only SPECDEC_HOME turned the GGUF kernel off, and with it the default format, silently."""
    import os

    blocker = private_build / "file"
    blocker.write_text("a file where the home's parent folder should be")
    monkeypatch.setenv("SPECDEC_HOME", str(blocker / "home"))
    assert build.library("w8a8") is not None
    own = private_build / "tmp" / f"specdec-kernels-{os.getuid()}"
    assert len(list(own.glob("w8a8-*.so"))) == 1 and own.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(kernels.w8a8() is None, reason="no compiler or no AVX2 here")
def test_cc_may_carry_arguments(private_build, monkeypatch):
    """CC="ccache gcc" or "gcc -pipe" was run as one program name: no build, int8 instead of gguf."""
    import shutil

    monkeypatch.setenv("CC", f"{shutil.which('cc') or shutil.which('gcc')} -pipe")
    assert build.library("w8a8") is not None
    monkeypatch.setenv("CC", "no-such-compiler-here -pipe")
    assert build.library("w8a8") is None
    assert "no-such-compiler-here" in kernels.why_unavailable("w8a8")


def test_every_c_file_is_in_one_library_with_the_headers_it_includes():
    """A library is rebuilt when its digest changes, and its digest covers the files build.SOURCES lists: a
    header a source includes must be listed with it, or an edit to the header would leave the old library."""
    import re

    listed = [name for files in build.SOURCES.values() for name in files if name.endswith(".c")]
    assert sorted(listed) == sorted(path.name for path in build.FOLDER.glob("*.c"))
    for files in build.SOURCES.values():
        for name in files:
            included = re.findall(r'^#include "([^"]+)"', (build.FOLDER / name).read_text(), re.MULTILINE)
            assert set(included) <= set(files), f"{name} includes {included}, not all in {files}"


@pytest.mark.parametrize("value, on", [("", False), ("0", False), ("1", True), ("yes", True)])
def test_switches_read_0_as_off(monkeypatch, value, on):
    """SPECDEC_NO_FUSED_STEP=0 turned the kernel off as =1 did (SPECDEC_NO_WEIGHT_CACHE=0 meant on)."""
    monkeypatch.setenv("SPECDEC_NO_ROWS_KERNEL", value)
    assert kernels.env_flag("SPECDEC_NO_ROWS_KERNEL") is on
    if kernels.w8a8() is not None:
        lib = libraries.load("rows", {}, off="SPECDEC_NO_ROWS_KERNEL")
        assert (lib is None) is on


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "int8", "int4", "w8a8"])
def test_an_exact_row_is_the_same_in_any_batch_at_real_widths(fmt):
    """Greedy speculation and batching rest on it: a verify of k rows gives each row's one-row bits. bf16 ran
    all rows in one GEMM, whose kernel changes with the row count past 1152 inputs (AVX512-BF16 EPYC:
    at 4096 from 3 rows), so batched and speculative answers differed from plain ones (tiny models are 64
    wide: no test saw it)."""
    if fmt == "w8a8" and kernels.w8a8() is None:
        pytest.skip("no W8A8 kernel here")
    g = torch.Generator().manual_seed(2)
    linear = QLinear(torch.randn(256, 4096, generator=g) * 0.02, torch.randn(256, generator=g), fmt)
    x = torch.randn(40, 4096, generator=g)
    alone = torch.cat([linear(x[i : i + 1]) for i in range(40)])
    threads = torch.get_num_threads()
    try:
        for t in (1, 2):
            torch.set_num_threads(t)
            for m in (2, 3, 8, 29, 40):
                assert torch.equal(linear(x[:m]), alone[:m]), (t, m)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("fmt, kind", [("gguf", "Q4_1"), ("gguf", "Q8_0"), ("gguf", "Q4_K"), ("w8a8", None)])
def test_a_nan_activation_gives_nan_as_a_float_matmul_does(fmt, kind, tmp_path):
    """The activation quantizer's max dropped a NaN and quantized it to -128: finite garbage (4e6 with
    Q4_1's min term) where fp32 gives NaN, so a broken forward went unnoticed (check_logits looks for NaN).
    Only the row holding it turns NaN; the others keep their bits."""
    from helpers.tiny import make_gguf_model
    from specdec.model.load import load_model

    if fmt == "w8a8":
        if kernels.w8a8() is None:
            pytest.skip("no W8A8 kernel here")
        linear = QLinear(torch.randn(64, 256) * 0.05, None, "w8a8")
    else:
        if kernels.gguf() is None:
            pytest.skip("no GGUF kernel here")
        path = make_gguf_model(tmp_path / "m.gguf", tensor_type=kind, hidden=256, intermediate=512)
        linear = load_model(str(path), "gguf", progress=False, weight_cache=False).transformer.layers[0].down
    x = torch.randn(3, linear.in_features)
    clean = linear(x)
    x[1, 5] = float("nan")
    out = linear(x)
    assert torch.isnan(out[1]).all()
    assert torch.equal(out[[0, 2]], clean[[0, 2]])


@pytest.mark.parametrize("fmt", ["fp32", "int8", "gguf"])
def test_an_input_of_the_wrong_width_is_refused(fmt, tmp_path):
    """The gguf kernel took K from x: a wider x read past each weight row and returned numbers."""
    from helpers.tiny import make_gguf_model
    from specdec.model.load import load_model

    if fmt == "gguf" and kernels.gguf() is None:
        pytest.skip("no GGUF kernel here")
    path = make_gguf_model(tmp_path / "m.gguf", tensor_type="Q8_0")
    linear = load_model(str(path), fmt, progress=False, weight_cache=False).transformer.layers[0].down
    for width in (linear.in_features * 2, linear.in_features - 32):
        with pytest.raises(ValueError, match=f"an input {width} wide for a linear of {linear.in_features} inputs"):
            linear(torch.randn(2, width))
