"""The C kernels' libraries, loaded once each with the ctypes signatures of their entry points.

Each accessor returns the loaded library (ctypes.CDLL) or None, with `why_unavailable(<name>)` saying why: no
compiler, a CPU without AVX2/FMA/F16C, or the environment switch that turns it off.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

from specdec.model.kernels.build import VNNI_FLAGS, library, reasons, why_unavailable
from specdec.model.kernels.cpu import env_flag, has_vnni

ATTEND_MAX_HEAD_DIM = 512  # attend.c's MAX_HEAD_DIM
ATTEND_MAX_GROUP = 64  # attend.c's MAX_GROUP: query heads per kv head

P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float


def load(kernel: str, signatures: dict[str, list], extra: tuple[str, ...] = (), off: str | None = None):
    """The library `kernel` built with FLAGS + extra (build.library) and its functions' argument types set
    (each returns nothing), or None with the reason kept; the environment variable `off`, when on (env_flag),
    turns it off."""
    if off and env_flag(off):
        reasons[kernel] = f"{off} is set"
        return None
    lib = library(kernel, extra)
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
    return load("w8a8", {"quantize_rows": [P, I64, I64, P, P], "w8a8_mm": [P, P, I64, I64, P, P, P, P, I64, I32]},
                VNNI_FLAGS if vnni else ())


def attend():
    """The loaded exact-attention library (ctypes.CDLL), or None (`why_unavailable("attend")`)."""
    return attend_build(has_vnni())


@lru_cache(maxsize=2)
def attend_build(wide: bool):
    """attend.c built with AVX-512 (its p . v in zmm registers; where the CPU has AVX512-VNNI, as gguf) or
    with AVX2 alone: the same bits (tests compare them), or None."""
    return load("attend", {"attend_rows": [P, P, P, P, P, P, P, I64, I64, I64, I64, I64, F32, I32, I32]},
                VNNI_FLAGS if wide else (), off="SPECDEC_NO_ATTEND_KERNEL")


def gguf():
    """The loaded GGUF-blocks library (ctypes.CDLL), or None (`why_unavailable("gguf")`)."""
    return gguf_build(has_vnni())


@lru_cache(maxsize=2)
def gguf_build(vnni: bool):
    """The gguf library (gguf_*.c) built with AVX512-VNNI or with AVX2 alone (the same bits; tests compare them), or None."""
    return load("gguf", {"quantize_rows_sums": [P, I64, I64, P, P, P],
                         "gguf_linear": [P, I64, I64, I32, P, P, P, P, P, P, I32],
                         "gguf_to_dense": [I32, P, I64, I64, I64, P, I32, I32],
                         "gguf_repack": [I32, P, I64, I64, P, I32],
                         "gguf_rows": [I32, P, P, I64, I64, I64, I32, P]}, VNNI_FLAGS if vnni else ())


@lru_cache(maxsize=1)
def rows():
    """The loaded row-ops library (ctypes.CDLL), or None (`why_unavailable("rows")`)."""
    lib = load("rows", {"rms_norm_rows": [P, P, I64, I64, F32, P], "rope_rows": [P, P, P, I64, I64, I64, P],
                        "store_rows": [P, I64, I64, I64, P, I64, I64, I64, I32],
                        "act_mul_rows": [P, P, I64, I64, I64, I64, I32, P]}, off="SPECDEC_NO_ROWS_KERNEL")
    if lib is not None:
        lib.store_rows.restype = I64  # how many values were too large for a float16 cache
    return lib


@lru_cache(maxsize=1)
def step():
    """The loaded layer driver (step.c) where gguf, attend and rows loaded too, or None
    (`why_unavailable("step")`; SPECDEC_NO_FUSED_STEP=1 turns it off)."""
    missing = [name for name, lib in (("gguf", gguf()), ("attend", attend()), ("rows", rows())) if lib is None]
    if missing:
        reasons["step"] = f"it drives {', '.join(missing)}, which did not load ({why_unavailable(missing[0])})"
        return None
    return load("step", {"step_layers": [P, P, I64, I64, P]}, off="SPECDEC_NO_FUSED_STEP")


@lru_cache(maxsize=1)
def moe():
    """The loaded mixture-of-experts driver (moe.c) where gguf and rows loaded too, or None
    (`why_unavailable("moe")`; SPECDEC_NO_MOE_KERNEL=1 turns it off)."""
    missing = [name for name, lib in (("gguf", gguf()), ("rows", rows())) if lib is None]
    if missing:
        reasons["moe"] = f"it drives {', '.join(missing)}, which did not load ({why_unavailable(missing[0])})"
        return None
    lib = load("moe", {"moe_experts": [P, P, P, I64, I64, P, P, I32, P, I32], "moe_route": [P, P, I64, P, P],
                       "moe_rows": [P, P, P, P, I64, I32, P, P, P, I32]}, off="SPECDEC_NO_MOE_KERNEL")
    if lib is not None:  # each returns 0, or -1 where scratch memory could not be had
        lib.moe_experts.restype = lib.moe_route.restype = lib.moe_rows.restype = I32
    return lib


def kernel_isa() -> str:
    """What specdec's C kernels run on here, for reports: "avx512-vnni", "avx2", or "none (why)"."""
    if gguf() is None and w8a8() is None:
        return f"none ({why_unavailable('gguf') or why_unavailable()})"
    return "avx512-vnni" if has_vnni() else "avx2"
