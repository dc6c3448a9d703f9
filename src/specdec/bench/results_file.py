"""The results.json already in a bench's --out folder, and whether a new run may join it.

A method bench and a load run (`--concurrency`) of the same artifact share one results.json and
report.md; a run of another artifact is refused before it starts, so no report speaks of two models
under one name.
"""

from __future__ import annotations

import json
from pathlib import Path


def read_results(out_dir) -> dict | None:
    """out_dir/results.json as a dict, or None (none there, unreadable, not an object)."""
    file = Path(out_dir) / "results.json"
    try:
        existing = json.loads(file.read_text()) if file.is_file() else None
    except (ValueError, OSError):
        return None
    return existing if isinstance(existing, dict) else None


def method_results(out_dir) -> dict | None:
    """The results.json of a method bench in out_dir, or None."""
    existing = read_results(out_dir)
    if existing is not None and existing.get("schema") == "specdec-bench/1" and "summary" in existing:
        return existing
    return None


def load_results(out_dir) -> dict | None:
    """The load section of out_dir/results.json (a load run alone, or joined to a method bench), or None."""
    load = (read_results(out_dir) or {}).get("load")
    return load if isinstance(load, dict) else None


def _same_artifact(served: dict, target: dict) -> bool:
    """served: {"artifact": path, "sha256": ...} (a load run's server), target: a bench's artifacts.target."""
    if served.get("sha256") and target.get("sha256"):
        return served["sha256"] == target["sha256"]
    return Path(str(served.get("artifact"))).resolve() == Path(str(target.get("path"))).resolve()


def check_load_joins(out_dir, served: dict) -> None:
    """A ValueError, before a load run starts, when out_dir holds the method bench of another artifact than
    the one the server will load (`served`: {"artifact": path, "sha256": ...}; empty when unknown): its
    report would gain a load section about another model under the first one's name."""
    existing = method_results(out_dir)
    target = ((existing or {}).get("artifacts") or {}).get("target") or {}
    if target and served and not _same_artifact(served, target):
        benched = target.get("name") or target.get("path")
        raise ValueError(f"{Path(out_dir) / 'results.json'} is the bench of {benched}; a load run of "
                         f"{served.get('artifact')} would be joined to it: choose another --out")


def check_bench_joins(out_dir, target: dict) -> None:
    """check_load_joins the other way round: a ValueError, before a method bench starts, when out_dir holds
    a load run whose server loaded another artifact than `target` ({"path": ..., "sha256": ...}); the
    method bench keeps a load run in its --out (write_all), so it would report one about another model."""
    served = (load_results(out_dir) or {}).get("server") or {}
    if served.get("artifact") and target and not _same_artifact(served, target):
        raise ValueError(f"{Path(out_dir) / 'results.json'} holds a load run of {served['artifact']}; the bench "
                         f"of {target.get('path')} would be joined to it: choose another --out")

