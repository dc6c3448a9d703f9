"""Small C kernels for what torch does not do well on this CPU class, built on first use.

w8a8.c: int8 weights x int8 activations (blocks of 32, llama.cpp's Q8_0 layout) with AVX2 integer
dot products. torch's weight-only int8 kernel (bf16 activations) reads ~9 GB/s for one row and
costs ~4x for four; this one reads ~13-15 GB/s per core and costs ~2x for four rows, which is what
makes verifying a draft cheap. Every output row is computed in one fixed order whatever the batch,
so a k-token forward stays bitwise k one-token forwards (model/transformer.py, Numerics).

The library is compiled with the system C compiler (`cc`, or $CC) into $SPECDEC_HOME/kernels/,
named by a digest of the source and flags, and loaded with ctypes: no torch headers, about a
second to build. `w8a8()` returns None, with `why_unavailable()` saying why, on a machine without
a compiler or without AVX2/FMA.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

SOURCE = Path(__file__).with_name("w8a8.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
BLOCK = 32  # activations are quantized in blocks of this many values

_why: list[str] = []


def why_unavailable() -> str | None:
    """Why `w8a8()` returned None (None when it loaded)."""
    return _why[0] if _why else None


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@lru_cache(maxsize=1)
def w8a8():
    """The loaded W8A8 library (ctypes.CDLL), or None."""
    missing = {"avx2", "fma"} - _cpu_flags()
    if missing:
        _why.append(f"this CPU lacks {', '.join(sorted(missing))}")
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        _why.append("no C compiler (cc) found; install gcc")
        return None
    from specdec.model.registry import specdec_home

    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode()).hexdigest()[:16]
    folder = specdec_home() / "kernels"
    target = folder / f"w8a8-{digest}.so"
    if not target.is_file():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=folder) as tmp:
                built = Path(tmp) / target.name
                subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(built), "-lm"], check=True,
                               capture_output=True, text=True, timeout=120)
                os.replace(built, target)  # atomic: a concurrent build leaves one whole file
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            _why.append(f"building {SOURCE.name} failed: {detail.strip()[:300]}")
            return None
    lib = ctypes.CDLL(str(target))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.quantize_rows.argtypes = [p, i64, i64, p, p]
    lib.quantize_rows.restype = None
    lib.w8a8_mm.argtypes = [p, p, i64, i64, p, p, p, p, i64, ctypes.c_int]
    lib.w8a8_mm.restype = None
    return lib


def w8a8_matmul(x, weight, scale, bias=None):
    """y = (x quantized to int8 per block of 32) @ weight.T * scale (+ bias).

    x: (M, K) float32, K % 32 == 0; weight: (N, K) int8; scale: (N,) float32; bias: (N,) or None.
    Returns (M, N) float32. Needs `w8a8()` to have loaded.
    """
    import torch

    lib = w8a8()
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
