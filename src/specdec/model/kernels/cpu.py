"""What this CPU offers the kernels, and the environment switches that choose among them."""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The flags of /proc/cpuinfo (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU's model name ("AMD EPYC ..."), else what platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def env_flag(name: str) -> bool:
    """Whether an on/off environment variable is on: set to anything but "" or "0" (SPECDEC_NO_FUSED_STEP=0 is
    off)."""
    return os.environ.get(name, "") not in ("", "0")


@lru_cache(maxsize=1)
def has_vnni() -> bool:
    """Whether the integer-dot kernels are built with AVX512-VNNI here (see kernels/build.py; the environment
    is read once, at the first kernel call)."""
    return {"avx512_vnni", "avx512vl"} <= cpu_flags() and not env_flag("SPECDEC_KERNEL_AVX2")


PREFILL_PATHS = ("bf16", "fp32", "exact")


def prefill_path() -> str:
    """How a prefill's linears with many rows run (model/linear.py, QLinear.prefill): "bf16", a dense bf16
    GEMM over the weights' values, where the CPU multiplies bf16 natively (AVX512-BF16 or AMX); elsewhere
    "exact", the integer kernels that decoding runs (gguf_linear.c, w8a8.c; torch's int8 format takes "fp32").
    torch's bf16 GEMM is emulated on AVX2 alone: on an AMD EPYC (Zen 3, 2 threads) it ran 15-20 GFLOP/s
    against float32's 65-97, and the gguf kernel prefilled qwen2.5-coder-0.5b and -1.5b 1.4x and 1.8x
    faster than a float32 GEMM (smollm2-135m 0.8x). SPECDEC_PREFILL=bf16, fp32 or exact overrides the
    choice (read at each call)."""
    asked = os.environ.get("SPECDEC_PREFILL")
    if asked:
        if asked not in PREFILL_PATHS:
            raise ValueError(f"SPECDEC_PREFILL must be one of {', '.join(PREFILL_PATHS)}, not {asked!r}")
        return asked
    return "bf16" if {"avx512_bf16", "amx_bf16"} & cpu_flags() else "exact"
