"""What every verifier returns, the residual distribution, and input checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of verifying one draft.

    num_accepted: drafted tokens kept.
    tokens: what to emit: the accepted drafts, then one more token: the recovered
        token (drawn at the first rejection) or the bonus token (every draft kept).
        So len(tokens) == num_accepted + 1.
    accepted_path: for trees, the node indices (TokenTree order) of the accepted
        nodes, root to leaf; for chains, range(num_accepted).
    lossy: True only for relaxed acceptance (verify_typical), whose output does not
        follow the target distribution.
    """

    num_accepted: int
    tokens: tuple[int, ...]
    accepted_path: tuple[int, ...] = ()
    lossy: bool = False


def residual_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, target_probs - draft_probs)), the distribution of a recovered token.

    target_probs, draft_probs: (V,). The residual is all zero only when the two rows
    are equal, and then a rejection has probability 0; if one happens anyway (rounding),
    target_probs itself is returned, which is the right distribution in that case.
    """
    residual = (target_probs - draft_probs).clamp_min(0.0)  # (V,)
    total = residual.sum()
    if total <= 0:
        return target_probs
    return residual / total


def one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    """The draft distribution of a deterministic draft: (V,), 1 at token, shaped like `like`."""
    row = torch.zeros_like(like)
    row[token] = 1.0
    return row


def check_rows(name: str, tensor: torch.Tensor, rows: int, what: str, vocab: int | None = None) -> int:
    """Raise a ValueError unless tensor is (rows, V) (and V == vocab when given); return V."""
    if tensor.dim() != 2 or tensor.shape[0] != rows or (vocab is not None and tensor.shape[1] != vocab):
        v = "V" if vocab is None else vocab
        raise ValueError(f"{name} must have shape ({what}, V) = ({rows}, {v}), got {tuple(tensor.shape)}.")
    return tensor.shape[1]


def check_tokens(name: str, tokens: Sequence[int], vocab: int) -> tuple[int, ...]:
    """The tokens as a tuple of ints; a ValueError when one is not an integer (1.7 was read as 1) or is
    outside [0, vocab)."""
    out = tuple(int(t) for t in tokens)
    for i, (t, given) in enumerate(zip(out, tokens)):
        if isinstance(given, (bool, str)) or t != given:
            raise ValueError(f"{name}[{i}] = {given!r} is not a token id (an integer).")
        if not 0 <= t < vocab:
            raise ValueError(f"{name}[{i}] = {t} is outside the target vocabulary [0, {vocab}).")
    return out


def check_logits(name: str, logits: torch.Tensor) -> None:
    """A ValueError when a row holds NaN or has no finite largest logit (all -inf, or +inf): argmax would pick
    token 0 or the inf, and sampling would fail later blaming the probabilities."""
    if not bool(torch.isfinite(logits.amax(-1)).all()):  # amax carries NaN: one reduction over the rows
        raise ValueError(f"{name} hold NaN or a row without a finite largest logit (all -inf, or +inf): the "
                         "model's forward went wrong; no token can be chosen from them.")


def check_probs(name: str, probs: torch.Tensor) -> None:
    """A ValueError unless every row is a distribution: entries >= 0 summing to 1 (to float error).
    Rows scaled up made every acceptance likelier: a silently lossy verification."""
    total = probs.sum(-1)  # two reductions, 16-40 us for 4 rows of 49k-152k (float32 is exact enough for 1e-3)
    if not float(probs.amin()) >= 0 or not bool(((total - 1).abs() <= 1e-3).all()):  # NaN fails both
        raise ValueError(f"{name} rows must be probability distributions (entries >= 0 summing to 1; "
                         "process_logits makes them), got row sums from "
                         f"{float(total.min()):.4g} to {float(total.max()):.4g}.")
