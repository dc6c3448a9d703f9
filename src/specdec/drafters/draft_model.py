"""draft-simple: a smaller model with its own KV cache proposes tokens one at a time.

Greedy requests get a greedy draft (one-hot, draft_probs None); sampled requests get
tokens sampled from the draft's processed distribution, with those probabilities,
so rejection sampling keeps the target's distribution exactly.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.drafters.base import Draft, DrafterBase
from specdec.model.errors import SpecdecError
from specdec.sampling import SamplingParams, process_logits, sample_token

# Vocabulary sizes may differ by padding rows that no tokenizer emits (Qwen pads to a multiple of 128).
MAX_VOCAB_PADDING = 128


class DraftCompatibilityError(SpecdecError):
    pass


def check_compatible(target, draft) -> None:
    """Raise DraftCompatibilityError naming the first difference between two models' tokenizers."""
    tt, dt = target.tokenizer, draft.tokenizer
    t_name, d_name = target.info.name, draft.info.name
    if tt.kind != dt.kind:
        raise DraftCompatibilityError(f"draft {d_name} has a {dt.kind} tokenizer, target {t_name} a {tt.kind} one")
    # EOS sets may differ by the end-of-turn tokens a GGUF file's tokenizer adds (an HF folder's does not):
    # they must share one
    if tt.bos_id != dt.bos_id or not set(tt.eos_ids) & set(dt.eos_ids):
        raise DraftCompatibilityError(
            f"draft {d_name} has BOS/EOS {dt.bos_id}/{dt.eos_ids}, target {t_name} has {tt.bos_id}/{tt.eos_ids}")
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if abs(tv - dv) > MAX_VOCAB_PADDING:
        raise DraftCompatibilityError(
            f"vocabulary sizes differ too much: target {t_name} has {tv}, draft {d_name} has {dv}; pass "
            "--spec-cross-tokenizer to draft through text instead")
    for i in range(min(tt.vocab_size, dt.vocab_size)):
        a, b = tt.token_text(i), dt.token_text(i)
        if a != b:
            raise DraftCompatibilityError(
                f"token {i} differs: target {t_name} has {a!r}, draft {d_name} has {b!r}; pass "
                "--spec-cross-tokenizer to draft through text instead")


class DraftModelDrafter(DrafterBase):
    """Drafts with `draft` (a loaded Model); `target_vocab` bounds the ids it may propose."""

    def __init__(self, draft, target_vocab: int, p_min: float = 0.0, max_len: int = 4096):
        self.name = "draft-simple"
        self.draft = draft
        self.target_vocab = target_vocab
        self.draft_vocab = draft.config.vocab_size  # a context holding a larger id (a draft up to 128 smaller) gets
        # no draft: the draft model has no embedding row for it
        self.p_min = p_min
        self.cache = draft.transformer.new_cache(max_len)
        self.slot = self.cache.allocate()
        self.fed: list[int] = []  # tokens whose K/V sit in the draft cache
        self.sampling = SamplingParams()
        self.generator = torch.Generator()

    def begin(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(),
              generator: torch.Generator | None = None) -> None:
        self.sampling, self.generator = sampling, generator or torch.Generator()
        # Prefill the prompt the way the engine prefills the target, so a draft that is the
        # target model computes bit-identical states (and is accepted every time).
        self.cache.truncate(self.slot, 0)
        self.fed = []
        if 1 < len(prompt) < self.cache.max_len and max(prompt) < self.draft_vocab:
            self._feed(list(prompt), exact=False)

    def _feed(self, tokens: list[int], exact: bool = True) -> torch.Tensor:
        """Feed tokens after the cached ones; returns the logits of the last row, (V,)."""
        out = self.draft.transformer.forward(torch.tensor([tokens]), self.cache, [self.slot], exact=exact,
                                             last_only=True)
        self.fed.extend(tokens)
        return out.logits[0, -1]

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        # the draft's cache holds the context and all but the last drafted token; it can be shorter than the
        # target's (a draft model of a shorter context): past it, no draft
        draft_length = min(draft_length, self.cache.max_len - len(context))
        if draft_length <= 0:
            return Draft()
        context = list(context)
        common = 0
        for a, b in zip(self.fed, context):
            if a != b:
                break
            common += 1
        common = min(common, len(context) - 1)  # always feed at least the newest token
        refeed = not self.cache.restorable(self.slot, common)  # a hybrid draft model holds its last few states:
        if refeed:  # past them, the context is prefilled again, as begin() prefills the prompt
            common = 0
        self.cache.truncate(self.slot, common)
        del self.fed[common:]
        if max(context[common:]) >= self.draft_vocab:  # not fed: the next call sees it again, and drafts nothing
            return Draft()
        logits = self._feed(context[common:], exact=not refeed)
        tokens, probs = [], []
        for i in range(draft_length):
            logits = logits[: self.target_vocab]
            if self.sampling.greedy:
                if self.p_min > 0 and float(torch.softmax(logits.float(), -1).max()) < self.p_min:
                    break
                token = int(logits.argmax())
            else:
                row = process_logits(logits, self.sampling)
                if self.p_min > 0 and float(row.max()) < self.p_min:
                    break
                token = sample_token(row, self.generator)
                # a draft up to 128 tokens smaller: the target's ids past its rows have draft probability 0
                probs.append(torch.nn.functional.pad(row, (0, self.target_vocab - row.shape[-1])))
            tokens.append(token)
            if i + 1 < draft_length:
                logits = self._feed([token])
        draft_probs = torch.stack(probs) if probs else None
        return Draft.chain(tokens, draft_probs)


class CrossTokenizerDrafter(DrafterBase):
    """Drafts with a model whose tokenizer differs: target ids -> text -> draft ids, and back.

    The draft's text is re-tokenized with the target's tokenizer; the draft is
    deterministic (one-hot), so verification stays exact.
    """

    def __init__(self, draft, target_tokenizer, p_min: float = 0.0, max_len: int = 4096):
        self.name = "draft-simple"
        self.inner = DraftModelDrafter(draft, draft.config.vocab_size, p_min, max_len)
        self.draft_tok = draft.tokenizer
        self.target_tok = target_tokenizer

    def begin(self, prompt: Sequence[int], sampling: SamplingParams = SamplingParams(),
              generator: torch.Generator | None = None) -> None:
        # drafts are deterministic (one-hot) whatever the sampling: the inner draft runs greedy; it is fed the
        # prompt's text in its own ids, as propose() will ask for it
        self.inner.begin(self.draft_tok.encode(self.target_tok.decode(prompt)))

    def propose(self, context: Sequence[int], draft_length: int) -> Draft:
        if draft_length <= 0:
            return Draft()
        text = self.target_tok.decode(context)
        draft_ids = self.draft_tok.encode(text)
        proposal = self.inner.propose(draft_ids, draft_length + 2)
        if not proposal.tokens:
            return Draft()
        # Re-tokenize the whole text so token boundaries match what the target would see,
        # then keep only the ids after the context.
        full = self.target_tok.encode(text + self.draft_tok.decode(list(proposal.tokens)), add_bos=False)
        ctx = self.target_tok.encode(text, add_bos=False)
        if full[: len(ctx)] != ctx:
            return Draft()  # the boundary re-merged: no safe draft this step
        return Draft.chain(full[len(ctx) : len(ctx) + draft_length])
