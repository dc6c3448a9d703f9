"""Data parallel training under torchrun: joining and leaving its process group."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_distributed():
    """(rank, world, device) from torchrun's environment; (0, 1, None) for a plain process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, None
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    device = None
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    return rank, world, device


def finish_distributed(world: int, ok: bool) -> None:
    """Leaves torchrun's process group before the interpreter shuts down: a gloo rank that exits
    without it can still hold finished work whose tensors are freed during finalization, and abort.
    After a barrier when this rank finished, so that none leaves while another still talks to it;
    without one after an error, which the other ranks may never reach."""
    if world <= 1:
        return
    if not dist.is_initialized():
        return
    if ok:
        dist.barrier()
    dist.destroy_process_group()
