"""Writes this folder's fixture: a tiny Gemma 4 text checkpoint (hf/) and its assistant drafter (assistant/, the
centroid-clustered head), written by transformers' own classes (tests/helpers/gemma4.py), random weights:

    python tests/model/data/gemma4-tiny/make_fixture.py
"""

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))  # tests/, for helpers

from helpers.gemma4 import assistant_folder, text_folder  # noqa: E402

if __name__ == "__main__":
    for name in ("hf", "assistant"):
        shutil.rmtree(HERE / name, ignore_errors=True)
    text_folder(HERE / "hf", seed=0)
    assistant_folder(HERE / "assistant", seed=1, centroids=16)
    print("wrote", *sorted(str(p.relative_to(HERE)) for p in HERE.rglob("*") if p.is_file()))
