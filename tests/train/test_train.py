"""`specdec train`: end to end on a tiny model; the saved heads load, draft, and stay lossless."""

from __future__ import annotations

import json
import re

import pytest
import torch

from helpers.distribution import engine_law, fit_pvalue, sample_continuations
from helpers.published import PUBLISHED
from helpers.tiny import make_hf_model
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model.load import load_model
from specdec.sampling import SamplingParams

COMMON = ["--generate", "64", "--gen-tokens", "48", "--corpus-seqs", "8", "--batch", "8", "--val", "8",
          "--seq-len", "64", "--lr", "3e-3", "--ttt", "2", "--threads", "1", "--device", "cpu"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny target with an MTP head trained beside it (where auto finds it) and an EAGLE-3 head."""
    from specdec.cli.train import main

    root = tmp_path_factory.mktemp("train")
    folder = make_hf_model(root / "tiny", layers=6)
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog." * 3 for i in range(20)))
    # the float copy writes the text (--gen-engine dense): the heads are checked below on the fp32 target, and the
    # random tiny model's int8 runtime (what the engine runs a folder in) writes other text
    # greedy answers (--gen-temperature 0): the losses score the answers only, and a random tiny target's sampled
    # answers are noise no head learns in 150 steps; its greedy ones are its own predictions
    dense = ["--gen-engine", "dense", "--gen-temperature", "0"]
    assert main(["mtp", "--model", str(folder), "--steps", "150", "--save-every", "75", "--data", str(corpus)] + COMMON
                + dense) == 0
    assert main(["eagle3", "--model", str(folder), "--out", str(root / "eagle3"), "--steps", "150", "--save-every", "75",
                 "--draft-vocab", "256", "--data", str(corpus)] + COMMON + dense) == 0
    return folder, root / "eagle3"


def test_training_writes_loadable_heads_and_learns(trained):
    folder, eagle_dir = trained
    mtp_dir = folder.with_name(folder.name + ".mtp")
    for d in (mtp_dir, eagle_dir):
        assert (d / "model.safetensors").is_file() and (d / "config.json").is_file()
        summary = json.loads((d / "train_summary.json").read_text())
        assert summary["steps"] == 150
        assert summary["command"].startswith(f"specdec train {summary['kind']} --model {folder}")  # how to redo it
        assert summary["val_top1_per_step"][0] > 0.1  # a random head agrees with the target ~1/512 of the time
    # in vLLM's speculators format (what vLLM serves), its keys those speculators' Eagle3DraftModel writes
    cfg = json.loads((eagle_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3DraftModel"] and cfg["speculators_model_type"] == "eagle3"
    assert cfg["draft_vocab_size"] == 256 and cfg["transformer_layer_config"]["num_hidden_layers"] == 1
    published = json.loads((PUBLISHED / "speculators-eagle3" / "config.json").read_text())
    assert set(published) - {"auto_map", "transformers_version"} <= set(cfg)


def test_resume_continues_from_the_saved_step(trained, tmp_path):
    from specdec.cli.train import main

    folder, eagle_dir = trained
    out = tmp_path / "r"
    corpus = tmp_path / "c.txt"
    corpus.write_text("Some plain text for the corpus, repeated. " * 40)
    args = ["eagle3", "--model", str(folder), "--out", str(out), "--draft-vocab", "256", "--save-every", "5",
            "--data", str(corpus)] + COMMON
    assert main(args + ["--steps", "5"]) == 0
    assert main(args + ["--steps", "8", "--resume"]) == 0
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 8
    summary = (out / "train_summary.json").read_text()
    assert main(args + ["--steps", "8", "--resume"]) == 0  # at step 8 already: nothing to do, nothing lost
    assert (out / "train_summary.json").read_text() == summary
    state = out / "state.pt"
    state.write_bytes(state.read_bytes()[:1000])  # an interrupted save: refused, never trained over
    with pytest.raises(ValueError, match=r"state.pt is not a readable training state \(RuntimeError"):
        main(args + ["--steps", "9", "--resume"])


def test_a_trained_head_or_a_model_in_out_is_never_written_over(trained, tmp_path):
    """A new run into a folder holding a head wrote over it at its first checkpoint; --out set to the
    target's folder replaced the model's weights; --steps 0 saved an untrained head; a diverged run saved
    NaN weights; another kind's state.pt was 'resumed'. Each is refused now and leaves the files as they were."""
    from specdec.cli.train import main

    folder, eagle_dir = trained
    data = eagle_dir / "data.rank0.npz"  # the fixture's sequences: no generation here
    args = ["--model", str(folder), "--sequences", str(data), "--save-every", "5"] + COMMON

    def files(d):
        return {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}

    before = files(eagle_dir), files(folder)
    for argv, message in [
        (["eagle3", "--out", str(eagle_dir), "--draft-vocab", "256", "--steps", "5"],
         "holds model.safetensors already .*--resume continues"),
        (["eagle3", "--out", str(folder), "--draft-vocab", "256", "--steps", "5"], "holds model.safetensors already"),
        (["mtp", "--out", str(eagle_dir), "--steps", "200", "--resume"], r"state.pt was written by another head \(eagle3\)"),
        (["eagle3", "--out", str(eagle_dir), "--draft-vocab", "128", "--steps", "200", "--resume"], "other settings"),
    ]:
        with pytest.raises(ValueError, match=message):
            main(argv + args)
    assert (files(eagle_dir), files(folder)) == before

    empty = tmp_path / "data-only"
    assert main(["eagle3", "--out", str(empty), "--draft-vocab", "256", "--steps", "0", "--val", "0"] + args) == 0
    assert not (empty / "model.safetensors").exists() and not (empty / "state.pt").exists()
    with pytest.raises(ValueError, match="training diverged: the head's weights are not finite"):
        main(["eagle3", "--out", str(tmp_path / "nan"), "--draft-vocab", "256", "--steps", "5"] + args
             + ["--lr", "1e30"])
    assert not (tmp_path / "nan" / "model.safetensors").exists()
    copy = tmp_path / "copy"
    copy.mkdir()
    for name, data_bytes in before[0].items():
        (copy / name).write_bytes(data_bytes)
    (copy / "state.pt").unlink()
    with pytest.raises(ValueError, match="holds model.safetensors but no state.pt"):
        main(["eagle3", "--out", str(copy), "--draft-vocab", "256", "--steps", "5", "--resume"] + args)


def test_resume_refuses_other_data_or_settings(tiny_hf_dir, tmp_path):
    """--resume used to go on silently with other text (another --sequences file, none after a --sequences
    run: new text was generated, a data file deleted), another --block-size / --target-layers /
    --mask-token-id, or another --seq-len: a head trained half on one thing, half on another (an EAGLE-3
    head's draft vocabulary comes from its data: its loss and its saved map disagreed). Each is refused now,
    before any data is generated, and the state is kept."""
    from specdec.cli.train import main
    from specdec.train.data import save_sequences

    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    save_sequences([[3 + (i * 7 + j) % 190 for j in range(24)] for i in range(12)], a)
    save_sequences([[300 + (i * 5 + j) % 190 for j in range(24)] for i in range(12)], b)
    common = ["--model", str(tiny_hf_dir), "--val", "2", "--batch", "2", "--seq-len", "24", "--threads", "1",
              "--device", "cpu", "--save-every", "2"]
    eagle = tmp_path / "eagle3"
    eagle_args = ["eagle3", "--out", str(eagle), "--draft-vocab", "32"] + common
    assert main(eagle_args + ["--sequences", str(a), "--steps", "2"]) == 0
    state = (eagle / "state.pt").read_bytes()
    for flags, message in [
        (["--sequences", str(b)], "other settings .*data '--sequences sha256 "),
        ([], "other settings .*data '--sequences sha256 [0-9a-f]{64}' then, 'generated' now"),
        (["--sequences", str(a), "--seq-len", "20"], "seq_len 24 then, 20 now"),
        (["--sequences", str(a), "--val", "3"], "val 2 then, 3 now"),  # moves sequences between the sets
        # the loss and the target: each was resumed without a word
        (["--sequences", str(a), "--batch", "3"], "batch 2 then, 3 now"),
        (["--sequences", str(a), "--ttt", "1"], "ttt 7 then, 1 now"),  # eagle3: 7 by default (SpecForge)
        (["--sequences", str(a), "--lr", "0.05"], "lr 0.001 then, 0.05 now"),
        (["--sequences", str(a), "--model", str(make_hf_model(tmp_path / "other", seed=5))], "target '[0-9a-f]+' then"),
        (["--sequences", str(tmp_path / "gone.npz")], "--sequences .*gone.npz: no such file"),
    ]:
        with pytest.raises(ValueError, match=message):
            main(eagle_args + ["--steps", "4", "--resume"] + flags)
        assert (eagle / "state.pt").read_bytes() == state and not (eagle / "data.rank0.npz").exists()
    assert main(eagle_args + ["--sequences", str(a), "--steps", "4", "--resume"]) == 0  # the same: it goes on

    block = tmp_path / "dflash"
    block_args = ["dflash", "--out", str(block), "--sequences", str(a), "--anchors", "2"] + common
    assert main(block_args + ["--steps", "2", "--block-size", "4", "--target-layers", "1"]) == 0
    for flags, message in [(["--block-size", "3", "--target-layers", "1"], "block_size 4 then, 3 now"),
                           (["--target-layers", "0"], r"target_layers \[1\] then, \[0\] now"),
                           (["--target-layers", "1", "--mask-token-id", "7"], "mask_token_id 511 then, 7 now")]:
        with pytest.raises(ValueError, match=message):
            main(block_args + ["--steps", "4", "--resume"] + flags)

    generated = tmp_path / "mtp"  # a run on generated text whose data file is gone
    mtp_args = ["mtp", "--out", str(generated), "--generate", "4", "--gen-tokens", "16", "--corpus-seqs", "0"]
    assert main(mtp_args + common + ["--steps", "2"]) == 0
    (generated / "data.rank0.npz").unlink()
    with pytest.raises(ValueError, match="data.rank0.npz, the text .*state.pt was trained on, is gone"):
        main(mtp_args + common + ["--steps", "4", "--resume"])
    assert not (generated / "data.rank0.npz").exists()


def test_steps_0_never_replaces_the_data_of_a_trained_head(tiny_hf_dir, tmp_path):
    from specdec.cli.train import main

    out = tmp_path / "mtp"
    args = ["mtp", "--model", str(tiny_hf_dir), "--out", str(out), "--generate", "4", "--gen-tokens", "16",
            "--corpus-seqs", "0", "--val", "1", "--batch", "2", "--seq-len", "24", "--threads", "1", "--device", "cpu"]
    assert main(args + ["--steps", "2"]) == 0
    data = (out / "data.rank0.npz").read_bytes()
    with pytest.raises(ValueError, match="--steps 0 writes training data, and --out .* holds model.safetensors"):
        main(args + ["--steps", "0", "--seed", "5"])
    assert (out / "data.rank0.npz").read_bytes() == data


def test_save_every_checkpoints_without_validation(tiny_hf_dir, tmp_path, monkeypatch):
    """--save-every saved only where validation ran: with --val 0 a long run checkpointed at its end only."""
    from specdec.cli.train import main
    from specdec.train.data import save_sequences
    from specdec.train.loop import Trainer

    seqs = tmp_path / "s.npz"
    save_sequences([[3 + (i * 7 + j) % 190 for j in range(24)] for i in range(8)], seqs)
    saved_at = []
    real = Trainer.checkpoint

    def recording(self):
        saved_at.append(self.step)
        real(self)

    monkeypatch.setattr(Trainer, "checkpoint", recording)
    for val in ("0", "2"):
        saved_at.clear()
        assert main(["mtp", "--model", str(tiny_hf_dir), "--out", str(tmp_path / f"v{val}"), "--sequences", str(seqs),
                     "--steps", "6", "--save-every", "2", "--val", val, "--batch", "2", "--threads", "1",
                     "--device", "cpu"]) == 0
        assert saved_at == [2, 4, 6], val


def test_corpus_and_prompt_edges(tiny_hf_dir, tiny_model, tmp_path):
    """A --seq-len past the target's context trained on corpus chunks past its RoPE tables (IndexError); a
    corpus file without blank lines gave one chunk whatever --corpus-seqs asked; fewer prompts than torchrun
    processes was a ZeroDivisionError on a rank."""
    import argparse
    import random

    from specdec.cli.train import add_arguments, main
    from specdec.train.data import corpus_chunks, load_sequences
    from specdec.train.run import run_training

    words = " ".join(f"word{i % 97} and more{i % 13}." for i in range(800))  # one document, no blank line
    corpus = tmp_path / "lines.txt"
    corpus.write_text(words)
    tok = tiny_model.tokenizer
    n = len(tok.encode(words))
    assert n > 1100
    chunks = corpus_chunks(tok, [words, "a short document of a few words only, here"], 6, 200, random.Random(0))
    assert len(chunks) == 6 and all(9 <= len(c) <= 200 for c in chunks)
    assert sum(c == tok.encode(words)[200:400] for c in chunks) == 1  # later pieces of the long one follow

    out = tmp_path / "long"
    assert main(["mtp", "--model", str(tiny_hf_dir), "--out", str(out), "--data", str(corpus), "--generate", "0",
                 "--corpus-seqs", "4", "--seq-len", "1000", "--val", "1", "--steps", "1", "--batch", "2",
                 "--threads", "1", "--device", "cpu"]) == 0
    seqs = load_sequences(out / "data.rank0.npz")
    assert [len(s) for s in seqs][-4:] == [512] * 4  # 4 corpus chunks of one document, cut to the context

    one = tmp_path / "one.txt"
    one.write_text("a single prompt\n")
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["mtp", "--model", str(tiny_hf_dir), "--out", str(tmp_path / "ranks"), "--prompts", str(one),
                         "--device", "cpu"])
    with pytest.raises(ValueError, match="1 prompts for 2 processes: .*give at least 2"):
        run_training(args, 1, 2, None)


def test_a_failed_write_keeps_the_previous_file_whole(tmp_path):
    from specdec.model.files import replaced

    target = tmp_path / "model.safetensors"
    target.write_bytes(b"the previous head")
    with pytest.raises(RuntimeError, match="killed"):
        with replaced(target) as tmp:
            tmp.write_bytes(b"half of the")
            raise RuntimeError("killed")
    assert target.read_bytes() == b"the previous head" and [p.name for p in tmp_path.iterdir()] == [target.name]
    with replaced(target) as tmp:
        tmp.write_bytes(b"the new head")
    assert target.read_bytes() == b"the new head" and len(list(tmp_path.iterdir())) == 1
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    assert target.stat().st_mode & 0o777 == plain.stat().st_mode & 0o777  # not mkstemp's 0600


def test_sequences_files_and_lengths_that_crashed_mid_training(tmp_path):
    """Sequences under 8 tokens or past the context (IndexError in the RoPE tables) in a --sequences file, a
    --gen-tokens past the context, and a file where the MTP sidecar folder goes (each a traceback before)."""
    from specdec.cli.train import main
    from specdec.train.data import save_sequences

    folder = make_hf_model(tmp_path / "m")  # context 512
    odd = tmp_path / "odd.npz"
    save_sequences([[5] * 3, [6, 7], list(range(1, 501)) + list(range(1, 101))] + [list(range(9, 40))] * 6, odd)
    out = tmp_path / "e"
    assert main(["eagle3", "--model", str(folder), "--out", str(out), "--sequences", str(odd), "--val", "2",
                 "--steps", "2", "--batch", "2", "--draft-vocab", "64", "--device", "cpu", "--threads", "1"]) == 0
    assert json.loads((out / "train_summary.json").read_text())["sequences"] == 7  # the two short ones left out
    with pytest.raises(ValueError, match=r"--gen-tokens 600 after a prompt of up to --seq-len/2 = 192 tokens passes "
                                         r"the target's context of 512"):
        main(["mtp", "--model", str(folder), "--out", str(tmp_path / "g"), "--gen-tokens", "600", "--device", "cpu"])
    (tmp_path / "m.mtp").write_text("not a folder")
    with pytest.raises(ValueError, match="m.mtp"):
        main(["mtp", "--model", str(folder), "--steps", "1", "--device", "cpu"])


def test_a_huge_prompt_is_cut_before_it_is_encoded(tiny_model):
    from specdec.train.data import chat_prompt_ids

    text = "the quick brown fox " * 50_000
    assert chat_prompt_ids(tiny_model.tokenizer, text, 32)[-32:] == chat_prompt_ids(tiny_model.tokenizer, text)[-32:]


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
def test_torchrun_trains_data_parallel(trained, tmp_path, kind):
    """Two CPU processes under torchrun (gloo, DDP): each writes its share of the data, rank 0 the head;
    EAGLE-3's draft vocabulary is counted over both shares."""
    import os
    import subprocess
    import sys

    from safetensors.torch import load_file

    from specdec.model.load import open_checkpoint
    from specdec.train.data import answer_marker, answer_start, load_sequences
    from specdec.train.heads import frequent_tokens

    folder, _ = trained
    out = tmp_path / "ddp"
    corpus = tmp_path / "c.txt"
    corpus.write_text("Some plain text for the corpus, repeated. " * 40)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "specdec.cli", "train", kind, "--model", str(folder), "--out", str(out), "--steps", "6",
           "--save-every", "3", "--max-minutes", "5", "--draft-vocab", "64", "--data", str(corpus)] + COMMON
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    # A rank's own last words (a C++ abort's "terminate called ... what()") come before torchrun's report.
    said = [line for line in run.stderr.splitlines() if "terminate" in line or "what()" in line or "Error" in line]
    assert run.returncode == 0, "\n".join(said[:20]) + "\n...\n" + run.stderr[-2000:]
    shares = [load_sequences(out / f"data.rank{r}.npz") for r in (0, 1)]
    assert json.loads((out / "train_summary.json").read_text())["steps"] == 6
    weights = load_file(str(out / "model.safetensors"))  # rank 0 saved a loadable head
    if kind == "eagle3":
        vocab = json.loads((out / "config.json").read_text())["transformer_layer_config"]["vocab_size"]  # speculators
        marker = answer_marker(open_checkpoint(folder)[1])
        answers = [[s[answer_start(s, marker):] for s in share] for share in shares]  # the tokens drafts propose
        expected = frequent_tokens(answers[0] + answers[1], 64, vocab)
        assert torch.equal(torch.arange(64) + weights["d2t"], expected)
        assert not torch.equal(frequent_tokens(answers[0], 64, vocab), expected)  # rank 0 alone would differ


@pytest.mark.parametrize("kind", ["mtp", "eagle3"])
@pytest.mark.parametrize("topk", [1, 3])
def test_trained_heads_draft_and_greedy_equals_plain(trained, kind, topk):
    from specdec.drafters.eagle3 import make_eagle3_drafter
    from specdec.drafters.mtp import make_mtp_drafter

    folder, eagle_dir = trained
    m = load_model(str(folder), "fp32", progress=False)
    drafter = (make_mtp_drafter(m, max_len=256, topk=topk, budget=8) if kind == "mtp"
               else make_eagle3_drafter(m, str(eagle_dir), max_len=256, topk=topk, budget=8))
    engine = Engine(m, SpecConfig(drafters=(drafter.name,), draft_n_max=3), max_len=256,
                    drafter_factory=lambda name, spec: drafter)
    prompt = list(range(10, 30))
    plain = Engine(m, SpecConfig(), max_len=256).generate(prompt, max_tokens=48).token_ids
    result = engine.generate(prompt, max_tokens=48)
    assert result.token_ids == plain
    assert result.stats.accepted > 0


def test_auto_finds_the_mtp_head_beside_the_model(trained):
    from helpers.spec import spec_for_model

    folder, _ = trained
    m = load_model(str(folder), "fp32", progress=False)
    spec, reasons = spec_for_model(m)
    assert "draft-mtp" in spec.types
    assert any("MTP head beside the model" in r for r in reasons)


# EAGLE-3 drafts through the same tree code (drafters/tree.py) and verifier; its tiny head trained here
# is too weak (~13% top-1) to get tree nodes accepted often enough for this test, the MTP head (~38%) is not.
@pytest.mark.parametrize("kind", ["mtp"])
def test_sampled_tree_keeps_the_target_distribution(trained, kind):
    """Seeded chi-square: (t1, t2, t3) from speculative sampling with a tree drafter vs the exact target law."""
    from specdec.drafters.eagle3 import make_eagle3_drafter
    from specdec.drafters.mtp import make_mtp_drafter

    folder, eagle_dir = trained
    m = load_model(str(folder), "fp32", progress=False)
    sampling = dict(temperature=1.0, top_k=3)
    # a context the target itself would write (what the heads were trained on)
    prompt = [40, 41, 42] + Engine(m, SpecConfig(), max_len=64).generate([40, 41, 42], max_tokens=6).token_ids

    law = engine_law(m, prompt, SamplingParams(**sampling))
    drafter = (make_mtp_drafter(m, max_len=64, topk=2, budget=6) if kind == "mtp"
               else make_eagle3_drafter(m, str(eagle_dir), max_len=64, topk=2, budget=6))
    engine = Engine(m, SpecConfig(drafters=(drafter.name,), draft_n_max=3), max_len=64,
                    drafter_factory=lambda name, spec: drafter)
    counts, _, accepted = sample_continuations(engine, prompt, 1500, **sampling)
    assert accepted > 50, "tree drafts were (almost) never accepted: the test would not exercise tree verification"
    assert fit_pvalue(counts, law) > 1e-3, f"sampled continuations do not follow the target's law: {counts}"


def test_eagle3_trains_on_a_two_layer_target(tiny_hf_dir, tmp_path):
    """Its default taps included layer -1 (N - 3): a KeyError at the first step."""
    from specdec.cli.train import main

    out = tmp_path / "eagle3"
    assert main(["eagle3", "--model", str(tiny_hf_dir), "--out", str(out), "--steps", "2", "--draft-vocab", "64"]
                + COMMON) == 0
    taps = json.loads((out / "config.json").read_text())["eagle_aux_hidden_state_layer_ids"]  # speculators' name
    assert taps == [2, 1, 0]
    from specdec.drafters.eagle3 import make_eagle3_drafter

    m = load_model(str(tiny_hf_dir), "fp32", progress=False)
    drafter = make_eagle3_drafter(m, str(out), max_len=128, topk=1, budget=4)
    engine = Engine(m, SpecConfig(drafters=(drafter.name,), draft_n_max=3), max_len=128,
                    drafter_factory=lambda name, spec: drafter)
    prompt = list(range(10, 30))
    result = engine.generate(prompt, max_tokens=16)
    assert result.token_ids == Engine(m, SpecConfig(), max_len=128).generate(prompt, max_tokens=16).token_ids
    assert result.stats.drafted > 0


def test_bad_training_input_is_one_clear_error(tiny_hf_dir, tmp_path):
    import numpy as np

    from specdec.cli.train import main
    from specdec.train.data import load_sequences, save_sequences

    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip file")
    with pytest.raises(ValueError, match="not a training-sequence file written by specdec train"):
        load_sequences(garbage)
    lying = tmp_path / "lying.npz"
    np.savez_compressed(lying, tokens=np.arange(10, dtype=np.uint16), lengths=np.array([4, 4]))
    with pytest.raises(ValueError, match="lengths add up to 8 tokens but the file holds 10"):
        load_sequences(lying)
    few = tmp_path / "few.npz"
    save_sequences([[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 4, few)
    assert load_sequences(few) == [[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 4
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(few.read_bytes()[:-20])  # was a BadZipFile traceback
    with pytest.raises(ValueError, match="truncated.npz: not a training-sequence file"):
        load_sequences(truncated)
    floats = tmp_path / "floats.npz"  # trained as token 0 everywhere, with a 'perfect' summary
    np.savez_compressed(floats, tokens=np.full(9, 0.5), lengths=np.array([9]))
    with pytest.raises(ValueError, match="tokens must be a flat array of integers, got float64"):
        load_sequences(floats)
    with pytest.raises(ValueError, match="token id 9 is outside the target's vocabulary of 9"):  # was IndexError
        load_sequences(few, vocab_size=9)
    negative = tmp_path / "negative.npz"
    np.savez_compressed(negative, tokens=np.array([1, -2, 3]), lengths=np.array([3]))
    with pytest.raises(ValueError, match="token id -2 is negative"):
        load_sequences(negative)
    with pytest.raises(ValueError, match="4 training sequences and --val 8 held out: none left to train on"):
        main(["mtp", "--model", str(tiny_hf_dir), "--sequences", str(few), "--val", "8", "--steps", "3",
              "--out", str(tmp_path / "o"), "--device", "cpu"])


@pytest.mark.parametrize("flags, message", [
    (["--target-layers", "1,99"], "--target-layers [1, 99]: the target has layers 0..1 (-1: the embeddings)"),
    (["--target-layers", "1;2"], "--target-layers '1;2': give layer numbers separated by commas"),
    (["--mask-token-id", "100000"], "--mask-token-id 100000 is outside the vocabulary"),
    (["--seed", str(2**70)], "--seed must be between -2**62 and 2**62"),  # 'Overflow when unpacking long long'
    (["--gen-temperature", "-1"], "--gen-temperature must be 0 (greedy) or a positive number, got -1.0"),
    (["--gen-temperature", "nan"], "--gen-temperature must be 0 (greedy) or a positive number, got nan"),
    (["--feature-cache", "-1"], "--feature-cache must be at least 0, got -1.0"),
])
def test_block_training_settings_are_checked_before_any_data_is_generated(tiny_hf_dir, tmp_path, flags, message):
    from specdec.cli.train import main

    out = tmp_path / "o"
    with pytest.raises(ValueError, match=re.escape(message)):
        main(["dflash", "--model", str(tiny_hf_dir), "--out", str(out), "--device", "cpu", "--steps", "1"] + flags)
    assert not list(out.glob("data.*"))  # refused before minutes of generation, not after


def test_counts_and_files_that_leave_nothing_to_train_on_are_refused_before_generating(tiny_hf_dir, tmp_path):
    from specdec.cli.train import main

    out = tmp_path / "o"
    base = ["mtp", "--model", str(tiny_hf_dir), "--out", str(out), "--device", "cpu", "--steps", "1"]
    with pytest.raises(ValueError, match="--seq-len must be at least 9, got 4"):  # every sequence was dropped
        main(base + ["--seq-len", "4"])
    with pytest.raises(ValueError, match=re.escape("--generate 2 and --corpus-seqs 0 make 2 sequences, and --val 32 "
                                                   "of them are held out: none would be left to train on")):
        main(base + ["--generate", "2", "--corpus-seqs", "0"])
    with pytest.raises(ValueError, match=f"--prompts {tmp_path}/none.txt: No such file or directory"):
        main(base + ["--prompts", str(tmp_path / "none.txt")])
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"hello \xe1\xff\n")
    with pytest.raises(ValueError, match=f"--prompts {binary} is not UTF-8 text"):
        main(base + ["--prompts", str(binary)])
    assert not list(out.glob("data.*"))


def test_a_trained_mtp_head_given_with_md_drafts_for_a_target_without_one(trained, tmp_path):
    """`train mtp --out DIR` then `-md DIR` (alone, or with --spec-type draft-mtp): the head in DIR drafts,
    greedy equals plain; a head for another target and -md that is no MTP head are one clear error."""
    import shutil

    from specdec.drafters.mtp import MTPError
    from helpers.spec import spec_for_model

    folder, _ = trained
    target, head = tmp_path / "target", tmp_path / "head"
    shutil.copytree(folder, target)  # no head beside this copy
    shutil.copytree(folder.with_name(folder.name + ".mtp"), head)
    m = load_model(str(target), "fp32", progress=False)
    assert "draft-mtp" not in spec_for_model(m)[0].types
    prompt = list(range(10, 30))
    plain = Engine(m, SpecConfig(), max_len=256).generate(prompt, max_tokens=32).token_ids
    for flags in (dict(model_draft=str(head)), dict(spec_type="draft-mtp", model_draft=str(head))):
        spec, _ = spec_for_model(m, **flags)
        assert spec.types == ("draft-mtp",) and spec.draft_model == str(head)
        result = Engine(m, spec, max_len=256).generate(prompt, max_tokens=32)
        assert result.token_ids == plain and result.stats.accepted > 0
    with pytest.raises(ValueError, match="that is not an MTP head folder"):
        spec_for_model(m, spec_type="draft-mtp", model_draft=str(target))
    cfg = json.loads((head / "config.json").read_text())
    cfg["specdec"]["target"]["num_layers"] = 7
    (head / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(MTPError, match=f"the MTP head {head} was trained for a target with num_layers 7; "):
        Engine(m, SpecConfig(drafters=("draft-mtp",), draft_model=str(head)), max_len=256).generate(prompt, max_tokens=4)
    from safetensors.torch import load_file, save_file

    cfg["specdec"]["target"]["num_layers"] = m.config.num_layers
    (head / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(str(head / "model.safetensors"))
    enorm = next(k for k in tensors if k.endswith(".enorm.weight"))
    save_file({k: v for k, v in tensors.items() if k != enorm}, str(head / "model.safetensors"))
    with pytest.raises(MTPError, match=f"lacks tensor {enorm}: it is not a whole MTP head"):  # was a KeyError
        Engine(m, SpecConfig(drafters=("draft-mtp",), draft_model=str(head)), max_len=256).generate(prompt, max_tokens=4)


def test_ttt_validation_counts_a_step_only_where_the_steps_before_it_matched(trained):
    """Step s counted every position, matched or not before it, and mean_accept_length multiplies the rates as
    conditional ones: the reported acceptance length under-reported what drafting accepts (2.38 for 2.49)."""
    from specdec.drafters.mtp import load_mtp_head
    from specdec.model.load import open_checkpoint
    from specdec.train.data import load_sequences
    from specdec.train.loop import pad_batch
    from specdec.train.target import DenseTarget
    from specdec.train.ttt import ttt_loss

    folder, eagle_dir = trained
    head, _ = load_mtp_head(load_model(str(folder), "fp32", progress=False), 256)  # the one trained beside it
    target = DenseTarget(open_checkpoint(folder)[0])
    tokens, valid, _ = pad_batch(load_sequences(eagle_dir / "data.rank0.npz")[:8], "cpu")
    with torch.no_grad():
        _, matches, counts = ttt_loss(head, "mtp", target, tokens, valid, 3)
    assert 0 < matches[0] < counts[0]  # a trained head matches some pairs, not all
    for s in range(2):
        assert 0 < counts[s + 1] <= matches[s]  # the pairs that reach step s + 1 matched at steps 0..s


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_resumed_run_trains_the_head_a_straight_run_trains(tiny_hf_dir, tmp_path, kind, monkeypatch):
    """A resume reshuffled the data from seed + step and guessed the position (some sequences came twice in the
    epoch, others never) and drew new DFlash anchors: the head differed from a straight run's. The straight
    run's folder is copied at its step-3 checkpoint (mid-epoch: 9 training sequences, batch 2), as a run
    killed there leaves it, and resumed."""
    import shutil

    from specdec.cli.train import main
    from specdec.train.data import save_sequences
    from specdec.train.loop import Trainer

    checkpoint = Trainer.checkpoint

    def keep_step_3(self):
        checkpoint(self)
        if self.step == 3:
            shutil.copytree(self.out, tmp_path / "resumed")

    monkeypatch.setattr(Trainer, "checkpoint", keep_step_3)

    data = tmp_path / "d.npz"
    save_sequences([[3 + (i * 7 + j) % 190 for j in range(24)] for i in range(11)], data)
    common = [kind, "--model", str(tiny_hf_dir), "--sequences", str(data), "--val", "2", "--batch", "2",
              "--seq-len", "24", "--threads", "1", "--device", "cpu", "--save-every", "3"]
    common += ["--draft-vocab", "32"] if kind == "eagle3" else ["--anchors", "2", "--block-size", "3"]
    assert main(common + ["--out", str(tmp_path / "straight"), "--steps", "9"]) == 0
    monkeypatch.setattr(Trainer, "checkpoint", checkpoint)
    assert main(common + ["--out", str(tmp_path / "resumed"), "--steps", "9", "--resume"]) == 0
    straight = torch.load(tmp_path / "straight" / "state.pt", weights_only=True)["head"]
    resumed = torch.load(tmp_path / "resumed" / "state.pt", weights_only=True)["head"]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_training_text_files_and_splits(tiny_hf_dir, tmp_path):
    """A byte-order mark was read as text; paragraphs of 80 characters or fewer were dropped (a file of short
    Q&A pairs gave no corpus); a .npy --sequences file was a TypeError's traceback; a corpus paragraph was
    encoded whole however little of it was wanted; and with few prompts the held-out sequences took all but
    one, the training sequences all continuing that one."""
    import random

    from specdec.model.load import open_checkpoint
    from specdec.train.data import (build_sequences, chat_prompt_ids, corpus_chunks, load_sequences, read_corpus,
                                    read_prompts)
    from specdec.train.target import DenseTarget

    prompts = tmp_path / "p.txt"
    prompts.write_text("\ufeffWrite a poem about owls.\nSecond one.\n", encoding="utf-8")
    assert read_prompts(str(prompts)) == ["Write a poem about owls.", "Second one."]
    qa = tmp_path / "qa.txt"
    qa.write_text("\n\n".join(f"Q{i}: what is {i}? A: {i}." for i in range(30)), encoding="utf-8")
    docs = read_corpus([str(qa)])
    assert docs and all(len(d) > 80 for d in docs[:-1]) and "Q29: what is 29? A: 29." in docs[-1]
    assert sum(d.count("Q") for d in docs) == 30  # every paragraph kept, joined with its neighbours

    npy = tmp_path / "arr.npy"
    __import__("numpy").save(npy, __import__("numpy").arange(10))
    with pytest.raises(ValueError, match="not a training-sequence file written by specdec train .*single int"):
        load_sequences(npy)

    checkpoint, tok = open_checkpoint(tiny_hf_dir)
    seen = []

    class Counting:
        def __getattr__(self, name):
            return getattr(tok, name)

        def encode(self, text, add_bos=None):
            seen.append(len(text))
            return tok.encode(text, add_bos)

    corpus_chunks(Counting(), ["word " * 200_000], 2, 16, random.Random(0))
    assert max(seen) <= 16 * 16 * 2  # not the million characters

    target = DenseTarget(checkpoint, "cpu")
    few = [f"prompt number {i} about a topic" for i in range(6)]
    seqs = build_sequences(target, tok, few, [], num_generated=12, gen_tokens=2, seq_len=64, num_corpus=0, seed=0,
                           held_out=8)
    starts = {tuple(chat_prompt_ids(tok, p, 32)[-32:]): p for p in few}

    def prompt_of(seq):
        return next(p for ids, p in starts.items() if tuple(seq[: len(ids)]) == ids)

    held, trained = {prompt_of(s) for s in seqs[:8]}, {prompt_of(s) for s in seqs[8:]}
    assert len(seqs) == 12 and not held & trained and len(held) == 3 and len(trained) == 3


def test_the_torchrun_entry_point_says_a_bad_flag_in_one_line(tiny_hf_dir):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "specdec.cli", "train", "mtp", "--model", str(tiny_hf_dir), "--steps",
                          "-1"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == "specdec: error: --steps must be at least 0, got -1"


def test_init_from_goes_on_training_a_trained_head(trained, tmp_path):
    """--init-from: the run starts from the given head (its weights and draft vocabulary), not a fresh one, and
    a folder it cannot start from is refused before any text is generated."""
    from safetensors.torch import load_file

    from specdec.cli.train import main

    folder, eagle_dir = trained
    data = ["--sequences", str(eagle_dir / "data.rank0.npz")]
    flags = ["--model", str(folder), "--steps", "1", "--draft-vocab", "128"] + COMMON + data + ["--lr", "1e-12"]
    assert main(["eagle3", "--init-from", str(eagle_dir), "--out", str(tmp_path / "on")] + flags) == 0
    assert main(["eagle3", "--out", str(tmp_path / "fresh")] + flags) == 0
    theirs = load_file(eagle_dir / "model.safetensors")
    went_on, fresh = (load_file(tmp_path / d / "model.safetensors") for d in ("on", "fresh"))
    assert torch.equal(went_on["d2t"], theirs["d2t"])  # 256 draft ids, not --draft-vocab 128 of the data
    assert len(fresh["d2t"]) == 128
    for name, t in theirs.items():  # one step at lr 1e-12: the trained weights, not a fresh head's
        assert torch.allclose(went_on[name].float(), t.float(), atol=1e-2), name
    summary = json.loads((tmp_path / "on" / "train_summary.json").read_text())
    trained_acc = json.loads((eagle_dir / "train_summary.json").read_text())["val_top1_per_step"][0]
    assert summary["val_top1_per_step"][0] > 0.5 * trained_acc > json.loads(
        (tmp_path / "fresh" / "train_summary.json").read_text())["val_top1_per_step"][0]

    with pytest.raises(ValueError, match="--init-from goes on training EAGLE-3 heads"):
        main(["mtp", "--init-from", str(eagle_dir), "--out", str(tmp_path / "m")] + flags)
    with pytest.raises(ValueError, match="no such|not a folder|does not exist|config.json"):
        main(["eagle3", "--init-from", str(tmp_path / "nothing"), "--out", str(tmp_path / "n")] + flags)
    assert not (tmp_path / "m").exists()
    assert not any((tmp_path / "n").iterdir())  # refused before anything was generated or written


def test_gen_temperature_0_writes_the_targets_greedy_answers(tiny_hf_dir, tmp_path):
    """--gen-temperature 0: the answers are the target's greedy ones, whatever the seed; 0.7 samples."""
    from specdec.cli.train import main
    from specdec.train.data import load_sequences

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Name a colour.\nCount to five.\nSay hello.\nWhat is two plus two?\n")

    def data(temperature, seed):  # the four prompts, each once, in an order the seed draws
        out = tmp_path / f"t{temperature}-s{seed}"
        assert main(["mtp", "--model", str(tiny_hf_dir), "--out", str(out), "--device", "cpu", "--steps", "0",
                     "--prompts", str(prompts), "--generate", "4", "--gen-tokens", "12", "--corpus-seqs", "0",
                     "--val", "0", "--gen-engine", "dense", "--gen-temperature", str(temperature), "--seed",
                     str(seed)]) == 0
        return sorted(load_sequences(out / "data.rank0.npz"))

    greedy = data(0, 1)
    assert greedy == data(0, 2)
    assert data(0.7, 1) != data(0.7, 2)
    from specdec.model.load import open_checkpoint
    from specdec.train.target import DenseTarget
    target = DenseTarget(open_checkpoint(tiny_hf_dir)[0])
    for s in greedy:  # an answer's last token is the target's argmax after what precedes it
        logits, _ = target.forward(torch.tensor([s[:-1]]))
        assert s[-1] == int(logits[0, -1].argmax())
