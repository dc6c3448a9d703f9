"""Small C kernels for what torch does not do well on this CPU class, built on first use.

attend.c: the exact attention rows of a forward (each query row over exactly its own keys, in a
fixed order) for every sequence of a batch in one call, where torch needed ~8 small ops per row
and layer; row-invariant by construction like w8a8.c.

gguf.c: a matmul over a GGUF file's own quantized blocks (Q4_0 ... Q8_0, Q4_K, Q5_K, Q6_K), unpacked
inside the kernel, with activations quantized as w8a8.c's and integer dot products: the weights the
file holds, exactly (model/linear.py, the gguf format). Row-invariant the same way.

rows.c: RMS norm, the rotary embedding, the KV-cache write and the MLP's activation of a forward's rows,
one call each where torch took ~5-20 us a call (several small ops); row-wise, the rotation bitwise torch's,
the activation within a few ulps of the exact value (its own exp).

step.c: the decoder layers of an exact forward over gguf-format weights in one C call, through function
pointers into the three above (the same code, the same bits as the per-op path; see step.c).

w8a8.c: int8 weights x int8 activations (blocks of 32, llama.cpp's Q8_0 layout) with AVX2 integer
dot products. torch's weight-only int8 kernel (bf16 activations) reads ~9 GB/s for one row and
costs ~4x for four; this one reads ~13-15 GB/s per core and costs ~2x for four rows, which is what
makes verifying a draft cheap. Every output row is computed in one fixed order whatever the batch,
so a k-token forward stays bitwise k one-token forwards (model/transformer.py, Numerics).

The library is compiled with the system C compiler (`cc`, or $CC, which may hold arguments) into
$SPECDEC_HOME/kernels/ (where that cannot be written, a folder of this user's own in the temporary
directory), named by a digest of the source, flags and compiler, and loaded with ctypes: no torch
headers, about a second to build; a file there that does not load is rebuilt once. Where the CPU has
AVX512-VNNI (with VL), gguf.c and w8a8.c are built with it: their integer dot products then take one
vpdpbusd instead of maddubs + madd, the same integers exactly, so the same bits as the AVX2 build
(SPECDEC_KERNEL_AVX2=1 keeps the AVX2 build). attend.c is built with the same flags there and runs its
q . k and p . v in zmm registers, each sum the same chain of fmas, so again the AVX2 build's bits.
`w8a8()` returns None, with `why_unavailable()` saying why, on a machine without a compiler or without
AVX2/FMA.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

from specdec.model.config import MLP_ACTIVATIONS  # act_mul_rows' kinds: their indices

SOURCE = Path(__file__).with_name("w8a8.c")
ATTEND_SOURCE = Path(__file__).with_name("attend.c")
GGUF_SOURCE = Path(__file__).with_name("gguf.c")
ROWS_SOURCE = Path(__file__).with_name("rows.c")
STEP_SOURCE = Path(__file__).with_name("step.c")
ATTEND_MAX_HEAD_DIM = 512  # attend.c's MAX_HEAD_DIM
ATTEND_MAX_GROUP = 64  # attend.c's MAX_GROUP: query heads per kv head
FLAGS = ("-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
VNNI_FLAGS = ("-mavx512vnni", "-mavx512vl")  # 256-bit vpdpbusd (EVEX); AMD Zen 4, Intel Ice Lake and later
BLOCK = 32  # activations are quantized in blocks of this many values

_why: dict[str, str] = {}


def why_unavailable(kernel: str = "w8a8") -> str | None:
    """Why `w8a8()` (or `attend()`) returned None (None when it loaded)."""
    return _why.get(kernel)


@lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def env_flag(name: str) -> bool:
    """Whether an on/off environment variable is on: set to anything but "" or "0" (SPECDEC_NO_FUSED_STEP=0
    turned the kernel off as =1 did)."""
    return os.environ.get(name, "") not in ("", "0")


@lru_cache(maxsize=1)
def has_vnni() -> bool:
    """Whether the integer-dot kernels are built with AVX512-VNNI here (see the module docstring; the
    environment is read once, at the first kernel call)."""
    return {"avx512_vnni", "avx512vl"} <= _cpu_flags() and not env_flag("SPECDEC_KERNEL_AVX2")


PREFILL_PATHS = ("bf16", "fp32", "exact")


def prefill_path() -> str:
    """How a prefill's linears with many rows run (model/linear.py, QLinear.prefill): "bf16", a dense bf16
    GEMM over the weights' values, where the CPU multiplies bf16 natively (AVX512-BF16 or AMX); elsewhere
    "exact", the integer kernels that decoding runs (gguf.c, w8a8.c; torch's int8 format takes "fp32").
    torch's bf16 GEMM is emulated on AVX2 alone: on an AMD EPYC (Zen 3, 2 threads) it ran 15-20 GFLOP/s
    against float32's 65-97, and the gguf kernel prefilled qwen2.5-coder-0.5b and -1.5b 1.4x and 1.8x
    faster than a float32 GEMM (smollm2-135m 0.8x). SPECDEC_PREFILL=bf16, fp32 or exact overrides the
    choice (read at each call)."""
    asked = os.environ.get("SPECDEC_PREFILL")
    if asked:
        if asked not in PREFILL_PATHS:
            raise ValueError(f"SPECDEC_PREFILL must be one of {', '.join(PREFILL_PATHS)}, not {asked!r}")
        return asked
    return "bf16" if {"avx512_bf16", "amx_bf16"} & _cpu_flags() else "exact"


def kernel_isa() -> str:
    """What specdec's C kernels run on here, for reports: "avx512-vnni", "avx2", or "none (why)"."""
    if gguf() is None and w8a8() is None:
        return f"none ({why_unavailable('gguf') or why_unavailable()})"
    return "avx512-vnni" if has_vnni() else "avx2"


def _build(source: Path, extra: tuple[str, ...] = ()):
    """source compiled with FLAGS + extra (once per source and flags digest) and loaded, or None with
    the reason kept."""
    kernel = source.stem
    missing = {"avx2", "fma", "f16c"} - _cpu_flags()
    if missing:
        _why[kernel] = f"this CPU lacks {', '.join(sorted(missing))}"
        return None
    compiler = shlex.split(os.environ.get("CC") or "") or [shutil.which("cc") or shutil.which("gcc")]  # "ccache gcc"
    if compiler[0] is None:
        _why[kernel] = "no C compiler (cc) found; install gcc"
        return None
    flags = (*FLAGS, *extra)
    digest = hashlib.sha256(source.read_bytes() + " ".join((*compiler, *flags)).encode()).hexdigest()[:16]
    why = None
    for folder in _kernel_folders():
        lib, why, fatal = _build_in(folder / f"{kernel}-{digest}.so", [*compiler, *flags, str(source)])
        if lib is not None:
            return lib
        if fatal:  # the compiler's own error: another folder would not help
            break
    _why[kernel] = why
    return None


def _kernel_folders():
    """Where built kernels are kept: $SPECDEC_HOME/kernels, then (when that one cannot be written, a read-only
    home) a folder in the temporary directory that belongs to this user alone (another user's, or one others
    can write, could hold a library that is not ours)."""
    from specdec.model.catalogue import specdec_home

    yield specdec_home() / "kernels"
    own = Path(tempfile.gettempdir()) / f"specdec-kernels-{os.getuid()}"
    try:
        own.mkdir(mode=0o700, exist_ok=True)
        st = own.lstat()
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
        yield own


def _build_in(target: Path, command: list[str]):
    """(the library at target, None, False), built first where it is missing or does not load (an empty file
    a crash left: rebuilt once); else (None, why, whether the compiler itself failed)."""
    why = None
    for attempt in range(2):
        try:
            if attempt or not target.is_file():
                target.parent.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                    built = Path(tmp) / target.name
                    subprocess.run([*command, "-o", str(built), "-lm"], check=True, capture_output=True, text=True,
                                   timeout=120)
                    os.replace(built, target)  # atomic: a concurrent build leaves one whole file
            return ctypes.CDLL(str(target)), None, False
        except subprocess.CalledProcessError as exc:
            return None, f"building {Path(command[-1]).name} failed: {(exc.stderr or str(exc)).strip()[:300]}", True
        except (OSError, subprocess.SubprocessError) as exc:  # unwritable, unreadable, or a library that won't load
            why = f"building {Path(command[-1]).name} in {target.parent} failed: {str(exc).strip()[:300]}"
    return None, why, False


P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def _load(source: Path, signatures: dict[str, list], extra: tuple[str, ...] = (), off: str | None = None):
    """source built with FLAGS + extra (`_build`) and its functions' argument types set (each returns
    nothing), or None with the reason kept; the environment variable `off`, when on (env_flag), turns it off."""
    if off and env_flag(off):
        _why[source.stem] = f"{off} is set"
        return None
    lib = _build(source, extra)
    if lib is None:
        return None
    for name, argtypes in signatures.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, None
    return lib


def w8a8():
    """The loaded W8A8 library (ctypes.CDLL), or None."""
    return w8a8_build(has_vnni())


@lru_cache(maxsize=2)
def w8a8_build(vnni: bool):
    """w8a8.c built with AVX512-VNNI or with AVX2 alone (the same bits; tests compare them), or None."""
    return _load(SOURCE, {"quantize_rows": [P, I64, I64, P, P], "w8a8_mm": [P, P, I64, I64, P, P, P, P, I64, I32]},
                 VNNI_FLAGS if vnni else ())


def attend():
    """The loaded exact-attention library (ctypes.CDLL), or None (`why_unavailable("attend")`)."""
    return attend_build(has_vnni())


@lru_cache(maxsize=2)
def attend_build(wide: bool):
    """attend.c built with AVX-512 (its p . v in zmm registers; where the CPU has AVX512-VNNI, as gguf.c) or
    with AVX2 alone: the same bits (tests compare them), or None."""
    return _load(ATTEND_SOURCE, {"attend_rows": [P, P, P, P, P, P, P, I64, I64, I64, I64, I64, F32, I32, I32]},
                 VNNI_FLAGS if wide else (), off="SPECDEC_NO_ATTEND_KERNEL")


def gguf():
    """The loaded GGUF-blocks library (ctypes.CDLL), or None (`why_unavailable("gguf")`)."""
    return gguf_build(has_vnni())


@lru_cache(maxsize=2)
def gguf_build(vnni: bool):
    """gguf.c built with AVX512-VNNI or with AVX2 alone (the same bits; tests compare them), or None."""
    return _load(GGUF_SOURCE, {"quantize_rows_sums": [P, I64, I64, P, P, P],
                               "gguf_linear": [P, I64, I64, I32, P, P, P, P, P, P, I32],
                               "gguf_to_dense": [I32, P, I64, I64, I64, P, I32, I32],
                               "gguf_repack": [I32, P, I64, I64, P, I32],
                               "gguf_rows": [I32, P, P, I64, I64, I64, I32, P]}, VNNI_FLAGS if vnni else ())


@lru_cache(maxsize=1)
def rows():
    """The loaded row-ops library (ctypes.CDLL), or None (`why_unavailable("rows")`)."""
    lib = _load(ROWS_SOURCE, {"rms_norm_rows": [P, P, I64, I64, F32, P], "rope_rows": [P, P, P, I64, I64, I64, P],
                              "store_rows": [P, I64, I64, I64, P, I64, I64, I64, I32],
                              "act_mul_rows": [P, P, I64, I64, I64, I64, I32, P]}, off="SPECDEC_NO_ROWS_KERNEL")
    if lib is not None:
        lib.store_rows.restype = I64  # how many values were too large for a float16 cache
    return lib


@lru_cache(maxsize=1)
def step():
    """The loaded layer driver (step.c) where gguf.c, attend.c and rows.c loaded too, or None
    (`why_unavailable("step")`; SPECDEC_NO_FUSED_STEP=1 turns it off)."""
    missing = [name for name, lib in (("gguf", gguf()), ("attend", attend()), ("rows", rows())) if lib is None]
    if missing:
        _why["step"] = f"it drives {', '.join(missing)}, which did not load ({why_unavailable(missing[0])})"
        return None
    return _load(STEP_SOURCE, {"step_layers": [P, P, I64, I64, P]}, off="SPECDEC_NO_FUSED_STEP")


class StepKernels(ctypes.Structure):
    """step.c's Kernels: the entry points it calls, in the libraries the per-op path calls."""

    _fields_ = [("rms_norm", P), ("rope", P), ("store", P), ("attend", P), ("act", P), ("linear", P)]


def step_kernels() -> StepKernels:
    def address(fn) -> int:
        return ctypes.cast(fn, ctypes.c_void_p).value

    return StepKernels(address(rows().rms_norm_rows), address(rows().rope_rows), address(rows().store_rows),
                       address(attend().attend_rows), address(rows().act_mul_rows), address(gguf().gguf_linear))


class StepLinear(ctypes.Structure):
    """step.c's Linear: a GGUFParts' arrays, its input width and bias."""

    _fields_ = [("nparts", I64), ("in_", I64), ("types", P), ("weights", P), ("rows", P), ("row_bytes", P),
                ("bias", P)]

    @classmethod
    def of(cls, parts: "GGUFParts", in_features: int, bias=None) -> "StepLinear":
        return cls(parts.count, in_features, ctypes.addressof(parts.types), ctypes.addressof(parts.addresses),
                   ctypes.addressof(parts.rows), ctypes.addressof(parts.row_bytes),
                   None if bias is None else bias.data_ptr())


class StepLayer(ctypes.Structure):
    """step.c's Layer: four linears, six norm weights (None where absent), and whether it is a local layer."""

    _fields_ = [("qkv", StepLinear), ("o", StepLinear), ("gate_up", StepLinear), ("down", StepLinear),
                ("attn_norm", P), ("mlp_norm", P), ("q_norm", P), ("k_norm", P), ("attn_out_norm", P),
                ("mlp_out_norm", P), ("local", I64)]


class StepForward(ctypes.Structure):
    """step.c's Forward: one exact forward's sizes, inputs and scratch (pointers into tensors the caller holds)."""

    _fields_ = [("M", I64), ("H", I64), ("nh", I64), ("nkv", I64), ("hd", I64), ("I", I64), ("act", I64),
                ("threads", I64), ("eps", F32), ("scale", F32), ("cos", P * 2), ("sin", P * 2), ("slot", P * 2),
                ("off", P * 2), ("keys", P * 2), ("nseg", I64), ("seg_slot", P), ("seg_start", P), ("seg_row", P),
                ("kcache", P), ("vcache", P), ("layer_values", I64), ("slots", I64), ("max_len", I64), ("half", I64),
                ("x", P), ("gate_up", P), ("act_out", P), ("h", P), ("qkv", P), ("qk", P), ("rot", P), ("part", P),
                ("attn", P), ("out", P), ("overflow", I64)]


def rms_norm_rows(x, weight, eps: float):
    """x (..., n) float32, weight (n,) float32 or None -> rms_norm(x) * weight (rows.c)."""
    import torch

    x = x.contiguous()
    weight = None if weight is None else weight.contiguous()
    y = torch.empty_like(x)
    n = x.shape[-1]
    rows().rms_norm_rows(x.data_ptr(), None if weight is None else weight.data_ptr(), x.numel() // n, n, eps,
                         y.data_ptr())
    return y


def rope(x, cos, sin):
    """x (N, heads, hd) float32, cos, sin (N, 1, hd) float32 -> x rotated (rows.c)."""
    import torch

    x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
    y = torch.empty_like(x)
    N, heads, hd = x.shape
    rows().rope_rows(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), N, heads, hd, y.data_ptr())
    return y


def act_mul(gate, up, act: str):
    """act(gate) * up for gate, up (N, I) float32 (rows.c; act "silu" or "gelu_tanh"). Rows may sit at any
    stride (the two halves of one gate_up output): only the last dim must be dense."""
    import torch

    if act not in MLP_ACTIVATIONS:
        raise ValueError(f"unknown MLP activation {act!r}; the kernel computes {', '.join(MLP_ACTIVATIONS)}")
    if gate.dim() != 2 or gate.stride(-1) != 1 or up.stride(-1) != 1:
        gate, up = gate.reshape(-1, gate.shape[-1]).contiguous(), up.reshape(-1, up.shape[-1]).contiguous()
    out = torch.empty(gate.shape, dtype=torch.float32)
    rows().act_mul_rows(gate.data_ptr(), up.data_ptr(), gate.shape[0], gate.shape[1], gate.stride(0), up.stride(0),
                        MLP_ACTIVATIONS.index(act), out.data_ptr())
    return out


def store_rows(new, layer, slot: int, start: int) -> int:
    """new (T, nkv, hd) float32 -> layer[slot, :, start:start + T] (layer: (slots, nkv, max_len, hd) float32 or
    float16, contiguous), as layer[slot, :, start:start + T] = new.transpose(0, 1) (rows.c). Returns how many
    values a float16 layer could not hold (|x| >= 65520: stored as inf); 0 for float32."""
    new = new.contiguous()
    T, nkv, hd = new.shape
    return rows().store_rows(new.data_ptr(), T, nkv, hd, layer.data_ptr(), slot, layer.shape[2], start,
                             _half(layer))


def _half(cache_layer) -> int:
    """1 for a float16 cache, 0 for float32: the kernels' `half` argument (ValueError for any other dtype)."""
    import torch

    if cache_layer.dtype not in (torch.float32, torch.float16):
        raise ValueError(f"the KV cache kernels take float32 or float16, not {cache_layer.dtype}")
    return int(cache_layer.dtype == torch.float16)


def gguf_quantize(x):
    """x (M, K) float32, K % 32 == 0 -> (xq int8 (M, K), xs (M, K/32), xsum (M, K/32)): the activations as
    gguf.c quantizes them, int8 in blocks of 32 with a float scale each, and xs * sum(xq) per block."""
    import torch

    x = x.contiguous()
    M, K = x.shape
    xq = torch.empty(M, K, dtype=torch.int8)
    xs = torch.empty(M, K // BLOCK, dtype=torch.float32)
    xsum = torch.empty(M, K // BLOCK, dtype=torch.float32)
    gguf().quantize_rows_sums(x.data_ptr(), M, K, xq.data_ptr(), xs.data_ptr(), xsum.data_ptr())
    return xq, xs, xsum


HUGE_PAGE = 2 << 20  # bytes of a transparent huge page (x86-64 Linux)


def empty_huge(shape, dtype):
    """torch.empty(shape, dtype=dtype) in memory asked to be backed by 2 MB pages (Linux transparent huge
    pages, madvise), for the weights the kernels stream at every step. In 4 KB pages each 4 KB of weights
    costs a TLB miss, and the hardware prefetchers stop at every page boundary; where transparent huge pages
    are `madvise`-only (as on the machines here) torch's allocations get none. qwen2.5-coder-1.5b gguf, the
    same process with its weights in one or the other: forward(1) 0.93-0.95x the time after 100 and 3000
    tokens of context, forward(4) 0.97-1.00x. torch.empty where the platform cannot ask or below 2 MB."""
    import math
    import mmap

    import torch

    size = math.prod(shape) * dtype.itemsize
    if size < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_PRIVATE"):
        return torch.empty(shape, dtype=dtype)
    # private: shared anonymous memory is shmem, which THP leaves alone unless shmem_enabled says otherwise
    memory = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        memory.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages: 4 KB pages, as torch's
        pass
    raw = torch.frombuffer(memory, dtype=torch.uint8)  # keeps `memory` alive as long as any view of it
    start = -raw.data_ptr() % HUGE_PAGE
    return raw[start : start + size].view(dtype).view(shape)


def gguf_repack(type_id: int, blocks):
    """(rows, row_bytes) uint8 of a GGUF type, or a list of such pieces stacked row-wise -> a new tensor in
    gguf.c's layout: each row's groups of 256 values (a K-quant super-block, 8 blocks of the others) with
    their bits moved so that one vector holds 4 values of each of 8 sub-blocks of 32 (see gguf.c): the same
    bytes per group, the same values and scales; the rest of a row as it was. Rows are repacked one by one,
    so the pieces go straight from (say) a mapped file into their rows of the result."""
    import torch

    pieces = [blocks] if isinstance(blocks, torch.Tensor) else list(blocks)
    if len({p.shape[1] for p in pieces}) != 1:
        raise ValueError(f"pieces of different row widths {[tuple(p.shape) for p in pieces]} cannot be stacked")
    out = empty_huge((sum(p.shape[0] for p in pieces), pieces[0].shape[1]), torch.uint8)
    at = out.data_ptr()
    for piece in pieces:
        piece = piece.contiguous()
        gguf().gguf_repack(type_id, piece.data_ptr(), piece.shape[0], piece.shape[1], at, torch.get_num_threads())
        at += piece.numel()
    return out


class GGUFParts:
    """The parts of one gguf-format weight as gguf_linear takes them, from [(ggml type id, tensor)]: tensor
    (rows, row_bytes) uint8 of the file's blocks (or a list of such, stacked into one part) or (rows, K)
    float32 for type 0 (F32). The blocks are held in gguf.c's interleaved layout (gguf_repack), F32 parts as
    given; `parts` lists them."""

    def __init__(self, parts):
        n = len(parts)
        self.parts = [(kind, gguf_repack(kind, t) if kind else t) for kind, t in parts]
        self.tensors = [t for _, t in self.parts]
        self.count = n
        self.types = (ctypes.c_int32 * n)(*[kind for kind, _ in parts])
        self.addresses = (ctypes.c_uint64 * n)(*[t.data_ptr() for t in self.tensors])
        self.rows = (ctypes.c_int64 * n)(*[t.shape[0] for t in self.tensors])
        self.row_bytes = (ctypes.c_int64 * n)(*[t.shape[1] * t.element_size() for t in self.tensors])
        self.out_features = sum(t.shape[0] for t in self.tensors)


def gguf_linear(x, parts: GGUFParts, bias=None, lib=None):
    """x (M, K) float32 @ W.T (+ bias) -> (M, N) float32, W the parts stacked row-wise (gguf.c's
    gguf_linear: x quantized once, one parallel pass over every output column). Needs `gguf()`;
    lib: another build of gguf.c (`gguf_build`)."""
    import torch

    x = x.contiguous()
    M, K = x.shape
    y = torch.empty(M, parts.out_features)
    (lib or gguf()).gguf_linear(x.data_ptr(), M, K, parts.count, parts.types, parts.addresses, parts.rows, parts.row_bytes,
                       None if bias is None else bias.data_ptr(), y.data_ptr(), torch.get_num_threads())
    return y


def gguf_rows(type_id: int, blocks, ids, K: int, interleaved: bool = False):
    """Rows ids (n,) of (V, row_bytes) uint8 blocks of a GGUF type with K values a row, in the file's layout
    or in gguf.c's (a GGUFParts part: interleaved) -> (n, K) float32, exactly the gguf package's dequantized
    values (gguf.c)."""
    import torch

    ids = torch.as_tensor(ids).to(torch.int64).contiguous()
    out = torch.empty(ids.shape[0], K)
    gguf().gguf_rows(type_id, blocks.data_ptr(), ids.data_ptr(), ids.shape[0], K, blocks.shape[1], int(interleaved),
                     out.data_ptr())
    return out


def gguf_to_dense(type_id: int, blocks, K: int, dtype):
    """(N, row_bytes) uint8 of a GGUF type in gguf.c's layout (a GGUFParts part) -> (N, K) of dtype: its values
    rounded to bf16, or as float32 exactly the gguf package's values (gguf.c)."""
    import torch

    N = blocks.shape[0]
    out = torch.empty(N, K, dtype=dtype)
    gguf().gguf_to_dense(type_id, blocks.data_ptr(), N, K, blocks.shape[1], out.data_ptr(), int(dtype == torch.bfloat16),
                         torch.get_num_threads())
    return out


def w8a8_matmul(x, weight, scale, bias=None, lib=None):
    """y = (x quantized to int8 per block of 32) @ weight.T * scale (+ bias).

    x: (M, K) float32, K % 32 == 0; weight: (N, K) int8; scale: (N,) float32; bias: (N,) or None.
    Returns (M, N) float32. Needs `w8a8()` to have loaded; lib: another build of w8a8.c (`w8a8_build`).
    """
    import torch

    lib = lib or w8a8()
    x = x.contiguous()
    M, K = x.shape
    N = weight.shape[0]
    xq = torch.empty(M, K, dtype=torch.int8)
    xs = torch.empty(M, K // BLOCK, dtype=torch.float32)
    y = torch.empty(M, N, dtype=torch.float32)
    lib.quantize_rows(x.data_ptr(), M, K, xq.data_ptr(), xs.data_ptr())
    lib.w8a8_mm(xq.data_ptr(), xs.data_ptr(), M, K, weight.data_ptr(), scale.data_ptr(),
                None if bias is None else bias.data_ptr(), y.data_ptr(), N, torch.get_num_threads())
    return y


def attend_rows(q, k, v, slot, offsets, keys, scale: float, lib=None):
    """Each query row over exactly its own keys of its own cache slot (see attend.c).

    q: (n, nh, hd) float32; k, v: one layer of the cache, (slots, nkv, max_len, hd) float32 or float16,
    contiguous; slot: (n,) int64; offsets: (n + 1,) int64 into keys; keys: key offsets in the
    slot, row r's at keys[offsets[r]:offsets[r + 1]], in reduction order. Returns (n, nh, hd).
    lib: a build of attend.c (`attend_build`); default `attend()`, which must have loaded.
    """
    import torch

    q = q.contiguous()
    n, nh, hd = q.shape
    slots, nkv, max_len, _ = k.shape
    if nh % nkv:
        raise ValueError(f"{nh} query heads do not divide among {nkv} kv heads")
    if v.dtype != k.dtype:
        raise ValueError(f"keys ({k.dtype}) and values ({v.dtype}) must share a dtype")
    out = torch.empty_like(q)
    (lib or attend()).attend_rows(q.data_ptr(), k.data_ptr(), v.data_ptr(), slot.data_ptr(), offsets.data_ptr(),
                                  keys.data_ptr(), out.data_ptr(), n, nh, nkv, hd, max_len, scale, _half(k),
                                  torch.get_num_threads())
    return out
