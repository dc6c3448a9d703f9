"""The engine's prefix cache: a new request starts from the KV rows an earlier or running request left in the
cache for the same leading tokens (a system prompt, a conversation's history, an agent's growing
transcript), and prefills only the rest. The slots are the cache (cache/prefix.py: which tokens each slot
holds, LRU eviction); no memory is added.

Modes (`--prefix-cache`):

    off    every prompt is prefilled whole (Engine's default; `generate` and `bench`)
    on     reuse the longest common prefix, whatever wrote its rows (`specdec serve` and `chat` by default)
    exact  reuse it too, and prefill with decode's numerics, so that every row is bitwise what any request
           would write there: a warm answer is then bitwise the cold one

Why `on` can change bits: a prefill row's bits are not a decode step's (fused attention; on CPUs with
native bf16 a dense bf16 GEMM whose bits depend on how many rows it multiplies, see
model/transformer.py). A reused row was written by the request that left it: by its decode steps (an
earlier answer), or by its prefill, cut where that prompt was cut; and the rest of the new prompt is
prefilled from where the reuse ends. A cold request prefills the same tokens in other cuts. So under `on`
a warm answer can differ from a cold one (a greedy one where two tokens are nearly tied); it is the
same whenever the cache holds the same rows (the same requests came before, in the same order), and
speculative output is still plain output given that cache. Under `exact` every prompt row is computed as
a decode step computes it (an exact forward, row-invariant): its bits depend on the tokens before it
alone, so how a prompt was cut and which request wrote a row change nothing.

A request whose drafter reads the target's hidden states (MTP, EAGLE-3, DFlash, DSpark) prefills its whole
prompt: its drafter needs the target's hidden state at every prompt position, which the cache does not
keep. Draft models re-prefill their own cache (drafters/draft_model.py).
"""

from __future__ import annotations

from typing import Mapping

from specdec.cache.kv import KVCache
from specdec.cache.prefix import PrefixIndex
from specdec.engine.request import Request

PREFIX_CACHE_MODES = ("off", "on", "exact")


def committed_tokens(req: Request, cache: KVCache) -> list[int]:
    """The tokens whose rows req's slot holds: its prompt as far as prefilled, then its output (an answer's
    last token is not in the cache yet; rows past the output, of drafts kept before an EOS, are left out)."""
    n = min(cache.lengths[req.slot], req.prefilled + len(req.output))
    return req.prompt[:n] if n <= len(req.prompt) else req.prompt + req.output[: n - len(req.prompt)]


class PrefixCache:
    """Slot choice and bookkeeping for one Engine's cache; mode "off" allocates as the cache does alone."""

    def __init__(self, mode: str, cache: KVCache):
        if mode not in PREFIX_CACHE_MODES:
            raise ValueError(f"prefix cache mode must be one of {', '.join(PREFIX_CACHE_MODES)}, got {mode!r}")
        if mode != "off" and not cache.holds_prefixes:
            raise ValueError(f"this model's cache ({type(cache).__name__}) keeps a running state besides keys and "
                             "values, so a prefix cannot be reused from it; use --prefix-cache off")
        self.mode, self.cache = mode, cache
        self.index = PrefixIndex(cache.num_slots) if mode != "off" else None

    @property
    def exact_prefill(self) -> bool:
        """Whether prompts are prefilled with decode's numerics (mode "exact")."""
        return self.mode == "exact"

    def take_slot(self, prompt: list[int], running: Mapping[int, Request], reuse: bool = True) -> tuple[int, int]:
        """(slot, cached): a slot for a new request, holding the first `cached` tokens of its prompt already.

        running: {slot: request} of the requests in the cache now (their committed rows can be copied out).
        reuse False: a cold start (a drafter needs the whole prompt prefilled). RuntimeError when every slot
        is in use."""
        if self.index is None:
            return self.cache.allocate(), 0
        free = list(self.cache.free_slots)
        if not free:
            return self.cache.allocate(), 0  # raises, with the cache's message
        limit = len(prompt) - 1 if reuse else 0  # the last prompt token is always computed: its logits
        held = {slot: committed_tokens(req, self.cache) for slot, req in running.items()} if limit else {}
        choice = self.index.choose(prompt, free, held, limit)
        if choice.source is None:
            slot = self.cache.allocate(choice.slot, keep=choice.length)
        else:
            slot = self.cache.allocate(choice.slot)
            self.cache.copy_prefix(choice.source, slot, choice.length)
        self.index.forget(slot)  # its rows are the new request's now
        return slot, choice.length

    def release(self, req: Request) -> None:
        """Free req's slot, keeping its rows for later requests (modes on and exact)."""
        if self.index is not None:
            self.index.remember(req.slot, committed_tokens(req, self.cache))
        self.cache.release(req.slot)
