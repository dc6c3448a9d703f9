"""specdec's logits beside transformers' on a reference checkpoint (the family tests of tests/model/)."""

from __future__ import annotations

import torch


def transformers_logits(path, tokens: list[int]) -> torch.Tensor:
    """(T, V) float32 logits of transformers' own classes for the checkpoint folder at `path`."""
    from transformers import AutoModelForCausalLM  # optional: only the reference tests need it

    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return ref(input_ids=torch.tensor([tokens])).logits[0]


def specdec_logits(model, tokens: list[int], exact: bool = True, max_len: int = 256) -> torch.Tensor:
    """(T, V) logits of one forward of `tokens` through a fresh cache slot."""
    tr = model.transformer
    cache = tr.new_cache(max_len)
    return tr.forward(torch.tensor([tokens]), cache, [cache.allocate()], exact=exact).logits[0]


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, rel: float = 1e-5) -> None:
    """Within rel of the largest logit (at least 1), and the same argmax on every row."""
    err, scale = (ours - theirs).abs().max().item(), max(1.0, theirs.abs().max().item())
    assert err <= rel * scale, f"max |specdec - transformers| = {err:.2e}, largest logit {scale:.2f}"
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
