"""The bench on a real model (SmolLM2-135M, Q4_1 GGUF): one prompt, a few tokens, one repeat."""

from __future__ import annotations

import pytest

from bench_helpers import validate_results
from specdec.model.catalogue import MODELS

pytestmark = pytest.mark.slow


def test_bench_on_smollm(smollm, tmp_path):
    from specdec.bench.method_bench import bench

    r = bench(smollm, "edit", "none,suffix,ngram-map-k:min_hits=1000,auto", temperatures=[0.0], max_tokens=8,
              repeats=1, warmup=False, per_category=1, ctx_size=512, peers=["hf-plain"], progress=False,
              out_dir=tmp_path)
    validate_results(r)
    target = r["artifacts"]["target"]
    assert target["sha256"] == MODELS["smollm2-135m"].sha256
    assert target["quant"] == "Q4_1" and target["weights_dtype"] == "int8"
    assert r["settings"]["prompt_set"]["license"].startswith("Apache-2.0")
    rows = {s["config"]: s for s in r["summary"] if s["category"] == "all"}
    # greedy, so deterministic: the pasted code is copied and suffix drafts from it
    assert rows["suffix"]["engaged"] == "yes" and rows["suffix"]["drafted"] > 0
    assert rows["auto (suffix)"]["engaged"] == "yes"
    assert rows["ngram-map-k:min_hits=1000"]["engaged"] == "no" and rows["ngram-map-k:min_hits=1000"]["drafted"] == 0
    for label in ("suffix", "auto (suffix)", "ngram-map-k:min_hits=1000"):
        assert rows[label]["greedy_identical"] == {"identical": 1, "compared": 1}
    for name in ("results.json", "report.md", "speedup_by_category.png", "acceptance_by_position.png"):
        assert (tmp_path / name).stat().st_size > 0
    # transformers on the same GGUF holds dense floats: the report must not call it the same quantization
    hf = next(c for c in r["configs"] if c["label"] == "hf-plain")
    assert hf["in_memory_format"].startswith("bf16 dense floating point (dequantized from the GGUF file")
    assert "differs from specdec's int8" in hf["in_memory_format"]
    assert "not a same-quantization comparison" in (tmp_path / "report.md").read_text()
