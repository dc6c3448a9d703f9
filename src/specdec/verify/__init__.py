"""Verification: pure functions from target distributions and a draft to emitted tokens.

No model calls, no cache writes; randomness is a torch.Generator argument, and every
random draw goes through `specdec.verify.draws` (docs/design.md, "Verification").
"""

from specdec.verify.chain import verify_greedy, verify_sampling, verify_typical
from specdec.verify.common import VerifyResult, residual_probs
from specdec.verify.token_tree import TokenTree
from specdec.verify.tree import verify_tree_greedy, verify_tree_sampling

__all__ = [
    "TokenTree",
    "VerifyResult",
    "residual_probs",
    "verify_greedy",
    "verify_sampling",
    "verify_tree_greedy",
    "verify_tree_sampling",
    "verify_typical",
]
