"""BlockDrafter: proposals from a BlockDraftModel, one forward each.

Cache: K/V of context rows only, one slot per committed token (slot = position). The block's own
K/V are computed in the forward and never kept: the published "crop the draft cache to the
accepted length" with nothing to crop. The engine's on_target_hidden hands over the rows of the
tokens it committed (the last verified token and the accepted drafts); they join the cache at the
next proposal.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.drafters.base import Draft, DrafterBase
from specdec.drafters.block.config import DFlashError
from specdec.drafters.block.io import load_block_drafter, read_config
from specdec.drafters.block.model import BlockDraftModel, TargetParts
from specdec.drafters.hidden import HeadCache
from specdec.drafters.mtp import shipped_head
from specdec.sampling import SamplingParams, process_logits, sample_token


class BlockDrafter(DrafterBase):
    """A Drafter around a BlockDraftModel: one forward per proposal, a chain of up to the block's drafts.

    p_min > 0 needs a confidence head (DSpark): the block ends at the first row whose predicted
    acceptance is below it.
    """

    cost_per_pass = True  # one forward per proposal, whatever is used of its block

    def __init__(self, model: BlockDraftModel, name: str, target_vocab: int, p_min: float = 0.0,
                 max_len: int = 4096, source: str = "this drafter"):
        if p_min > 0 and not model.cfg.confidence_head:
            raise DFlashError(f"--spec-draft-p-min {p_min} needs a drafter with a confidence head (DSpark); "
                              f"{source} has none: drop --spec-draft-p-min")
        self.name = name
        self.model = model.eval()
        self.hidden_layers = model.cfg.hidden_layers
        self.target_vocab, self.p_min, self.max_len = target_vocab, p_min, max_len
        layer0 = model.layers[0]
        self.caches = [HeadCache(layer0.kv_heads, layer0.head_dim, max_len) for _ in model.layers]
        self.source_note = source
        self.begin([])

    def begin(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(),
              generator: torch.Generator | None = None) -> None:
        self.sampling, self.generator = sampling, generator or torch.Generator()
        self.fed: list[int] = []  # committed tokens whose target hidden rows arrived: x_0 .. x_{m-1}
        self.pending: list[torch.Tensor] = []  # their context rows not yet in the cache
        for c in self.caches:
            c.length = 0

    @torch.inference_mode()
    def on_target_hidden(self, hidden: dict[int, torch.Tensor], tokens: Sequence[int]) -> None:
        """hidden: {layer: (n, H)} rows of the n tokens just committed to the target."""
        self.pending.append(self.model.context(hidden))
        self.fed.extend(int(t) for t in tokens)

    @torch.inference_mode()
    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        m, cfg = len(self.fed), self.model.cfg
        if draft_length <= 0 or m == 0 or len(context) != m + 1 or m + cfg.block_size > self.max_len:
            return Draft()
        self._catch_up()
        h = self.block_outputs(int(context[m]), m)  # (B, H)
        rows = (h if cfg.next_token else h[1:])[:draft_length]  # row i drafts the token at m + 1 + i
        return self._draft(rows, int(context[m]))

    def block_outputs(self, last: int, m: int) -> torch.Tensor:
        """The normed block rows (B, H) for [last, MASK x (B-1)] at positions m .. m+B-1 over cached context 0..m-1."""
        cfg = self.model.cfg
        B = cfg.block_size
        tokens = torch.tensor([[last] + [cfg.mask_token_id] * (B - 1)])
        past = [(c.k[None, :, :m], c.v[None, :, :m]) for c in self.caches]
        mask = torch.ones(1, B, m + B, dtype=torch.bool)  # the whole context and the whole block
        return self.model.blocks(self.model.embed(tokens), torch.arange(m, m + B)[None], past, mask)[0]

    def _catch_up(self) -> None:
        """Write the keys/values of context rows that arrived since the last proposal."""
        start, m = self.caches[0].length, len(self.fed)
        if start == m:
            return
        ctx = torch.cat(self.pending, dim=0)[None]  # (1, m - start, H)
        self.pending = []
        assert ctx.shape[1] == m - start, "hidden rows and committed tokens out of step"
        positions = torch.arange(start, m)[None]
        for layer, cache in zip(self.model.layers, self.caches):
            k, v = self.model.context_kv(layer, ctx, positions)
            cache.k[:, start:m] = k[0]
            cache.v[:, start:m] = v[0]
            cache.length = m

    def _draft(self, rows: torch.Tensor, anchor: int) -> Draft:
        """Tokens from block rows (n, H), left to right: the Markov bias and the confidence stop read the
        previous token (the anchor first). Sampled drafts carry the rows they were drawn from."""
        model = self.model
        logits = model.logits(rows)[:, : self.target_vocab]  # (n, V)
        markov = getattr(model, "markov_head", None)
        tokens, probs, prev, state = [], [], anchor, None
        last_id = model.cfg.vocab_size - 1
        for i in range(rows.shape[0]):
            prev_t = torch.tensor([min(prev, last_id)])  # a padding id past the drafter's rows: its last row
            if self.p_min > 0 and float(torch.sigmoid(model.confidence(rows[i : i + 1], prev_t))[0]) < self.p_min:
                break
            row = logits[i]
            if markov is not None:
                bias, state = markov.step(prev_t, rows[i : i + 1], state)
                k = min(row.shape[0], bias.shape[1])  # vocabularies may differ by padding rows
                row = torch.cat([row[:k] + bias[0, :k], row[k:]])
            if self.sampling.greedy:
                token = int(row.argmax())
            else:
                p = process_logits(row, self.sampling)
                token = sample_token(p, self.generator)
                probs.append(p)
            tokens.append(token)
            prev = token
        return Draft.chain(tokens, torch.stack(probs) if probs else None)


def make_block_drafter(target, path=None, kind: str = "draft-dflash", p_min: float = 0.0,
                       max_len: int = 4096) -> BlockDrafter:
    """The drafter `kind` (draft-dflash / draft-dspark) for a loaded target Model, from the folder `path`
    (-md / --model-draft) or one shipped for this target."""
    short = kind.removeprefix("draft-")
    if path is None:
        path = shipped_head(short, target)
        if path is None:
            what = "DFlash" if short == "dflash" else "DSpark"
            raise DFlashError(f"--spec-type {kind} needs a {what} drafter folder trained for {target.info.name}: "
                              "pass it with -md/--model-draft")
    cfg = read_config(path)
    layout = "DFlash" if cfg.layout == "dflash" else "DSpark"
    if cfg.layout != short:  # each layout runs under its own kind (and its stats)
        raise DFlashError(f"{path} is a {layout} drafter: run it with --spec-type draft-{cfg.layout} (or give -md "
                          "alone)")
    model = load_block_drafter(path, TargetParts.of(target), target.config, f"the target {target.info.name}",
                               max_len + cfg.block_size + 1)
    return BlockDrafter(model, kind, target.config.vocab_size, p_min, max_len, f"{layout} drafter {path}")
