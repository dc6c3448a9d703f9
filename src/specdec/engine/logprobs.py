"""Log-probabilities of the tokens an answer emits (OpenAI's `logprobs` / `top_logprobs`).

What they are: log_softmax of the target's logits row that each token was chosen from, after any mask (a
grammar's), before the request's sampling processing (temperature, top-k, top-p, min-p): the model's own
distribution, as vLLM returns by default (its raw logprobs). So they do not depend on the sampling settings.

Identical with and without speculation: a verify forward computes every row bitwise as a decode step would
(model/transformer.py, exact forwards), and each emitted token's row is the one its position had in the
verify (the accepted path's rows, then the bonus or recovered token's). Each row's log_softmax is taken
alone, as a (V,) tensor, so its bits never depend on the other rows of the forward.

    entries = token_logprobs(rows, result, top=2)   # rows (T, V): the rows the verifier read
    entries[0] -> TokenLogprob(token=42, logprob=-0.11, top=((42, -0.11), (7, -2.4)))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.verify import VerifyResult

MAX_TOP_LOGPROBS = 20  # most alternatives a token may list, as vLLM's default max_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability, and the `top` most likely tokens of its row, most likely first, as
    (token id, logprob) pairs (ties in an order the row's values alone fix). -inf for a token a mask forbids."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def check_top_logprobs(top: int | None, name: str = "logprobs") -> None:
    """ValueError unless top is None (none asked) or an int 0..MAX_TOP_LOGPROBS."""
    if top is None:
        return
    if isinstance(top, bool) or not isinstance(top, int):
        raise TypeError(f"{name} must be an integer, got {type(top).__name__}")
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ValueError(f"{name} must be between 0 and {MAX_TOP_LOGPROBS}, got {top}")


def emitted_rows(result: VerifyResult) -> list[int]:
    """The rows of a verify forward that result.tokens were chosen from: row 0 (the last committed token's)
    for the first, then the row of each accepted node (1 + its index in the draft), in order."""
    return [0, *(1 + node for node in result.accepted_path)][: len(result.tokens)]


def token_logprobs(rows: torch.Tensor, result: VerifyResult, top: int) -> list[TokenLogprob]:
    """rows (T, V): the logits the verifier read; one TokenLogprob per token of result.tokens."""
    out = []
    for row, token in zip(emitted_rows(result), result.tokens):
        logprobs = torch.log_softmax(rows[row].float(), dim=-1)  # (V,), this row alone
        best = ()
        if top:
            values, ids = torch.topk(logprobs, top)
            best = tuple(zip(ids.tolist(), values.tolist()))
        out.append(TokenLogprob(int(token), float(logprobs[token]), best))
    return out
