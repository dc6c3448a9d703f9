"""Shared by the bench tests: a short prompt file (fits the tiny model's 512-token context), the schema check.

Not a conftest.py: tests/conftest.py is imported as `conftest` by other tests.
"""

from __future__ import annotations

import json

import pytest

SHORT_META = {"source": "specdec tests", "license": "Apache-2.0"}
SHORT_PROMPTS = [
    {"id": "code-1", "category": "code", "text": "def add(a, b):\n    return a + b\n\ndef add(a, b):\n"},
    {"id": "chat-1", "category": "chat", "messages": [{"role": "user", "content": "Say the the the the."}]},
]


@pytest.fixture(scope="session")
def short_prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "short.jsonl"
    lines = [json.dumps({"_meta": SHORT_META})] + [json.dumps(p) for p in SHORT_PROMPTS]
    path.write_text("\n".join(lines) + "\n")
    return path


def validate_results(r: dict) -> None:
    """The results.json schema (specdec-bench/1): required keys and types at every level."""
    num = (int, float)
    opt_num = (int, float, type(None))
    assert r["schema"] == "specdec-bench/1"
    assert isinstance(r["created"], str)
    for key in ("temperatures", "max_tokens", "repeats", "warmup", "seed", "order", "methods", "draft_n_max",
                "draft_lengths", "ctx_size", "weights", "drafter_state", "prompt_set", "peers"):
        assert key in r["settings"], key
    for key in ("source", "license", "name"):
        assert key in r["settings"]["prompt_set"], key
    for key in ("specdec_version", "torch_version", "python", "platform", "cpu_model", "cpu_count", "kernel_isa",
                "threads", "peak_rss_bytes"):
        assert key in r["runtime"], key
    target = r["artifacts"]["target"]
    for key in ("name", "path", "sha256", "arch", "quant", "weights_dtype", "params", "file_bytes"):
        assert key in target, key
    assert len(target["sha256"]) == 64
    assert r["prompts"] and all({"id", "category", "prompt_tokens"} <= set(p) for p in r["prompts"])
    labels = {c["label"] for c in r["configs"]}
    assert "none" in labels
    for c in r["configs"]:
        for key in ("label", "kind", "method", "baseline", "runtime", "in_memory_format", "speculation_path"):
            assert key in c, key
        assert c["kind"] in ("specdec", "peer")
        assert c["speculation_path"] in ("yes", "no", "unknown")
        assert c["baseline"] in labels
    for run in r["runs"]:
        assert run["config"] in labels
        for key, types in (("prompt", str), ("category", str), ("temperature", num), ("repeat", int), ("round", int),
                           ("position", int), ("output_tokens", int), ("decode_s", num), ("prefill_s", opt_num),
                           ("decode_tokens_per_s", opt_num), ("speedup", opt_num), ("timing_source", str),
                           ("rss_bytes", int)):
            assert isinstance(run[key], types), (key, run[key])
        assert run["engaged"] in ("yes", "no", "unknown")
        assert run["identical_to_baseline"] in (True, False, None)
    for s in r["summary"]:
        for key, types in (("config", str), ("category", str), ("temperature", num), ("runs", int),
                           ("failed_runs", int),
                           ("decode_tokens_per_s_median", opt_num), ("speedup_median", opt_num),
                           ("speedup_min", opt_num), ("speedup_max", opt_num), ("acceptance_rate", opt_num),
                           ("mean_acceptance_length", opt_num), ("per_position_acceptance", list),
                           ("draft_fraction", opt_num)):
            assert isinstance(s[key], types), (key, s[key])
        assert s["engaged"] in ("yes", "no", "unknown")
        assert "memory" in s and "greedy_identical" in s and "drafted" in s and isinstance(s["by_drafter"], dict)
    assert isinstance(r["sweep"], list)
