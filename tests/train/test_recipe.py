"""The training recipe: the prompt set (sources, licences, no evaluation text), the held-out split, answers
written by specdec's engine, generation and training that a --resume continues as if never stopped, and the
learning curves."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from specdec.engine.engine import Engine
from specdec.sampling import SamplingParams


def _source_tree(root, eval_prompt_in_csv: str, eval_question: str):
    """A checkout folder laid out as `recipe fetch` leaves it, each source in its own format."""
    gsm = root / "openai+grade-school-math" / "grade_school_math" / "data"
    gsm.mkdir(parents=True)
    rows = [{"question": f"Tom has {i} apples and buys {i + 3} more. How many apples does he have now?",
             "answer": "#### 1"} for i in range(5)] + [{"question": eval_question, "answer": "#### 18"}]
    gsm.joinpath("train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name in ("acronym", "old-one"):
        ex = root / "exercism+problem-specifications" / "exercises" / name
        ex.mkdir(parents=True)
        ex.joinpath("description.md").write_text(f"# Description\n\nConvert a phrase to its {name}.\n\n"
                                                 "~~~~exercism/note\nA note.\n~~~~\n[link]: https://x\n")
    (root / "exercism+problem-specifications" / "exercises" / "old-one" / ".deprecated").write_text("")
    concept = root / "exercism+python" / "exercises" / "concept" / "lists" / ".docs"
    concept.mkdir(parents=True)
    concept.joinpath("instructions.md").write_text("# Instructions\n\nWrite functions on lists of cards.\n")
    csv_dir = root / "f+awesome-chatgpt-prompts"
    csv_dir.mkdir()
    csv_dir.joinpath("prompts.csv").write_text(
        '"act","prompt"\n"Poet","I want you to act as a poet. My first request is ""I need a poem about rain."""\n'
        f'"Blogger","{eval_prompt_in_csv}"\n')


def test_the_prompt_set_keeps_evaluation_text_out_and_records_its_sources(tmp_path):
    """Any prompt holding a run of evaluation text (the known MT-Bench / GSM8K-test prompts, an --exclude file's,
    the bench's own) is dropped; every source is recorded with its repository, commit and licence."""
    from specdec.bench.prompts import SETS
    from specdec.train.data import builtin_prompts, read_prompts
    from specdec.train.recipe import KNOWN_EVAL, SOURCES, build, words

    mt_bench = KNOWN_EVAL["mt-bench"][0]
    gsm_test = KNOWN_EVAL["gsm8k-test"][0] + " She sells the remainder at the farmers' market daily."
    _source_tree(tmp_path / "src", "Please " + mt_bench.lower(), gsm_test)
    excluded = tmp_path / "test.jsonl"  # an evaluation set given with --exclude, in GSM8K's format
    excluded.write_text(json.dumps({"question": "Tom has 2 apples and buys 5 more. How many apples does he "
                                                "have now?", "answer": "#### 7"}) + "\n")
    out = tmp_path / "prompts.jsonl"
    meta = build(tmp_path / "src", out, [excluded])
    prompts = read_prompts(str(out))
    every_eval = [t for group in KNOWN_EVAL.values() for t in group]
    every_eval += [p.text or p.messages[-1]["content"] for ps in SETS.values() for p in ps]
    for text in every_eval + ["Tom has 2 apples and buys 5 more."]:
        key = " ".join(words(text))[:60]
        assert not any(key in " ".join(words(p)) for p in prompts), text
    by_name = {s["name"]: s for s in meta["sources"]}
    assert by_name["gsm8k-train"]["dropped_as_eval_text"] == 2 and by_name["gsm8k-train"]["prompts"] == 4
    assert by_name["awesome-chatgpt-prompts"]["dropped_as_eval_text"] == 1
    assert by_name["exercism-problems"]["prompts"] == 2  # the deprecated one left out, the other in 2 languages
    assert {s.name: (s.repo, s.commit, s.licence) for s in SOURCES} == {
        n: (by_name[n]["repo"], by_name[n]["commit"], by_name[n]["license"]) for n in by_name if n != "specdec-builtin"}
    assert all(s.licence in ("MIT", "CC0-1.0") for s in SOURCES)
    assert not any("~~~~" in p or "[link]:" in p or p.startswith("# ") for p in prompts)
    first = json.loads(out.read_text().splitlines()[0])
    assert first["_meta"]["sources"][0]["license"] == "MIT"
    assert len(prompts) == len(set(prompts)) == 4 + 2 + 1 + 1 + len(set(builtin_prompts()))
    # the built-in prompts hold no evaluation text either
    from specdec.train.recipe import Decontaminator, eval_texts

    assert not any(Decontaminator(eval_texts()).hit(p) for p in builtin_prompts())


def test_bad_prompt_files_are_one_clear_error(tmp_path):
    from specdec.train.data import read_prompts
    from specdec.train.recipe import build

    bad = tmp_path / "p.jsonl"
    bad.write_text('{"_meta": {}}\n{"prompt": "no text field"}\n')
    with pytest.raises(ValueError, match=r"p.jsonl line 2: an object with a \"text\" string is wanted"):
        read_prompts(str(bad))
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(ValueError, match="p.jsonl line 2: not JSON"):
        read_prompts(str(bad))
    with pytest.raises(ValueError, match="none of grade_school_math/data/train.jsonl is there; run `python -m "
                                         "specdec.train.recipe fetch`"):
        build(tmp_path / "empty", tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


class _Echo:
    """A writer that answers each prompt with one token: fast, and the prompt stays readable in the output."""

    def generate(self, prompts, max_new, temperature, eos, generator):
        return [list(p) + [int(torch.randint(3, 200, (1,), generator=generator))] for p in prompts]


def test_the_held_out_split_never_shares_a_prompt_with_training(tiny_model):
    """A prompt given twice (a set with duplicates) could continue on both sides of the split: the
    validation sequences then measured text whose prompt the head had trained on."""
    from specdec.train.data import build_sequences, chat_prompt_ids

    tok = tiny_model.tokenizer
    base = [f"prompt number {i} about a topic" for i in range(10)]
    prompts = base + base[:5] + base[::-1]  # duplicates, as a merged set has them
    seqs = build_sequences(_Echo(), tok, prompts, [], num_generated=40, gen_tokens=1, seq_len=64, num_corpus=0,
                           seed=3, held_out=6, batch=7)
    starts = {tuple(chat_prompt_ids(tok, p, 32)[-32:]): p for p in base}

    def prompt_of(seq):
        return next(p for ids, p in starts.items() if tuple(seq[: len(ids)]) == ids)

    held, trained = {prompt_of(s) for s in seqs[:6]}, {prompt_of(s) for s in seqs[6:]}
    assert len(seqs) == 40 and held and trained and not held & trained


def test_generation_goes_on_after_an_interruption_as_if_never_stopped(tiny_model):
    """Each batch samples from its own seed, so a run stopped after some batches and continued from what it
    kept (done=) writes the same sequences as one that ran through."""
    from specdec.train.data import build_sequences

    tok = tiny_model.tokenizer
    prompts = [f"write about thing {i}" for i in range(9)]
    args = dict(num_generated=9, gen_tokens=1, seq_len=64, num_corpus=0, seed=1, held_out=2, batch=2)
    straight = build_sequences(_Echo(), tok, prompts, [], **args)
    kept = []

    def stop_after_two(so_far):
        kept[:] = so_far
        if len(so_far) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_sequences(_Echo(), tok, prompts, [], **args, on_chunk=stop_after_two)
    assert build_sequences(_Echo(), tok, prompts, [], **args, done=kept) == straight
    with pytest.raises(ValueError, match="3 sequences already generated is not a whole number of batches of 2"):
        build_sequences(_Echo(), tok, prompts, [], **args, done=kept[:3])


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_engine_writes_what_plain_decoding_writes(tiny_model, temperature):
    """EngineGenerator runs several sequences a step: each answer is the one the engine gives that prompt alone
    with the same seed (greedy: plain greedy decoding), in prompt order, cut before EOS, whatever the slots."""
    from specdec.train.engine_gen import EngineGenerator

    tok = tiny_model.tokenizer
    prompts = [tok.encode(f"Tell me about item {i} and more") for i in range(5)]
    eos = set(tok.eos_ids)
    outs = []
    for slots in (1, 3):
        gen = EngineGenerator(tiny_model, slots, 64)
        outs.append(gen.generate(prompts, 12, temperature, eos, torch.Generator().manual_seed(7)))
        assert gen.tokens > 0
    assert outs[0] == outs[1]
    seeds = torch.randint(0, 2**62, (5,), generator=torch.Generator().manual_seed(7)).tolist()
    alone = Engine(tiny_model, max_len=64)
    for p, s, got in zip(prompts, seeds, outs[0]):
        ref = alone.generate(p, SamplingParams(temperature=temperature, seed=s), max_tokens=12)
        assert got == p + ref.token_ids


def test_curves_are_written_and_a_resumed_run_repeats_them(tiny_hf_dir, tmp_path, monkeypatch):
    """Validation at every epoch's end and every checkpoint, with its loss, into curves.json / curves.png; a run
    killed after a checkpoint and resumed writes the history and the head an uninterrupted run writes."""
    from specdec.cli.train import main
    from specdec.train.data import save_sequences
    from specdec.train.loop import Trainer

    checkpoint = Trainer.checkpoint

    def keep_step_4(self):
        checkpoint(self)
        if self.step == 4:
            shutil.copytree(self.out, tmp_path / "resumed")

    monkeypatch.setattr(Trainer, "checkpoint", keep_step_4)
    data = tmp_path / "d.npz"
    save_sequences([[3 + (i * 7 + j) % 190 for j in range(20)] for i in range(9)], data)
    common = ["eagle3", "--model", str(tiny_hf_dir), "--sequences", str(data), "--val", "2", "--batch", "2",
              "--seq-len", "20", "--threads", "1", "--device", "cpu", "--save-every", "4", "--draft-vocab", "32",
              "--ttt", "2", "--steps", "10"]
    assert main(common + ["--out", str(tmp_path / "straight")]) == 0
    monkeypatch.setattr(Trainer, "checkpoint", checkpoint)
    assert main(common + ["--out", str(tmp_path / "resumed"), "--resume"]) == 0
    curves = json.loads((tmp_path / "straight" / "curves.json").read_text())["history"]
    # 7 training sequences, batch 2: epochs end after steps 3, 6, 9; checkpoints at 4, 8, 10
    assert [h["step"] for h in curves] == [3, 4, 6, 8, 9, 10]
    assert all(h["val_loss"] > 0 and h["train_loss"] > 0 and len(h["val_acc"]) == 2 for h in curves)
    assert curves[-1]["tokens"] == 10 * 2 * 20
    assert (tmp_path / "straight" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "resumed" / "curves.json").read_text())["history"] == curves
    straight = torch.load(tmp_path / "straight" / "state.pt", weights_only=True)["head"]
    resumed = torch.load(tmp_path / "resumed" / "state.pt", weights_only=True)["head"]
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    summary = json.loads((tmp_path / "straight" / "train_summary.json").read_text())
    assert summary["curves"] == "curves.json" and summary["train_tokens_per_s"] > 0
    assert torch.load(tmp_path / "straight" / "state.pt", weights_only=True)["settings"]["ttt"] == 2
