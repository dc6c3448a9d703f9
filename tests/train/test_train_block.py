"""`specdec train dflash|dspark`: the block loss's masks and labels, and end to end on a tiny target: the
saved drafters load in the published layout, draft, get accepted, and stay lossless."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.tiny import make_hf_model
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model.load import load_model
from specdec.train.data import load_sequences

COMMON = ["--generate", "64", "--gen-tokens", "48", "--corpus-seqs", "8", "--batch", "8", "--val", "8",
          "--seq-len", "64", "--lr", "1e-2", "--threads", "1", "--device", "cpu", "--block-size", "4",
          "--anchors", "8", "--draft-layers", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from specdec.cli.train import main

    root = tmp_path_factory.mktemp("train-block")
    folder = make_hf_model(root / "tiny", layers=6)
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog." * 3 for i in range(20)))
    data = root / "dflash" / "data.rank0.npz"
    # greedy answers: the losses score the answers only, and a random tiny target's sampled ones are noise
    assert main(["dflash", "--model", str(folder), "--out", str(root / "dflash"), "--steps", "300",
                 "--save-every", "150", "--data", str(corpus), "--gen-temperature", "0"] + COMMON) == 0
    assert main(["dspark", "--model", str(folder), "--out", str(root / "dspark"), "--steps", "150",
                 "--save-every", "75", "--sequences", str(data), "--markov-rank", "16"] + COMMON) == 0
    return folder, root


def test_default_target_layers_are_dflash_s():
    from specdec.drafters.block.config import default_target_layers

    assert default_target_layers(36, 5) == (1, 9, 17, 25, 33)  # DeepSpec's Qwen3-4B configs
    assert default_target_layers(6, 1) == (3,) and default_target_layers(6, 2) == (1, 3)


def test_anchors_are_real_tokens_followed_by_one():
    from specdec.train.block_loss import sample_anchors

    valid = torch.tensor([[True] * 10, [True] * 3 + [False] * 7])
    anchors, keep = sample_anchors(valid, 4, torch.Generator().manual_seed(0))
    assert anchors.shape == keep.shape == (2, 4)
    assert keep[0].all() and keep[1].tolist() == [True, True, False, False]
    assert sorted(anchors[0].tolist()) == anchors[0].tolist() and all(0 <= a < 9 for a in anchors[0].tolist())
    assert set(anchors[1, :2].tolist()) == {0, 1} and len(set(anchors[0].tolist())) == 4


def test_block_loss_sees_the_context_strictly_before_the_anchor(tiny_model):
    """A token at or after the anchor moves no draft of that block's loss through the context (only
    through the labels); a token before it does."""
    from specdec.model.load import open_checkpoint
    from specdec.train.block_loss import block_loss
    from specdec.train.heads import build_block_model
    from specdec.train.target import DenseTarget

    checkpoint, _ = open_checkpoint(tiny_model.info.path)
    target = DenseTarget(checkpoint)
    model = build_block_model(target, "dflash", 4, 1, (0, 1), 300)
    tokens = torch.arange(20, 40)[None]
    valid = torch.ones_like(tokens, dtype=torch.bool)
    anchors, keep = torch.tensor([[10]]), torch.tensor([[True]])

    def rows(toks):
        captured = {}
        real = model.blocks

        def spy(*a):
            captured["h"] = real(*a)
            return captured["h"]

        model.blocks = spy
        with torch.no_grad():
            block_loss(model, target, toks, valid, anchors, keep)
        del model.blocks
        return captured["h"][0, :3]  # the block's anchor row and two MASK rows

    base = rows(tokens)
    later = tokens.clone()
    later[0, 10:] = 7  # the anchor itself and everything after: not context
    later_rows = rows(later)
    earlier = tokens.clone()
    earlier[0, 3] = 7
    assert not torch.allclose(rows(earlier)[1:], base[1:])
    assert torch.allclose(later_rows[1:], rows(torch.cat([tokens[:, :10], later[:, 10:11], tokens[:, 11:]], 1))[1:])


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_training_writes_published_folders_that_learn(trained, kind):
    folder, root = trained
    out = root / kind
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == (["DFlashDraftModel"] if kind == "dflash" else ["Qwen3DSparkModel"])
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["steps"] == (300 if kind == "dflash" else 150)
    assert summary["val_top1_per_step"][0] > 0.1  # a random drafter agrees with the target ~1/512 of the time


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_trained_drafters_are_accepted_and_greedy_equals_plain(trained, kind):
    from specdec.drafters.block.drafter import make_block_drafter

    folder, root = trained
    m = load_model(str(folder), "fp32", progress=False)
    drafter = make_block_drafter(m, root / kind, f"draft-{kind}", max_len=256)
    engine = Engine(m, SpecConfig(drafters=(drafter.name,), draft_n_max=4), max_len=256,
                    drafter_factory=lambda name, spec: drafter)
    # openings of the training text: what the drafter learnt to continue (on an arbitrary prompt, whether a
    # drafter this small gets a token accepted depends on the CPU's float rounding)
    sequences = load_sequences(root / "dflash" / "data.rank0.npz")
    accepted = 0
    for prompt in [list(range(10, 30))] + [seq[:16] for seq in sequences[:3]]:
        plain = Engine(m, SpecConfig(), max_len=256).generate(prompt, max_tokens=48).token_ids
        result = engine.generate(prompt, max_tokens=48)
        assert result.token_ids == plain
        accepted += result.stats.accepted
    assert accepted > 0
