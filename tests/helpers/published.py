"""Drafter folders in the layouts their publishers write, for tests: config.json as the publisher's own code
wrote it and random tensors under the names, dtypes and shapes its save path gave them
(tests/drafters/data/published/, made by make_fixtures.py there; README.md names the sources).

    folder = published_folder("speculators-eagle3", tmp_path)     # config.json + model.safetensors
    folder = published_folder("eagle-eagle3", tmp_path)           # config.json + pytorch_model.bin (EAGLE's)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from helpers.tiny import EAGLE3_DRAFT_IDS

PUBLISHED = Path(__file__).resolve().parent.parent / "drafters" / "data" / "published"
EAGLE3_HEADS = sorted(p.name for p in PUBLISHED.iterdir()
                      if p.is_dir() and (p / "tensors.json").is_file() and "eagle3" in p.name)
_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64, "BOOL": torch.bool}


def header(name: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    raw = json.loads((PUBLISHED / name / "tensors.json").read_text())
    return {k: (dtype, tuple(shape)) for k, (dtype, shape) in raw.items()}


def random_tensors(name: str, seed: int = 0, draft_ids: torch.Tensor = EAGLE3_DRAFT_IDS) -> dict[str, torch.Tensor]:
    """Tensors for the fixture's names and shapes: norm weights 1 + noise (each its own, so a norm applied to
    the wrong input shows), matrices scaled by 1/sqrt(fan-in), an embedding of unit rows, d2t / t2d mapping the
    draft vocabulary onto `draft_ids` (ascending target ids), other integer tensors zero."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, (dtype, shape) in header(name).items():
        if key == "d2t":
            out[key] = draft_ids.long() - torch.arange(shape[0])
        elif key == "t2d":
            out[key] = torch.zeros(shape, dtype=torch.bool).index_fill_(0, draft_ids.long(), True)
        elif _DTYPES[dtype] in (torch.int64, torch.bool):
            out[key] = torch.zeros(shape, dtype=_DTYPES[dtype])
        elif len(shape) == 1:
            scale = 0.3 if "norm" in key else 0.1
            out[key] = ((1.0 if "norm" in key else 0.0) + torch.randn(shape, generator=g) * scale).to(_DTYPES[dtype])
        else:
            scale = 1.0 if "embed" in key else 0.8 / shape[-1] ** 0.5
            out[key] = (torch.randn(shape, generator=g) * scale).to(_DTYPES[dtype])
    return out


def published_folder(name: str, dest: Path, seed: int = 0, config: dict | None = None,
                     draft_ids: torch.Tensor = EAGLE3_DRAFT_IDS) -> Path:
    """The fixture `name` as a folder under dest: its config.json (with `config`'s keys replaced at the top
    level) and random tensors (random_tensors), in pytorch_model.bin for EAGLE's (eagle-*), else
    model.safetensors."""
    folder = Path(dest) / name
    folder.mkdir(parents=True, exist_ok=True)
    raw = json.loads((PUBLISHED / name / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, **(config or {})}, indent=2))
    tensors = random_tensors(name, seed, draft_ids)
    if name.startswith("eagle-"):
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def real_config(name: str) -> dict:
    """A config.json published as it is (tests/drafters/data/published/real-configs)."""
    return json.loads((PUBLISHED / "real-configs" / name).read_text())


def copy_fixture(name: str, dest: Path) -> Path:
    return Path(shutil.copytree(PUBLISHED / name, Path(dest) / name))
