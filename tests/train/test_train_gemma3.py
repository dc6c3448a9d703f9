"""Heads trained on a Gemma 3 target draft tokens the runtime accepts, and keep greedy output.

The training target (train/target.py) recomputes Gemma 3's parts (embedding scale, four norms per
block, GeGLU, the attention scale, sliding-window layers with their own RoPE base, the logit
softcap); a head trained against another forward than the runtime's accepts nothing. The target is
a tiny Gemma 3 GGUF as llama.cpp's converter writes it (norm weights shifted by one, no output
matrix), so the GGUF reading of those parts is under test too.
"""

from __future__ import annotations

import pytest
import torch

from helpers.tiny import make_gemma3_gguf_model
from specdec.drafters.eagle3 import make_eagle3_drafter
from specdec.drafters.mtp import make_mtp_drafter
from specdec.engine.config import SpecConfig
from specdec.engine.engine import Engine
from specdec.model.load import load_model, open_checkpoint
from specdec.cli.train import main
from specdec.train.target import DenseTarget

COMMON = ["--generate", "32", "--gen-tokens", "48", "--corpus-seqs", "8", "--batch", "8", "--val", "8",
          "--seq-len", "64", "--lr", "3e-3", "--ttt", "2", "--threads", "1", "--device", "cpu"]
# six layers, the last one global (the pattern llama.cpp assumes for gemma3 files); a window of 4 that a
# 64-token sequence crosses many times
CONFIG = dict(layers=6, window=4)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Gemma 3 GGUF with an MTP head trained beside it and an EAGLE-3 head in its own folder."""
    root = tmp_path_factory.mktemp("gemma3_heads")
    gguf = make_gemma3_gguf_model(root / "gemma.gguf", **CONFIG)
    corpus = root / "corpus.txt"
    corpus.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog. " * 3 for i in range(8)))
    assert main(["eagle3", "--model", str(gguf), "--out", str(root / "eagle3"), "--steps", "120",
                 "--draft-vocab", "256", "--data", str(corpus)] + COMMON) == 0
    assert main(["mtp", "--model", str(gguf), "--sequences", str(root / "eagle3" / "data.rank0.npz"),
                 "--steps", "120"] + COMMON) == 0
    return gguf, root / "eagle3"


def test_the_training_target_reads_a_gemma3_gguf_as_the_runtime(trained):
    """The strong check: the target the heads were trained against gives the runtime's logits and taps
    on the same file (a random tiny model's continuations are repetitive enough that a head trained
    against a wrong forward can still be accepted sometimes)."""
    gguf, _ = trained
    prompt = [(7 * i + 3) % 500 for i in range(24)]  # six windows long
    model = load_model(str(gguf), "fp32", progress=False)
    tr = model.transformer
    out = tr.forward(torch.tensor([prompt]), tr.new_cache(64), [0], hidden_layers=(2,), exact=True)
    logits, hidden = DenseTarget(open_checkpoint(gguf)[0]).forward(torch.tensor([prompt]), hidden_layers=(2,))
    torch.testing.assert_close(logits[0], out.logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hidden[2][0], out.hidden[2][0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_gemma3_trained_heads_draft_and_keep_greedy_output(trained, kind):
    """Trees of two children per node on a GGUF Gemma 3: output identical to plain decoding, drafts accepted."""
    gguf, eagle_dir = trained
    model = load_model(str(gguf), "fp32", progress=False)
    assert model.config.sliding_layers == (0, 1, 2, 3, 4) and model.config.sandwich_norms
    drafter = (make_eagle3_drafter(model, str(eagle_dir), max_len=256, topk=2, budget=4) if kind == "eagle3"
               else make_mtp_drafter(model, max_len=256, topk=2, budget=4))
    engine = Engine(model, SpecConfig(drafters=(drafter.name,), draft_n_max=3), max_len=256,
                    drafter_factory=lambda name, spec: drafter)
    plain = Engine(model, max_len=256)
    accepted = 0
    for prompt in (list(range(10, 30)), [40, 41, 42, 43] * 3):
        result = engine.generate(prompt, max_tokens=48)
        assert result.token_ids == plain.generate(prompt, max_tokens=48).token_ids
        assert result.stats.drafted > 0
        accepted += result.stats.accepted
    assert accepted > 0, f"the {kind} head trained on Gemma 3 had no draft accepted: trained against another forward?"
