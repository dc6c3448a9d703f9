"""Weights in the layout the kernels read: memory backed by huge pages, and GGUF blocks repacked for gguf_linear.c."""

from __future__ import annotations

import ctypes
import math
import mmap

import torch

from specdec.model.kernels.libraries import gguf

HUGE_PAGE = 2 << 20  # bytes of a transparent huge page (x86-64 Linux)


def empty_huge(shape, dtype):
    """torch.empty(shape, dtype=dtype) in memory asked to be backed by 2 MB pages (Linux transparent huge
    pages, madvise), for the weights the kernels stream at every step. In 4 KB pages each 4 KB of weights
    costs a TLB miss, and the hardware prefetchers stop at every page boundary; where transparent huge pages
    are `madvise`-only (as on the machines here) torch's allocations get none. qwen2.5-coder-1.5b gguf, the
    same process with its weights in one or the other: forward(1) 0.93-0.95x the time after 100 and 3000
    tokens of context, forward(4) 0.97-1.00x. torch.empty where the platform cannot ask or below 2 MB."""
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
    the kernel's layout: each row's groups of 256 values (a K-quant super-block, 8 blocks of the others) with
    their bits moved so that one vector holds 4 values of each of 8 sub-blocks of 32 (see gguf_blocks.h): the same
    bytes per group, the same values and scales; the rest of a row as it was. Rows are repacked one by one,
    so the pieces go straight from (say) a mapped file into their rows of the result."""
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
    float32 for type 0 (F32). The blocks are held in the kernel's interleaved layout (gguf_repack), F32 parts as
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
