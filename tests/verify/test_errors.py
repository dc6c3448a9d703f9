"""specdec.verify's errors name the argument at fault and what was expected."""

from __future__ import annotations

import pytest
import torch

from specdec.verify import (TokenTree, verify_greedy, verify_sampling, verify_tree_greedy, verify_tree_sampling,
                            verify_typical)
from verify_helpers import UNUSED, VOCAB

ROWS3 = torch.full((3, VOCAB), 0.25)
CHAIN = TokenTree.chain([1, 2])
TWINS = TokenTree((1, 1), (-1, -1))  # two siblings with the same token
HALF = torch.tensor([[0.5, 0.5, 0.0, 0.0]] * 2)  # draft rows that cannot produce token 2
SHAPE = r"must have shape \(len\("
ERRORS = [  # (call, expected message)
    (lambda: verify_greedy(ROWS3[:2], [1, 2]),
     r"target_logits must have shape \(len\(draft_tokens\) \+ 1, V\) = \(3, V\), got \(2, 4\)\."),
    (lambda: verify_greedy(ROWS3[0], []), r"target_logits " + SHAPE),
    (lambda: verify_greedy(ROWS3, [1, 9]), r"draft_tokens\[1\] = 9 is outside the target vocabulary \[0, 4\)"),
    (lambda: verify_sampling(ROWS3, [1, 2], ROWS3, UNUSED),
     r"draft_probs must have shape \(len\(draft_tokens\), V\) = \(2, 4\), got \(3, 4\)"),
    (lambda: verify_sampling(ROWS3, [1, 2], torch.full((2, 5), 0.2), UNUSED), r"draft_probs .*, got \(2, 5\)"),
    (lambda: verify_sampling(ROWS3, [1, 2], HALF, UNUSED), r"draft_probs\[1, 2\] is 0, so the drafter could not"),
    (lambda: verify_typical(ROWS3, [1]), r"target_probs must have shape \(len\(draft_tokens\) \+ 1, V\) = \(2, V\)"),
    (lambda: verify_tree_greedy(ROWS3[:2], CHAIN), r"target_logits must have shape \(len\(tree\) \+ 1, V\)"),
    (lambda: verify_tree_greedy(ROWS3, TokenTree.chain([1, 7])), r"tree.tokens\[1\] = 7 is outside"),
    (lambda: verify_tree_sampling(ROWS3[:2], CHAIN, None, UNUSED), r"target_probs " + SHAPE),
    (lambda: verify_tree_sampling(ROWS3, CHAIN, ROWS3, UNUSED), r"draft_probs must have shape \(len\(tree\), V\)"),
    (lambda: verify_tree_sampling(ROWS3, TWINS, ROWS3[:2], UNUSED), r"Tree nodes 0 and 1 are siblings with the same"),
    (lambda: verify_tree_sampling(ROWS3, CHAIN, HALF, UNUSED), r"draft_probs\[1, 2\] is 0, .* tree node 1"),
]


@pytest.mark.parametrize("call, message", ERRORS)
def test_errors_name_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()
