"""grow_tree's room: what a budget can hold at a given top-k and depth (drafters/tree.most_nodes)."""

from __future__ import annotations

import pytest
import torch

from specdec.drafters.tree import grow_tree, most_nodes
from specdec.sampling import SamplingParams, process_logits


def _grow(topk: int, depth: int, budget: int, sampling: SamplingParams):
    g = torch.Generator().manual_seed(0)

    def expand(nodes, tokens, parents, parent_feats, d, node_slots):
        logits = torch.randn(len(nodes), 50, generator=g)  # (n, V): every node sure of nothing in particular
        return logits, parent_feats

    return grow_tree(torch.randn(50, generator=g), torch.zeros(4), expand, max_depth=depth, topk=topk, budget=budget,
                     sampling=sampling, generator=torch.Generator().manual_seed(1),
                     process=lambda logits: process_logits(logits, sampling))


@pytest.mark.parametrize("topk, depth", [(1, 4), (2, 1), (2, 3), (3, 2), (4, 2)])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0)], ids=["greedy", "sampled"])
def test_an_unbounded_budget_fills_exactly_the_room_most_nodes_names(topk, depth, sampling):
    draft = _grow(topk, depth, budget=1000, sampling=sampling)
    assert len(draft.tree.tokens) == most_nodes(topk, depth)
    assert draft.depth == depth
    # one node less: greedy prunes to the budget; sampling expands only nodes whose whole set of children fits
    # (every drawn child is kept, so that a node's presence never depends on its own token)
    smaller = len(_grow(topk, depth, budget=most_nodes(topk, depth) - 1, sampling=sampling).tree.tokens)
    assert smaller == most_nodes(topk, depth) - 1 if sampling.greedy else smaller <= most_nodes(topk, depth) - 1
