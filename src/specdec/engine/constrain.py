"""A request's grammar during generation: the vocabulary a grammar is compiled for, the draft cut where the
grammar forbids a token, the masks on the verify rows, and the grammar state moved over what is emitted.

    grammar = compile_for(model, "json_schema", schema_text)       # the model's vocabulary built once, the
                                                                   # grammar compiled once per text (LRU of 64)
    warm_vocabulary(model)                                         # built now in a thread (`specdec serve`)
    engine.generate(prompt, SamplingParams(grammar=grammar))       # plain or speculative, the same masks

Why it stays exact (docs/design.md, "Constrained decoding"). The constrained law at a position is the
target's processed distribution of the logits masked there (forbidden tokens -inf). A draft is walked
through the grammar before the forward: a node whose token the grammar forbids after its path is cut
with its subtree (Engine._propose then treats the cut draft as the drafter's), and each verify row gets
the mask after its own path, the mask plain decoding would apply at that position. So:
- greedy verification takes the masked argmax at every row: plain greedy decoding's tokens;
- rejection sampling compares the masked target rows with the draft's rows masked the same way: a
  drafted token that survives the cut was drawn from its row conditioned on being allowed, which is the
  row masked and renormalised (its siblings too: a forbidden sibling is cut, an allowed one has its row
  without the earlier siblings, masked), and a draft cut at a position leaves that position to the
  target's own draw; either way the emitted token follows the masked target row.
The grammar state advances over committed tokens only; a draft's walk rolls it back.
"""

from __future__ import annotations

import json
import threading
import weakref
from dataclasses import replace

import torch

from specdec.drafters.base import Draft
from specdec.drafters.registry import DrafterSpec
from specdec.engine.config import SpecConfig
from specdec.engine.stats import SpecStats
from specdec.model.token_bytes import token_bytes
from specdec.sampling.grammar import Grammar, GrammarState, GrammarVocabulary, compile_grammar
from specdec.verify.token_tree import TokenTree

GRAMMAR_DRAFTER = "grammar"  # the registry kind that drafts what the grammar forces (drafters/grammar.py)

# Tokenizer -> {rows: GrammarVocabulary}, kept while the tokenizer lives; each vocabulary keeps its compiled
# grammars, (kind, text) -> Grammar, the GRAMMAR_CACHE most recently used (a Grammar is immutable: each request
# walks it with its own GrammarState)
_vocabularies: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_lock = threading.Lock()  # one build of a vocabulary however many requests want it at once; the caches' order
GRAMMAR_CACHE = 64


def grammar_vocabulary(model) -> GrammarVocabulary:
    """The model's vocabulary as the grammar engine reads it, built on first use (1-5 s) and kept."""
    tok, rows = model.tokenizer, model.config.vocab_size
    with _lock:  # held through the build: a second caller waits for this one's vocabulary
        built = _vocabularies.setdefault(tok, {})
        if rows not in built:
            built[rows] = GrammarVocabulary(token_bytes(tok, rows), tok.eos_ids,
                                            lambda text: tok.encode(text, add_bos=False))
        return built[rows]


def warm_vocabulary(model) -> threading.Thread:
    """Build the model's vocabulary in a daemon thread (a server's first constrained request then finds it, or
    waits for the rest of it). A model the grammar engine cannot serve is left for its requests to report."""
    def build():
        try:
            grammar_vocabulary(model)
        except ValueError:  # no end-of-answer token: each constrained request says so
            pass

    thread = threading.Thread(target=build, name="grammar-vocabulary", daemon=True)
    thread.start()
    return thread


def compile_for(model, kind: str, text) -> Grammar:
    """A grammar (sampling.grammar.KINDS) compiled for the model's vocabulary; ValueError for a bad one (never
    kept). The same kind and text again is the same Grammar, from the vocabulary's cache."""
    vocabulary = grammar_vocabulary(model)
    key = (kind, text if isinstance(text, str) else json.dumps(text))  # key order kept: it orders the output
    cache = vocabulary.grammars
    with _lock:
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    grammar = compile_grammar(kind, text, vocabulary)  # outside the lock: a race compiles it twice, harmlessly
    with _lock:
        cache[key] = grammar
        while len(cache) > GRAMMAR_CACHE:
            cache.popitem(last=False)
    return grammar


def with_grammar_drafter(spec: SpecConfig) -> SpecConfig:
    """spec with the grammar drafter added (tried first): a request with a grammar drafts what it forces."""
    if not spec.enabled or GRAMMAR_DRAFTER in spec.types:
        return spec
    return replace(spec, drafters=(DrafterSpec(GRAMMAR_DRAFTER),) + spec.drafters)


class Constraint:
    """One request's grammar in the engine. cut() a proposed draft, then mask() the verify rows of the draft
    cut last (or of another draft: its masks are walked then), then advance() over the emitted tokens."""

    def __init__(self, grammar: Grammar, stats: SpecStats):
        self.state = GrammarState(grammar)
        self.stats = stats  # the request's counters: grammar_cut counts the drafted tokens cut
        self._draft: Draft | None = None  # the draft cut last, and its verify rows' masks (1 + len(draft), V)
        self._masks: torch.Tensor | None = None

    def cut(self, draft: Draft) -> Draft:
        """The draft without the nodes the grammar forbids after their path (and their subtrees); draft_probs
        rows of the kept nodes, masked by their parent's mask and renormalised."""
        if not len(draft):
            return draft
        kept, masks = self.state.walk(draft.tree.tokens, draft.tree.parents)
        self.stats.grammar_cut += len(draft) - len(kept)
        if len(kept) < len(draft):
            new = {old: j for j, old in enumerate(kept)}
            parents = tuple(-1 if draft.tree.parents[i] < 0 else new[draft.tree.parents[i]] for i in kept)
            tree = TokenTree(tuple(draft.tree.tokens[i] for i in kept), parents)
            probs = None if draft.draft_probs is None else draft.draft_probs[kept]
            draft = Draft(tree, probs)
        if draft.draft_probs is not None:
            allowed = masks[[p + 1 for p in draft.tree.parents]].to(draft.draft_probs.device)  # (n, V): each row's
            probs = draft.draft_probs * allowed  # node was drawn from its parent's row, where the parent's mask holds
            draft = Draft(draft.tree, probs / probs.sum(-1, keepdim=True))
        self._draft, self._masks = draft, masks
        return draft

    def mask(self, logits: torch.Tensor, draft: Draft) -> torch.Tensor:
        """logits (1 + len(draft), V), the verify rows of [last committed token] + the draft's nodes, with the
        tokens the grammar forbids at each row set to -inf. `draft` is one cut() returned (or has no nodes)."""
        if draft is self._draft:
            masks = self._masks
        elif not len(draft):
            masks = self.state.mask()[None]
        else:
            raise RuntimeError("a draft reached verification without the grammar's cut (Constraint.cut)")
        return logits.masked_fill(~masks.to(logits.device), float("-inf"))

    def advance(self, tokens, eos) -> None:
        """Commit the emitted tokens, up to the first end-of-answer token (which ends the request)."""
        out = []
        for t in tokens:
            if t in eos:
                break
            out.append(t)
        self.state.advance(out)
        self._draft = self._masks = None
