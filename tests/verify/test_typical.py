"""specdec.verify.verify_typical: the relaxed (lossy, opt-in) acceptance rule."""

from __future__ import annotations

import torch

from specdec.verify import VerifyResult, verify_typical
from verify_helpers import VOCAB


def test_typical_acceptance_thresholds():
    uniform = torch.full((VOCAB,), 0.25)  # threshold min(0.09, 0.3 * 0.25) = 0.075 < 0.25
    peaked = torch.tensor([0.91, 0.03, 0.03, 0.03])  # threshold 0.09 > 0.03
    result = verify_typical(torch.stack([uniform, peaked, uniform]), [3, 2])
    assert result == VerifyResult(1, (3, 0), (0,), lossy=True)
    result = verify_typical(torch.stack([uniform, peaked, peaked]), [3, 0])
    assert result == VerifyResult(2, (3, 0, 0), (0, 1), lossy=True)
    # For a flat row alpha * exp(-H) is the binding term: 0.06 < 0.09 is kept by default
    # (threshold 0.3 * exp(-2.06) = 0.038) but not with alpha = 0.5 (threshold 0.064).
    flat = torch.tensor([0.06] + [0.94 / 7] * 7)  # (8,)
    assert verify_typical(torch.stack([flat, flat]), [0]).num_accepted == 1
    assert verify_typical(torch.stack([flat, flat]), [0], posterior_alpha=0.5).num_accepted == 0
