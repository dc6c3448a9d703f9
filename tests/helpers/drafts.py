"""Drafters that disagree with their target on purpose, for the lossless matrix (tests/lossless).

A draft that is the target itself is always accepted and a random one always rejected: neither
makes verification choose. These are drafts that are accepted at some steps and rejected at
others, so that both branches of every verifier run:

    perturbed_hf_model    the tiny target's weights plus noise (draft-simple, same tokenizer)
    permuted_vocab_model  the tiny target's weights under another tokenizer (ids permuted)
    random_sharing_tokenizer  a random 2-layer model with a loaded model's tokenizer (rejected)
    biased                logits plus a bias towards tokens the target can emit (random heads)
    random_mtp_head, block_config, random_block_model, save_random_block_drafter
                          random MTP / DFlash / DSpark heads for any loaded target
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from helpers.tiny import SPECIALS, make_hf_model, random_weights, tiny_config, write_tokenizer_json


# -- draft models ---------------------------------------------------------------------------------
def perturbed_hf_model(folder: Path, scale: float = 0.3, seed: int = 1, **sizes) -> Path:
    """The tiny target of make_hf_model (seed 0, same sizes) with every tensor moved by
    scale x its standard deviation of noise: its distributions are near the target's, not equal."""
    weights = random_weights(tiny_config(**sizes), 0)
    g = torch.Generator().manual_seed(seed)
    noisy = {k: v + scale * v.std() * torch.randn(v.shape, generator=g) for k, v in weights.items()}
    return make_hf_model(folder, extra_tensors=noisy, **sizes)


def permuted_vocab_model(folder: Path, vocab: int = 512, seed: int = 0) -> Path:
    """The tiny target of make_hf_model (same seed) under another tokenizer: the same byte-level
    BPE with the ids of every non-special token reversed (3 <-> vocab-1, ...), embedding and output
    rows moved with them. Text encodes to other ids, so draft-simple needs --spec-cross-tokenizer;
    on a text the target's ids round-trip, the draft predicts what the target predicts."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    n = len(SPECIALS)
    new_id = list(range(n)) + [vocab - 1 - (i - n) for i in range(n, vocab)]  # target id -> draft id
    old_id = torch.tensor(sorted(range(vocab), key=new_id.__getitem__))  # draft id -> target id
    cfg = tiny_config(vocab=vocab)
    weights = random_weights(cfg, seed)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        weights[name] = weights[name][old_id]
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))

    write_tokenizer_json(folder, vocab, ids=new_id)
    return folder


def random_sharing_tokenizer(folder: Path, model, seed: int = 7) -> Path:
    """A random 2-layer llama (hidden 64) with `model`'s tokenizer, vocabulary and EOS, so that
    draft-simple's compatibility check passes and its drafts are (almost) always rejected."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = tiny_config("llama", vocab=model.config.vocab_size, hidden=64, layers=2)
    cfg["eos_token_id"] = model.tokenizer.eos_ids[0]
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(random_weights(cfg, seed=seed), str(folder / "model.safetensors"))
    model.tokenizer.backend.save(str(folder / "tokenizer.json"))
    bos = model.tokenizer.token_text(model.tokenizer.bos_id) if model.tokenizer.bos_id is not None else None
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False, "bos_token": bos}))
    return folder


# -- nudged heads ---------------------------------------------------------------------------------
class Biased(nn.Module):
    """inner(x) + bias: an output head whose logits lean towards some tokens. bias: (V,)."""

    def __init__(self, inner, bias: torch.Tensor):
        super().__init__()
        self.inner = inner
        self.register_buffer("bias", bias.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + self.bias


def likely_bias(model, tokens, vocab: int | None = None, size: float = 6.0) -> torch.Tensor:
    """(V,): `size` at `tokens` (e.g. those the target can emit in a test), 0 elsewhere. A random head's
    logits plus this draft those tokens, so its drafts are accepted at some steps, rejected at others."""
    bias = torch.zeros(vocab or model.config.vocab_size)
    bias[sorted(set(tokens))] = size
    return bias


def random_mtp_head(model, lm_head, seed: int = 0, max_len: int = 512):
    """One MTP module with random weights (torch's default init) over `model`'s embedding and final norm;
    lm_head: the output head it uses ((M, H) -> (M, V) logits), e.g. Biased(target's lm_head, bias)."""
    from specdec.drafters.mtp import MTPHead

    tr = model.transformer
    torch.manual_seed(seed)
    return MTPHead(model.config, 1, tr.embed, lm_head, tr.norm, max_positions=max_len + 64).eval()


def block_config(model, layout: str, block_size: int = 4):
    """A 1-layer DFlash / DSpark config for `model` (any size): DFlash reads target layers 0 and the
    middle one, DSpark the embeddings and the middle one, as their published configs do."""
    from specdec.drafters.block.config import BlockConfig

    c = model.config
    mid = c.num_layers // 2
    cfg = BlockConfig(layout=layout, hidden_size=c.hidden_size, num_layers=1, num_heads=4, num_kv_heads=2,
                      head_dim=16, intermediate_size=96, vocab_size=c.vocab_size,
                      target_layer_ids=(0, mid) if layout == "dflash" else (-1, mid), mask_token_id=c.vocab_size - 1,
                      block_size=block_size, num_target_layers=c.num_layers, rms_norm_eps=1e-6, rope_theta=10000.0,
                      max_positions=4096)
    if layout == "dspark":
        cfg = replace(cfg, markov_rank=8, markov_head_type="vanilla", confidence_head=True,
                      confidence_with_markov=True, num_anchors=64)
    return cfg


def random_block_model(model, layout: str, bias: torch.Tensor | None = None, seed: int = 0, max_len: int = 512):
    """A random BlockDraftModel for `model`; bias: (V,) added to its logits (the target's lm_head's)."""
    from specdec.drafters.block.model import BlockDraftModel, TargetParts

    parts = TargetParts.of(model)
    if bias is not None:
        parts = replace(parts, lm_head=Biased(parts.lm_head, bias))
    torch.manual_seed(seed)
    return BlockDraftModel(block_config(model, layout), parts, max_positions=max_len + 16).eval()


def save_random_block_drafter(model, layout: str, folder: Path, seed: int = 0) -> Path:
    """A random DFlash / DSpark drafter folder for `model`, in the published layout: what -md reads."""
    from specdec.drafters.block.io import save_block_drafter

    return save_block_drafter(random_block_model(model, layout, seed=seed), folder, dtype=torch.float32)


# -- contexts -------------------------------------------------------------------------------------
def looping_prompt(model, length: int = 40) -> list[int]:
    """The last `length` tokens of what `model` writes greedily after [7, ..., 12] x 6. A tiny random
    model's greedy text falls into a short loop (make_hf_model's seed 0: 4 tokens after ~30), so this
    is a context the model-free drafters draft from and the target often continues."""
    from specdec.engine.engine import Engine
    from specdec.sampling import SamplingParams

    start = [7, 8, 9, 10, 11, 12] * 6
    answer = Engine(model, max_len=128).generate(start, SamplingParams(), max_tokens=40).token_ids
    return (start + answer)[-length:]
