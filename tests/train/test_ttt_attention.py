"""train/ttt.py's ChainAttention against the dense masks it replaces: step s of training-time test attends
step 0's keys causally (module 0) and every later step's keys of the same pair only."""

import pytest
import torch

from specdec.model.layers import MaskedAttention
from specdec.train.ttt import ChainAttention


def dense_mask(past: int, causal_past: bool, causal_new: bool, valid: torch.Tensor) -> torch.Tensor:
    """(B, n, n * (past + 1)): the blocks of keys written out as one boolean mask, True = may attend."""
    B, n = valid.shape
    idx = torch.arange(n)
    causal = (idx[None, :] <= idx[:, None])[None] & valid[:, None, :]
    eye = torch.eye(n, dtype=torch.bool)[None].expand(B, n, n)
    blocks = [causal if (causal_past and i == 0) else eye for i in range(past)]
    blocks.append(causal if causal_new else eye)
    return torch.cat(blocks, dim=-1)


@pytest.mark.parametrize("past, causal_past, causal_new", [(0, False, True), (1, True, False), (3, True, False),
                                                          (2, False, False), (0, False, False)])
@pytest.mark.parametrize("nh, nkv", [(4, 4), (6, 2)])
def test_chain_attention_is_the_dense_masked_attention(past, causal_past, causal_new, nh, nkv):
    g = torch.Generator().manual_seed(past * 10 + nh)
    B, n, hd = 2, 7, 8
    valid = torch.ones(B, n, dtype=torch.bool)
    valid[1, 5:] = False  # the second sequence is padded after 5 pairs
    blocks = [(torch.randn(B, nkv, n, hd, generator=g), torch.randn(B, nkv, n, hd, generator=g)) for _ in range(past)]
    q = torch.randn(B * n, nh, hd, generator=g, requires_grad=True)
    k, v = torch.randn(B * n, nkv, hd, generator=g), torch.randn(B * n, nkv, hd, generator=g)

    chain = ChainAttention(B, blocks, causal_past, causal_new, valid)
    got = chain(q, k, v)
    ref_k = torch.cat([b[0] for b in blocks], dim=2) if blocks else None
    ref_v = torch.cat([b[1] for b in blocks], dim=2) if blocks else None
    dense = MaskedAttention(B, ref_k, ref_v, dense_mask(past, causal_past, causal_new, valid))
    want = dense(q, k, v)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(chain.k, dense.k) and torch.equal(chain.v, dense.v)  # what the next step keeps

    grad, = torch.autograd.grad(got.square().sum(), q)
    grad_ref, = torch.autograd.grad(want.square().sum(), q)
    assert torch.allclose(grad, grad_ref, atol=1e-4, rtol=1e-4)
