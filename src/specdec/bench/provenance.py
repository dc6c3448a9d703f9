"""What a bench report says about where it ran and what it measured: the runtime (versions, CPU, threads)
and each artifact (the model's file or folder, its size, its sha256).

    results["runtime"] = runtime_info()      # client_runtime() for a load run, which loads no model here
    results["artifacts"] = {"target": artifact(model), "draft": None}
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

import specdec
from specdec.bench.memory import peak_rss_bytes
from specdec.model import kernels
from specdec.model.kernels.cpu import cpu_model
from specdec.model.catalogue import cached_sha256, resolve


def runtime_info(with_transformers: bool = False) -> dict:
    info = {
        "specdec_version": specdec.__version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "kernel_isa": kernels.kernel_isa(),  # what the gguf and w8a8 libraries were built for (model/kernels)
        "threads": torch.get_num_threads(),
        "peak_rss_bytes": peak_rss_bytes(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_allowed"] = len(os.sched_getaffinity(0))
    if with_transformers:
        import transformers  # an optional dependency (--peers): imported only when a peer ran

        info["transformers_version"] = transformers.__version__
    return info


def artifact(model) -> dict:
    d = model.info.to_dict()
    path = Path(d["path"])
    d["file_bytes"] = path.stat().st_size if path.is_file() else sum(
        f.stat().st_size for f in path.glob("*.safetensors"))
    return d


def artifact_of(model: str) -> dict:
    """The file the started server loads and its sha256, when it resolves without a download."""
    try:
        path = resolve(model, auto_pull=False)
    except Exception:  # the server reports what is wrong with it; this is only for the report
        return {}
    return {"artifact": str(path), "sha256": cached_sha256(path) if Path(path).is_file() else None}


def client_runtime() -> dict:
    info = {"specdec_version": specdec.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu_model": cpu_model(), "cpu_count": os.cpu_count()}
    if hasattr(os, "sched_getaffinity"):
        info["cpus_allowed"] = len(os.sched_getaffinity(0))
    return info
