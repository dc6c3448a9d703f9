"""Verifying a draft tree: greedy, and recursive rejection sampling over siblings.

Row 0 of the target tensor is the target's distribution after the root (the last
committed token); row i+1 is its distribution after tree node i (after the path from
the root down to node i). So an n-node tree comes with n+1 rows.
"""

from __future__ import annotations

import torch

from specdec.verify.token_tree import TokenTree
from specdec.verify import draws
from specdec.verify.common import VerifyResult, check_logits, check_probs, check_rows, check_tokens, residual_probs


def verify_tree_greedy(target_logits: torch.Tensor, tree: TokenTree) -> VerifyResult:
    """Walk down from the root, each time into the child holding the target argmax.

    target_logits: (n+1, V). Stops where no child matches (emitting the argmax as the
    recovered token) or at a leaf (emitting the bonus argmax). Among children with the
    same token the first in ranked order wins. Equals plain greedy decoding.

    >>> tree = TokenTree(tokens=(5, 7, 2), parents=(-1, -1, 1))   # root -> {5, 7}, 7 -> 2
    >>> logits = torch.nn.functional.one_hot(torch.tensor([7, 0, 2, 3]), 8).float()
    >>> verify_tree_greedy(logits, tree).tokens, verify_tree_greedy(logits, tree).accepted_path
    ((7, 2, 3), (1, 2))
    """
    vocab = check_rows("target_logits", target_logits, len(tree) + 1, "len(tree) + 1")
    check_tokens("tree.tokens", tree.tokens, vocab)
    check_logits("target_logits", target_logits)
    best = target_logits.argmax(-1).tolist()  # (n+1,)
    return _descend(tree, best.__getitem__)


def _descend(tree: TokenTree, pick) -> VerifyResult:
    """Walk down from the root into the child holding pick(row), row = node + 1, while one does;
    the target's own token at the first row without one ends the walk. Among children with the
    same token the first in ranked order wins."""
    path: list[int] = []
    node = -1
    while True:
        token = pick(node + 1)
        match = [c for c in tree.children(node) if tree.tokens[c] == token]
        if not match:
            return VerifyResult(len(path), tuple(tree.tokens[i] for i in path) + (token,), tuple(path))
        node = match[0]
        path.append(node)


def verify_tree_sampling(
    target_probs: torch.Tensor,
    tree: TokenTree,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator,
) -> VerifyResult:
    """Recursive rejection sampling over siblings (SpecInfer, EAGLE); lossless.

    target_probs: (n+1, V), processed like the draft.
    draft_probs: (n, V): row i is the distribution node i was sampled from (its
        parent's processed draft distribution). Siblings must have been sampled
        WITHOUT replacement, in the order they are listed. None means a deterministic
        draft (n-gram, suffix, top-k siblings): each node is one-hot at its token.

    A deterministic draft is verified by drawing the target's own token at each row, one
    sample_token draw per emitted token, and descending into the child that holds it: the
    emitted token follows the target row exactly, and is kept with probability
    target[x] = min(1, target[x] / 1), what the rule below gives a one-hot draft. The draws are
    the ones plain decoding makes, so with the same seed the text is plain decoding's, whatever
    was drafted (to the float rounding of the rows), which keeps a seeded request's text fixed
    under auto's suffix trie and under the server's load-dependent draft lengths.

    At a node, residual = its target row. For each child x_j in order, with
    draft_q = the child's row with earlier siblings' tokens removed, renormalized
    (one-hot at x_j when draft_probs is None): accept with probability
    min(1, residual[x_j] / draft_q[x_j]); on rejection
    residual = normalize(max(0, residual - draft_q)) and try the next sibling. If a
    child is kept, repeat from it; otherwise emit a token from the residual and stop
    (at a leaf that is the bonus token from the leaf's row). For one-hot drafts the
    rule reads: accept with probability residual[x_j], else remove x_j from residual; so
    some child is kept exactly when the target's draw at this row is one of the children's
    tokens, which is the draw-and-descend walk above.

    Why it is lossless. Write T for the node's target row, Q_j for the true law of
    sibling x_j given the earlier siblings (sampling without replacement makes it the
    row with x_1..x_{j-1} removed, renormalized; for a deterministic draft it is one-hot
    at x_j), R_1 = T and R_{j+1} = normalize(max(0, R_j - Q_j)). R_{j+1} depends on R_j
    and Q_j but not on which x_j was drawn. Claim, by induction from the last sibling
    back: whatever the earlier siblings were, the token emitted at this position from
    sibling j on has law R_j. With no sibling left we sample R_j. Otherwise
    P(x_j = y and kept) = Q_j(y) min(1, R_j(y)/Q_j(y)) = min(R_j(y), Q_j(y)), the
    rejection probability is 1 - sum min(R_j, Q_j) = sum max(0, R_j - Q_j), and after a
    rejection the token has law R_{j+1} = max(0, R_j - Q_j) / that sum; adding up gives
    min(R_j, Q_j) + max(0, R_j - Q_j) = R_j. At j = 1 the emitted token has law T. A kept
    child's subtree was drafted from the drafter's distribution after that child,
    independently of the draws made here, so the same argument applies one level down;
    by the chain rule the whole emitted sequence follows the target. Using the raw row
    for later siblings (no removal) breaks the first identity: it is lossy.
    """
    n = len(tree)
    vocab = check_rows("target_probs", target_probs, n + 1, "len(tree) + 1")
    check_tokens("tree.tokens", tree.tokens, vocab)
    check_probs("target_probs", target_probs)
    if draft_probs is None:
        return _descend(tree, lambda row: draws.sample(target_probs[row], generator))
    check_rows("draft_probs", draft_probs, n, "len(tree)", vocab)
    check_probs("draft_probs", draft_probs)
    check_sampled_siblings(tree, draft_probs)
    path: list[int] = []
    node = -1
    while True:
        residual = target_probs[node + 1]  # (V,)
        earlier: list[int] = []  # tokens of the rejected siblings before this one
        kept = None
        for child in tree.children(node):
            x = tree.tokens[child]
            draft_q = without_tokens(draft_probs[child], earlier)  # (V,), draft_q[x] > 0 (checked)
            if draws.accept(float(residual[x]) / float(draft_q[x]), generator):
                kept = child
                break
            residual = residual_probs(residual, draft_q)
            earlier.append(x)
        if kept is None:
            token = draws.sample(residual, generator)
            return VerifyResult(len(path), tuple(tree.tokens[i] for i in path) + (token,), tuple(path))
        path.append(kept)
        node = kept


def check_sampled_siblings(tree: TokenTree, draft_probs: torch.Tensor) -> None:
    """Raise a ValueError unless every node could have been sampled from its row.

    draft_probs: (n, V). Node i needs draft_probs[i, token] > 0 and a token that no
    earlier sibling holds (siblings are sampled without replacement).
    """
    seen: dict[tuple[int, int], int] = {}  # (parent, token) -> first node
    for i, (x, parent) in enumerate(zip(tree.tokens, tree.parents)):
        if draft_probs[i, x] <= 0:
            raise ValueError(
                f"draft_probs[{i}, {x}] is 0, so the drafter could not have sampled tree node {i}; pass the "
                "distribution each node was drawn from, or draft_probs=None for a deterministic draft."
            )
        if (parent, x) in seen:
            raise ValueError(
                f"Tree nodes {seen[parent, x]} and {i} are siblings with the same token {x}; siblings "
                "drafted with draft_probs must be sampled without replacement (or pass draft_probs=None)."
            )
        seen[parent, x] = i


def without_tokens(probs: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """probs: (V,) with `tokens` set to 0 and renormalized (all zero if nothing is left).

    The law of the next sibling sampled without replacement, given the earlier ones.
    Idempotent, so rows that already exclude earlier siblings are fine too.
    """
    if not tokens:
        return probs
    probs = probs.clone()
    probs[tokens] = 0.0
    total = probs.sum()
    return probs / total if total > 0 else probs
