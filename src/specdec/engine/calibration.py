"""What speculation measured on this machine: `specdec tune` writes it, auto reads it.

A calibration holds, for one target file, weight format, thread count, CPU and drafter, the speed-up
over plain decoding that each speculative configuration measured on a short mixed prompt set (per
category and temperature, the same rounds interleaving every configuration with plain decoding):

    $SPECDEC_HOME/tune/<model digest[:16]>-<weights>-t<threads>-<digest of the rest[:12]>.json

auto chooses the configuration with the best overall speed-up among those that were no slower than
plain decoding (within TOLERANCE) in every category and temperature measured, and plain decoding when
none was; its reasons name the file and the numbers. Without a calibration, auto falls back on what
the target carries (engine/auto.py) and says how to measure.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdec.model.catalogue import specdec_home
from specdec.model.files import write_text
from specdec.model.kernels.cpu import cpu_model

TOLERANCE = 0.02  # a configuration at 0.98x plain in some category is "no slower" (timing noise of a short run)
SCHEMA = "specdec-calibration/1"


@dataclass(frozen=True)
class CalibrationKey:
    """What a measurement holds for: the same file, weights, threads, machine and drafter."""

    model_digest: str  # the target file's sha256 (a folder's digest)
    weights: str  # in-memory weight format
    threads: int
    hardware: str  # "cpu" or "cuda"
    draft_digest: str | None = None  # the drafter given with -md, if any
    cpu: str = field(default_factory=cpu_model)

    def path(self) -> Path:
        rest = json.dumps([self.hardware, self.cpu, self.draft_digest], sort_keys=True).encode()
        name = f"{self.model_digest[:16]}-{self.weights}-t{self.threads}-{hashlib.sha256(rest).hexdigest()[:12]}.json"
        return specdec_home() / "tune" / name


@dataclass(frozen=True)
class Measured:
    """One configuration's speed-ups over plain decoding, measured in the same rounds.

    method: SpecConfig.method of the configuration ("suffix", "suffix,draft-mtp"); types: its kinds.
    speedups: {"<category>@<temperature>": median speed-up}, the 'all' category included.
    """

    method: str
    types: tuple[str, ...]
    speedups: dict[str, float]
    mean_acceptance_length: float | None = None

    @property
    def overall(self) -> float:
        """The median speed-up over every prompt at the lowest temperature measured (greedy when measured)."""
        alls = sorted((k for k in self.speedups if k.startswith("all@")), key=lambda k: float(k.split("@")[1]))
        return self.speedups[alls[0]] if alls else min(self.speedups.values())

    @property
    def worst(self) -> tuple[str, float]:
        """The category and temperature where it paid least, and that speed-up."""
        cells = {k: v for k, v in self.speedups.items() if not k.startswith("all@")} or self.speedups
        where = min(cells, key=cells.get)
        return where, cells[where]

    def summary(self) -> str:
        where, worst = self.worst
        return f"{self.method} measured {self.overall:.2f}x overall, {worst:.2f}x at worst ({where})"


@dataclass(frozen=True)
class Calibration:
    key: CalibrationKey
    created: str
    prompts: str  # the prompt set measured
    max_tokens: int
    measured: tuple[Measured, ...]
    path: str = ""  # where it was read from

    def best(self, allowed=None) -> tuple[Measured | None, list[Measured]]:
        """(the configuration auto runs, or None for plain decoding; the ones slower than plain somewhere).
        allowed(measured) -> bool: whether it can run now (its drafters still given and runnable)."""
        usable = [m for m in self.measured if allowed is None or allowed(m)]
        slower = [m for m in usable if m.worst[1] < 1.0 - TOLERANCE]
        fine = [m for m in usable if m not in slower and m.overall > 1.0]
        return (max(fine, key=lambda m: m.overall) if fine else None), slower


def save_calibration(calibration: Calibration) -> Path:
    path = calibration.key.path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema": SCHEMA, "key": asdict(calibration.key), "created": calibration.created,
            "prompts": calibration.prompts, "max_tokens": calibration.max_tokens,
            "measured": [asdict(m) for m in calibration.measured]}
    write_text(path, json.dumps(data, indent=1) + "\n")
    return path


def load_calibration(key: CalibrationKey) -> Calibration | None:
    """The calibration saved for this key, or None (none saved, or a file that is not one: it is measured again)."""
    path = key.path()
    try:
        data = json.loads(path.read_text())
        if data.get("schema") != SCHEMA or data.get("key") != asdict(key):
            return None
        measured = tuple(Measured(m["method"], tuple(m["types"]), {k: float(v) for k, v in m["speedups"].items()},
                                  m.get("mean_acceptance_length")) for m in data["measured"])
        return Calibration(key, data["created"], data["prompts"], int(data["max_tokens"]), measured, str(path))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M")
