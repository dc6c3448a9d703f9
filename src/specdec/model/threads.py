"""The one place that sets how many CPU threads a process computes with (`-t/--threads`, LLM(threads=)).

torch's intra-op pool and every C kernel follow the same number: the kernels read torch.get_num_threads()
at each call and pass it to OpenMP as num_threads (model/kernels/ops.py, transformer.py's fused step), so
torch.set_num_threads is the whole setting. It holds for the whole process, as llama.cpp's -t does for its.

    set_threads(4)      # from now on: 4 threads for torch and the kernels
    set_threads(None)   # unchanged (torch's default: the physical cores)
"""

from __future__ import annotations

import torch

from specdec.sampling import is_whole


def set_threads(threads: int | None) -> None:
    """Compute with `threads` CPU threads from now on (None: leave the current number)."""
    check_threads(threads)
    if threads is not None:
        torch.set_num_threads(int(threads))


def check_threads(threads: int | None) -> None:
    """None, or a whole number of at least 1 (torch raises a bare RuntimeError for 0 and -2)."""
    if threads is not None and (not is_whole(threads) or threads < 1):
        raise ValueError(f"--threads must be a whole number of at least 1, got {threads!r}")
