"""The only two places randomness enters verification.

Every verifier draws through `accept` and `sample` (called as `draws.accept`, never
imported by name), so a test can replace them and enumerate every accept/recover
branch with its exact probability (tests/verify/test_verify.py).
"""

from __future__ import annotations

import torch

from specdec.sampling.params import sample_token


def accept(probability: float, generator: torch.Generator) -> bool:
    """Draw r ~ U(0, 1) and return r < probability (so probability >= 1 always accepts)."""
    r = torch.rand((), generator=generator, device=generator.device)
    return r.item() < probability


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token id drawn from probs: (V,)."""
    return sample_token(probs, generator)
