"""Growing a draft tree whose shape follows the drafter's confidence (EAGLE-2).

Each node has a score: the product of draft probabilities along its path (the
drafter's estimate that the target accepts it). Depth by depth, the `topk` best-scoring
nodes of the newest depth are expanded, each into `topk` children; at the end the
`budget` best nodes are kept. Confident paths grow deep, unsure ones wide.

Greedy requests get a deterministic tree (top-k children, draft_probs None): the tree
verifier walks it by argmax, equal to plain greedy decoding.

Sampled requests get children drawn WITHOUT replacement from the processed draft
distribution, listed in draw order, with that distribution as their draft_probs row,
as verify_tree_sampling requires. So that this stays lossless, whether a node is in
the tree never depends on its own token: every drawn child is kept, and scores only
decide which nodes are expanded (before their children are drawn).

    expand(nodes, tokens, parents, parent_feats, depth, node_slots) -> (logits (n, V), feats (n, H))
runs the drafter on `nodes` (all at `depth`) and returns their children's logits.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from specdec.drafters.base import Draft, TokenTree
from specdec.sampling import SamplingParams, sample_tokens


def most_nodes(topk: int, max_depth: int) -> int:
    """The most nodes grow_tree can draft: topk children of the root, then topk children for each of the
    topk nodes expanded at every later depth (SGLang's EAGLE tree has the same room)."""
    return topk + (max_depth - 1) * topk * topk if max_depth > 0 else 0


def grow_tree(root_logits: torch.Tensor, root_feat: torch.Tensor, expand: Callable, max_depth: int, topk: int,
              budget: int, sampling: SamplingParams, generator: torch.Generator,
              process: Callable[[torch.Tensor], torch.Tensor], p_min: float = 0.0) -> Draft:
    """A Draft holding a TokenTree of at most `budget` nodes and depth `max_depth`.

    root_logits: (V,) the drafter's logits after the last committed token; root_feat: (H,).
    process: logits (..., V) -> processed probabilities (the request's sampling settings).
    p_min: a node whose distribution's largest probability is below it gets no children (as a chain stops
    there; greedy: the raw softmax, sampling: the processed row). It depends on the row only, never on
    a token drawn from it, so the drafts' distribution stays what verification assumes.
    """
    greedy = sampling.greedy
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []  # log of the path probability
    rows: list[torch.Tensor] = []  # per node: the distribution it was drawn from (sampling only)
    node_slots: list = []

    def add_children(parent: int, logits: torch.Tensor, base: float, room: int) -> list[int]:
        if greedy:
            logp = torch.log_softmax(logits.float(), -1)
            if p_min > 0 and math.exp(float(logp.max())) < p_min:
                return []
            k = min(topk, room)
            top = torch.topk(logp, k)
            picked = list(zip(top.indices.tolist(), top.values.tolist()))
            row = None
        else:
            row = process(logits)
            if p_min > 0 and float(row.max()) < p_min:
                return []
            k = min(topk, room, int((row > 0).sum()))
            if k <= 0:
                return []
            drawn = sample_tokens(row, k, generator)
            picked = [(t, math.log(max(float(row[t]), 1e-30))) for t in drawn]
        out = []
        for t, lp in picked:
            tokens.append(int(t))
            parents.append(parent)
            scores.append(base + lp)
            if row is not None:
                rows.append(row)
            out.append(len(tokens) - 1)
        return out

    # in sampling mode the budget is never exceeded (nothing is pruned afterwards)
    room = budget if not greedy else budget * topk
    newest = add_children(-1, root_logits, 0.0, room)
    feats = {-1: root_feat}
    for depth in range(1, max_depth):
        if not newest:
            break
        chosen = sorted(newest, key=lambda i: -scores[i])[:topk]
        if not greedy:
            fit = (budget - len(tokens)) // max(topk, 1)
            chosen = chosen[:max(fit, 0)]
            if not chosen:
                break
        parent_feats = torch.stack([feats[parents[i]] for i in chosen])
        logits, out = expand(chosen, [tokens[i] for i in chosen], parents, parent_feats, depth, node_slots)
        for j, i in enumerate(chosen):
            feats[i] = out[j]
        newest = []
        for j, i in enumerate(chosen):
            newest += add_children(i, logits[j], scores[i], budget - len(tokens) if not greedy else topk)

    if not tokens:  # p_min: not even the root was sure enough
        return Draft()
    keep = list(range(len(tokens)))
    if greedy and len(tokens) > budget:
        # a child never outscores its parent (and comes later), so the best `budget` nodes form a tree
        keep = sorted(sorted(keep, key=lambda i: (-scores[i], i))[:budget])
    index = {old: new for new, old in enumerate(keep)}
    tree = TokenTree(tuple(tokens[i] for i in keep), tuple(index[parents[i]] if parents[i] >= 0 else -1 for i in keep))
    draft_probs = None if greedy else torch.stack([rows[i] for i in keep])
    return Draft(tree, draft_probs)
