"""Verifying a chain of k drafted tokens: greedy, rejection sampling, typical acceptance.

Row i of the target tensor is the target's distribution after context + draft_tokens[:i],
so a k-token draft comes with k+1 rows; the last one gives the bonus token.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.verify import draws
from specdec.verify.common import VerifyResult, check_logits, check_probs, check_rows, check_tokens, residual_probs


def verify_greedy(target_logits: torch.Tensor, draft_tokens: Sequence[int]) -> VerifyResult:
    """Keep drafts while they equal the target argmax, then emit the target argmax.

    target_logits: (k+1, V). The output equals plain greedy decoding token for token.
    Ties follow torch.argmax (the first maximal index).

    >>> logits = torch.tensor([[0., 9.], [9., 0.], [0., 9.]])
    >>> verify_greedy(logits, [1, 1]).tokens   # keeps 1, rejects 1, recovers 0
    (1, 0)
    """
    k = len(draft_tokens)
    vocab = check_rows("target_logits", target_logits, k + 1, "len(draft_tokens) + 1")
    tokens = check_tokens("draft_tokens", draft_tokens, vocab)
    check_logits("target_logits", target_logits)
    best = target_logits.argmax(-1).tolist()  # (k+1,)
    n = 0
    while n < k and tokens[n] == best[n]:
        n += 1
    return VerifyResult(n, tokens[:n] + (best[n],), tuple(range(n)))


def verify_sampling(
    target_probs: torch.Tensor,
    draft_tokens: Sequence[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator,
) -> VerifyResult:
    """Standard speculative (rejection) sampling; the output follows target_probs exactly.

    target_probs: (k+1, V), already processed (process_logits) like the draft.
    draft_probs: (k, V), the processed distribution each drafted token was sampled from,
        or None for a deterministic draft (one-hot at each token).
    At position i with drafted token x: accept with probability
    min(1, target_probs[i, x] / draft_probs[i, x]). At the first rejection emit a
    recovered token from normalize(max(0, target_probs[i] - draft_probs[i])) and stop;
    for a one-hot draft that is target_probs[i] with x removed, renormalized. If all k
    are kept, emit a bonus token from target_probs[k].
    A deterministic draft (draft_probs None) is verified with the same law by drawing the
    target's token at each row and keeping x while the draw equals it: one draw per emitted
    token, the draws of plain decoding (see verify_tree_sampling).
    A drafted token with draft_probs[i, x] == 0 could not have been sampled: ValueError.
    """
    k = len(draft_tokens)
    vocab = check_rows("target_probs", target_probs, k + 1, "len(draft_tokens) + 1")
    tokens = check_tokens("draft_tokens", draft_tokens, vocab)
    check_probs("target_probs", target_probs)
    if draft_probs is not None:
        check_rows("draft_probs", draft_probs, k, "len(draft_tokens)", vocab)
        check_probs("draft_probs", draft_probs)
        for i, x in enumerate(tokens):
            if draft_probs[i, x] <= 0:
                raise ValueError(
                    f"draft_probs[{i}, {x}] is 0, so the drafter could not have sampled token {x}; "
                    "pass the distribution each token was drawn from, or draft_probs=None for a "
                    "deterministic draft."
                )
    for i, x in enumerate(tokens):
        target_row = target_probs[i]  # (V,)
        if draft_probs is None:
            drawn = draws.sample(target_row, generator)
            if drawn != x:
                return VerifyResult(i, tokens[:i] + (drawn,), tuple(range(i)))
        elif not draws.accept(float(target_row[x]) / float(draft_probs[i, x]), generator):
            recovered = draws.sample(residual_probs(target_row, draft_probs[i]), generator)
            return VerifyResult(i, tokens[:i] + (recovered,), tuple(range(i)))
    bonus = draws.sample(target_probs[k], generator)
    return VerifyResult(k, tokens + (bonus,), tuple(range(k)))


def verify_typical(
    target_probs: torch.Tensor,
    draft_tokens: Sequence[int],
    posterior_threshold: float = 0.09,
    posterior_alpha: float = 0.3,
) -> VerifyResult:
    """Medusa's typical acceptance: relaxed, deterministic, and LOSSY (result.lossy is True).

    target_probs: (k+1, V), processed. Keep drafted token x at position i while
    target_probs[i, x] > min(posterior_threshold, posterior_alpha * exp(-H_i)), where H_i
    is the entropy (nats) of row i; then emit the argmax of the first failing row, or of
    row k when every draft is kept (Medusa's "fast" mode). Defaults are Medusa's
    (epsilon = 0.09, delta = 0.3). Opt-in only: the output is not the target distribution.
    """
    k = len(draft_tokens)
    vocab = check_rows("target_probs", target_probs, k + 1, "len(draft_tokens) + 1")
    tokens = check_tokens("draft_tokens", draft_tokens, vocab)
    check_probs("target_probs", target_probs)
    entropy = -torch.xlogy(target_probs, target_probs).sum(-1)  # (k+1,)
    threshold = (posterior_alpha * torch.exp(-entropy)).clamp(max=posterior_threshold)  # (k+1,)
    n = 0
    while n < k and target_probs[n, tokens[n]] > threshold[n]:
        n += 1
    best = int(target_probs[n].argmax())
    return VerifyResult(n, tokens[:n] + (best,), tuple(range(n)), lossy=True)
