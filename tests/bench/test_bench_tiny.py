"""The bench end to end on the tiny random model: files, schema, engagement, pairing, memory."""

from __future__ import annotations

import json
import statistics

import pytest

from bench_helpers import short_prompts, validate_results  # noqa: F401 (short_prompts is a fixture)
from specdec.bench.memory import transformer_bytes
from specdec.cli import main


@pytest.fixture(scope="module")
def tiny_bench(tiny_hf_dir, short_prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    rc = main(["bench", "--model", str(tiny_hf_dir), "--weights", "fp32", "--ctx-size", "100000",
               "--draft-model", str(tiny_hf_dir),
               "--methods", "none,draft-simple,ngram-map-k:min_hits=1000,auto",
               "--prompts", str(short_prompts), "--temperature", "0,0.8", "--max-tokens", "8", "--repeats", "2",
               "--draft-lengths", "2", "--no-progress", "--out", str(out)])
    assert rc == 0
    return out, json.loads((out / "results.json").read_text())


def test_files_and_schema(tiny_bench):
    out, r = tiny_bench
    validate_results(r)
    assert r["settings"]["ctx_size"] == 512  # the context used (the model's), not the 100000 asked for
    md = (out / "report.md").read_text()
    for heading in ("## Artifact", "## Runtime", "## Settings", "## Results, temperature 0", "## auto",
                    "## Per-position acceptance", "## Speed-up against draft length"):
        assert heading in md
    assert r["artifacts"]["target"]["sha256"] in md
    import matplotlib.image

    for name in ("speedup_by_category.png", "acceptance_by_position.png", "speedup_vs_draft_length.png"):
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert name in md


def test_engaged_and_never_engaged(tiny_bench):
    out, r = tiny_bench
    rows = {(s["config"], s["temperature"]): s for s in r["summary"] if s["category"] == "all"}
    for t in (0.0, 0.8):
        draft = rows[("draft-simple", t)]  # the draft is the target itself: it always drafts
        assert draft["engaged"] == "yes" and draft["drafted"] > 0 and draft["steps"] > 0
        assert len(draft["per_position_acceptance"]) == 3
        never = rows[("ngram-map-k:min_hits=1000", t)]
        assert never["engaged"] == "no" and never["drafted"] == 0
        assert rows[("none", t)]["engaged"] == "no"
    for run in r["runs"]:
        assert (run["engaged"] == "yes") == bool(run["drafted"])
    assert "ngram-map-k:min_hits=1000 was configured but NEVER ENGAGED" in (out / "report.md").read_text()


def test_greedy_outputs_compared_token_for_token(tiny_bench):
    _, r = tiny_bench
    for s in r["summary"]:
        if s["temperature"] == 0.0 and s["config"] != "none":
            gi = s["greedy_identical"]
            assert gi["compared"] == s["runs"]
            assert gi["identical"] == gi["compared"], s["config"]  # lossless: same tokens as plain decoding
        if s["temperature"] != 0.0:
            assert s["greedy_identical"] is None


def test_pairs_are_interleaved_and_ratios_per_round(tiny_bench):
    _, r = tiny_bench
    by_round: dict = {}
    for run in r["runs"]:
        by_round.setdefault(run["round"], {})[run["config"]] = run
    n_configs = len(r["configs"])
    assert all(len(v) == n_configs for v in by_round.values())
    # at each temperature, the rotation gives the baseline a new position in every round (4 rounds, 7 configs)
    for t in (0.0, 0.8):
        positions = [v["none"]["position"] for v in by_round.values() if v["none"]["temperature"] == t]
        assert len(set(positions)) == len(positions) == 4, (t, positions)
    for runs in by_round.values():
        base = runs["none"]
        for label, run in runs.items():
            if label != "none" and run["decode_tokens_per_s"] and base["decode_tokens_per_s"]:
                assert run["speedup"] == pytest.approx(run["decode_tokens_per_s"] / base["decode_tokens_per_s"])
    assert {run["repeat"] for run in r["runs"]} == {0, 1}


def test_sweep_auto_and_settings(tiny_bench):
    _, r = tiny_bench
    ks = sorted({x["draft_n_max"] for x in r["sweep"] if x["method"] == "draft-simple" and x["temperature"] == 0})
    assert ks == [2, 3]
    auto = r["auto"]
    assert auto["types"] == ["suffix"] and auto["config"] == "auto (suffix)"
    # every auto run decodes its 8 tokens, so every median ratio is measured and the verdict is a yes
    # or a no (never None): no exactly when some median fell below 1 - tolerance (which is timing)
    assert all(run["output_tokens"] == 8 for run in r["runs"] if run["config"] == auto["config"])
    rows = [s for s in r["summary"] if s["config"] == auto["config"]]
    assert rows and all(s["speedup_median"] is not None for s in rows)
    slower = [{"category": s["category"], "temperature": s["temperature"], "speedup_median": s["speedup_median"]}
              for s in rows if s["speedup_median"] < 1.0 - auto["tolerance"]]
    assert auto["slower_in"] == slower
    assert auto["no_slower_than_plain"] is (not slower)
    assert any("draft-simple" in reason for reason in auto["reasons"])  # the draft model was considered
    s = r["settings"]
    assert s["prompt_set"]["license"] == "Apache-2.0" and s["drafter_state"] == "fresh per run"
    assert r["artifacts"]["draft"]["path"] == r["artifacts"]["target"]["path"]


def test_memory_is_accounted(tiny_bench, tiny_model):
    _, r = tiny_bench
    mem = {c["label"]: c["memory"] for c in r["configs"]}
    assert mem["none"]["weights_bytes"] == transformer_bytes(tiny_model.transformer)
    assert mem["none"]["drafter_bytes"] == 0
    assert mem["draft-simple"]["drafter_bytes"] >= transformer_bytes(tiny_model.transformer)
    assert mem["draft-simple"]["drafter_bytes_measured_by"] == "tensor sizes"
    assert 0 < mem["none"]["kv_used_bytes"] <= mem["none"]["kv_allocated_bytes"]
    assert mem["draft-simple"]["total_bytes"] > mem["none"]["total_bytes"]


def test_every_speculative_run_and_row_carries_a_verdict_checked_against_the_plain_run(tiny_bench):
    out, r = tiny_bench
    runs = r["runs"]
    for run in runs:
        if run["config"] == "none":
            assert "plain_estimate_error" not in run
            continue
        base = next(b for b in runs if b["config"] == "none" and b["round"] == run["round"])
        step = run["spec"]["verdict"]["plain_step_s"]
        if step is None or base["output_tokens"] < 2:
            assert run["plain_estimate_error"] is None
        else:  # the estimated plain step over the plain run's measured one, in the same round
            measured = base["decode_s"] / (base["output_tokens"] - 1)
            assert run["plain_estimate_error"] == pytest.approx(step / measured - 1)
    for s in r["summary"]:
        mine = [x for x in runs if x["config"] == s["config"] and x["temperature"] == s["temperature"]
                and s["category"] in ("all", x["category"])]
        v = s["verdict"]
        assert v["decode_s"] == pytest.approx(sum(x["spec"]["verdict"]["decode_s"] for x in mine))  # merged
        estimates = [x["spec"]["verdict"]["plain_estimate_s"] for x in mine]
        if None not in estimates:
            assert v["plain_estimate_s"] == pytest.approx(sum(estimates))
        check = s["plain_estimate_error"]
        errors = [x["plain_estimate_error"] for x in mine if x.get("plain_estimate_error") is not None]
        assert (check is None) == (not errors)
        if errors:
            assert check["median"] == pytest.approx(statistics.median(errors)) and check["runs"] == len(errors)
    md = (out / "report.md").read_text()
    assert "## Verdicts" in md and "| draft-simple | all |" in md and "within 15%" in md
