"""Suffix decoding (as in Arctic Inference / vLLM's "suffix" method), model-free.

Two suffix tries with occurrence counts, both depth-bounded:
  local   over this request's prompt + output, grown token by token;
  global  over the outputs of earlier requests, the last `max_cached_requests` of them
          (first in, first out: an evicted output's counts are subtracted again).

To draft, find the longest suffix of the context that occurs (and was followed) in a trie,
then walk to the most frequent child while the product of child/parent count ratios, the
estimated chance that the whole draft so far is right, stays >= min_token_prob. The draft
may be at most max_spec_factor x the match length, so a long match drafts far and a short
one only a token or two. A match of one token drafts only what always followed that token
(one_token_match_prob). Local and global each give a draft; the one with the larger
expected number of accepted tokens (the sum of those products) is proposed.

Cost: each new token touches O(max_tree_depth) nodes; a draft walks O(draft length) nodes.

    >>> d = SuffixDrafter()
    >>> d.begin([1, 2, 3, 4, 9])
    >>> d.propose([1, 2, 3, 4, 9, 1, 2, 3], draft_length=3).tokens
    (4, 9, 1)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from specdec.drafters.base import Draft, DrafterBase

MAX_TREE_DEPTH = 128


class _Node:
    """A trie node: one string of at most max_tree_depth tokens."""

    __slots__ = ("count", "followed", "children", "best")

    def __init__(self) -> None:
        self.count = 0  # occurrences of the string
        self.followed = 0  # occurrences followed by another token = sum of children's counts
        self.children: dict[int, _Node] = {}
        self.best: int | None = None  # the most frequent child's token; None = recompute

    def best_child(self) -> int:
        if self.best is None:
            # Ties go to the child added first; while counts only grow, ties go to the
            # child reinforced last (see _SuffixTrie.extend).
            self.best = max(self.children, key=lambda t: self.children[t].count)
        return self.best


# A match state: nodes[d] is the node for the last d tokens, d = 0 (the root) .. deepest
# present. Tries are closed under suffixes, so the present depths are always contiguous.
Path = list[_Node]


class _SuffixTrie:
    """Every substring of the inserted texts, up to max_depth tokens, with counts."""

    def __init__(self, max_depth: int) -> None:
        self.max_depth = max_depth
        self.root = _Node()

    def extend(self, path: Path, token: int) -> Path:
        """Insert `token` after the text whose suffixes are `path`; the new suffixes."""
        new = [self.root]
        for node in path[: self.max_depth]:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            node.followed += 1
            best = node.best
            if best is None:
                if len(node.children) == 1:
                    node.best = token
            elif best != token and child.count >= node.children[best].count:
                node.best = token
            new.append(child)
        return new

    def remove(self, tokens: Sequence[int]) -> None:
        """Subtract a text that extend() inserted earlier; nodes left at count 0 go away."""
        path = [self.root]
        for token in tokens:
            new = [self.root]
            for node in path[: self.max_depth]:
                child = node.children[token]
                child.count -= 1
                node.followed -= 1
                if node.best == token:
                    node.best = None  # another child may now be ahead
                if child.count == 0:
                    # This was the only occurrence, so the subtree below is this text only.
                    del node.children[token]
                else:
                    new.append(child)
            path = new

    def follow(self, path: Path, token: int) -> Path:
        """Read-only extend: the suffixes of (text + token) that occur in the trie."""
        new = [self.root]
        for node in path[: self.max_depth]:
            child = node.children.get(token)
            if child is None:
                break
            new.append(child)
        return new

    def size(self) -> int:
        """Number of nodes, root excluded (for tests and memory reports)."""
        stack, n = [self.root], -1
        while stack:
            node = stack.pop()
            n += 1
            stack.extend(node.children.values())
        return n


@dataclass
class SuffixDrafter(DrafterBase):
    """Suffix decoding over this request and the last `max_cached_requests` outputs.

    Arguments (named as vLLM's suffix_decoding_* options):
      max_tree_depth       longest string the tries hold; match length + draft length fit in it
      max_cached_requests  earlier outputs kept in the global trie (0 turns it off)
      max_spec_factor      draft at most this x the match length
      min_token_prob       stop when the draft's estimated probability drops below this
      one_token_match_prob the same floor for a draft from a match of one token only

    Defaults 24 / 32 / 1.0 / 0.1 / 1.0. Depth 24 is vLLM's; it fits a 12-token match plus a
    12-token draft, more than the usual 3-8 drafted tokens. Each token adds up to
    max_tree_depth nodes of ~280 bytes in Python (measured), so an 8k-token prompt costs
    ~55 MB and ~0.9 s to index, and 32 cached outputs of 1000 tokens at most ~220 MB;
    hence 32, not vLLM's 10000 (its tries are C++). 1.0 and 0.1 are vLLM's: a draft no
    longer than the evidence behind it, and no branch the counts give under 1 in 10.

    one_token_match_prob (specdec's, not vLLM's): a one-token match is weak evidence, and its
    counts overstate the chance. Over qwen2.5-coder-1.5b's drafts on the bench's mixed set (auto,
    48 tokens, T = 0 and 0.7), a one-token match whose token had been followed by more than one
    token had its first drafted token right 9-10% of the time in prose and chat and 17-30%
    elsewhere, where 1-token drafts pay from ~20% on a CPU (engine/cost.py); one whose token
    had always been followed by the same one was right 25-38% and 60%. 1.0 keeps only those.
    """

    max_tree_depth: int = 24
    max_cached_requests: int = 32
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1
    one_token_match_prob: float = 1.0
    name: str = field(default="suffix", init=False)

    def __post_init__(self) -> None:
        for arg, ok, rule in (
            # each token indexed touches max_tree_depth nodes of ~280 bytes: 128 costs 290 MB over 8k tokens
            ("max_tree_depth", 2 <= self.max_tree_depth <= MAX_TREE_DEPTH, f"from 2 to {MAX_TREE_DEPTH}"),
            ("max_cached_requests", self.max_cached_requests >= 0, ">= 0"),
            ("max_spec_factor", self.max_spec_factor > 0, "> 0"),
            ("min_token_prob", 0.0 <= self.min_token_prob <= 1.0, "in [0, 1]"),
            ("one_token_match_prob", 0.0 <= self.one_token_match_prob <= 1.0, "in [0, 1]"),
        ):
            if not ok:
                raise ValueError(f"suffix: {arg} must be {rule} (got {getattr(self, arg)})")
        self._global = _SuffixTrie(self.max_tree_depth)
        self._cached: deque[tuple[int, ...]] = deque()  # outputs in the global trie, oldest first
        self.begin(())

    # --- request lifecycle ---

    def begin(self, prompt: Sequence[int], sampling=None, generator=None) -> None:
        self._local = _SuffixTrie(self.max_tree_depth)
        self._local_path: Path = [self._local.root]
        self._global_path: Path = [self._global.root]
        self._seen = 0
        self._last: int | None = None
        self._sync(prompt)

    def end(self, output: Sequence[int]) -> None:
        if self.max_cached_requests == 0:
            return
        output = tuple(int(t) for t in output)
        path = [self._global.root]
        for token in output:
            path = self._global.extend(path, token)
        self._cached.append(output)
        while len(self._cached) > self.max_cached_requests:
            self._global.remove(self._cached.popleft())
        # The global trie changed under the match state; it is rebuilt by the next begin().
        self._global_path = [self._global.root]

    @property
    def num_cached_requests(self) -> int:
        return len(self._cached)

    def global_size(self) -> int:
        """Nodes in the global trie."""
        return self._global.size()

    def _sync(self, context: Sequence[int]) -> None:
        seen = self._seen
        if len(context) < seen or (seen and int(context[seen - 1]) != self._last):
            # Not a continuation of what we indexed: start this request over.
            self.begin(context)
            return
        for token in context[seen:]:
            token = int(token)
            self._local_path = self._local.extend(self._local_path, token)
            self._global_path = self._global.follow(self._global_path, token)
            self._last = token
        self._seen = len(context)

    # --- drafting ---

    def _draft_length(self, depth: int, most: int) -> int:
        # A walk from a node at `depth` can go max_tree_depth - depth tokens deeper.
        return min(most, int(self.max_spec_factor * depth), self.max_tree_depth - depth)

    def _walk(self, path: Path, draft_length: int) -> tuple[tuple[int, ...], float]:
        """The best draft from one trie and its expected number of accepted tokens."""
        deepest = 0
        for depth in range(len(path) - 1, 0, -1):
            if path[depth].followed > 0:
                deepest = depth
                break
        if deepest == 0:
            return (), 0.0
        # Start from the match depth that allows the longest draft (deeper on ties): a
        # match that fills the trie's depth leaves no room below it to walk.
        start = max(range(deepest, 0, -1), key=lambda d: self._draft_length(d, draft_length))
        budget = self._draft_length(start, draft_length)
        floor = self.min_token_prob if start > 1 else max(self.min_token_prob, self.one_token_match_prob)
        node, prob, score, out = path[start], 1.0, 0.0, []
        while len(out) < budget and node.followed > 0:
            token = node.best_child()
            child = node.children[token]
            prob *= child.count / node.followed
            if prob < floor:
                break
            out.append(token)
            score += prob
            node = child
        return tuple(out), score

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        self._sync(context)
        if draft_length <= 0:
            return Draft()
        local, local_score = self._walk(self._local_path, draft_length)
        shared, shared_score = self._walk(self._global_path, draft_length)
        tokens = shared if shared_score > local_score else local
        return Draft.chain(tokens)
