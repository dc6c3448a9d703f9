"""The training loss of DFlash / DSpark block drafters: one block per random anchor (block_loss)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sample_anchors(valid: torch.Tensor, count: int, generator: torch.Generator, answer: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Block drafter training: `count` random anchor positions a per sequence (sorted) where the anchor
    and its first label a + 1 are real tokens, as DeepSpec samples them; with `answer` (B, T), anchors on
    the answer's tokens only (drafting anchors a block at a token the target wrote). valid (B, T) ->
    (anchors (B, count), keep (B, count): False for the padding anchors of short sequences)."""
    B, T = valid.shape
    ok = valid[:, :-1] & valid[:, 1:]  # (B, T-1): candidate anchors
    if answer is not None:
        ok &= answer[:, :-1]
    scores = torch.rand(ok.shape, generator=generator).to(valid.device).masked_fill(~ok, 2.0)
    k = min(count, T - 1)
    picked = scores.argsort(dim=1)[:, :k]  # valid candidates first, in random order
    keep = torch.arange(k, device=valid.device)[None] < ok.sum(1, keepdim=True)
    anchors = torch.where(keep, picked, torch.full_like(picked, T)).sort(dim=1).values  # kept ones first
    anchors = torch.where(keep, anchors, torch.zeros_like(anchors))
    if k < count:
        anchors = torch.cat([anchors, anchors.new_zeros(B, count - k)], 1)
        keep = torch.cat([keep, keep.new_zeros(B, count - k)], 1)
    return anchors, keep


def block_loss(model, target, tokens: torch.Tensor, valid: torch.Tensor, anchors: torch.Tensor, keep: torch.Tensor,
               decay: float = 4.0, ce_weight: float = 1.0, l1_weight: float = 0.0, confidence_weight: float = 1.0
               ) -> tuple[torch.Tensor, list[float], list[int]]:
    """DFlash / DSpark training loss on a padded batch, with one block per anchor (DSpark's published recipe):

        context   the frozen target's hidden rows of every position strictly before the anchor
        block     [x_a, MASK x (B-1)] at positions a .. a+B-1, attending that context and (both ways) itself
        draft d   the token at a + 1 + d (DFlash: block row d + 1, DSpark: row d), d < drafts per block
        loss      weights exp(-d / decay), zero after the first label that is padding:
                  ce_weight * CE(draft, target probs) + l1_weight * |draft - target probs|_1
                  + confidence_weight * BCE(confidence, 1 - |draft - target probs|_1 / 2)   (DSpark heads only)
                  the Markov bias teacher-forced (previous token = x_{a+d})

    tokens, valid: (B, T); anchors, keep: (B, A) from sample_anchors. Returns (loss, per draft position d:
    blocks whose drafts 0..d all equal the target's argmax, blocks whose drafts 0..d-1 do)."""
    cfg = model.cfg
    Bt, T = tokens.shape
    A, S, n = anchors.shape[1], cfg.block_size, cfg.drafts_per_block
    dev = tokens.device
    out_t = target.outputs(tokens, valid, hidden_layers=cfg.hidden_layers)
    ctx = model.context(out_t.hidden)  # (Bt, T, H)
    positions = torch.arange(T, device=dev)[None].expand(Bt, T)
    past = [model.context_kv(layer, ctx, positions) for layer in model.layers]
    block_tokens = torch.full((Bt, A, S), cfg.mask_token_id, dtype=torch.long, device=dev)
    block_tokens[:, :, 0] = tokens.gather(1, anchors)
    block_pos = (anchors[:, :, None] + torch.arange(S, device=dev)).reshape(Bt, A * S)
    q_anchor = anchors.repeat_interleave(S, dim=1)  # (Bt, A*S): each row's anchor
    sees_ctx = (torch.arange(T, device=dev)[None, None] < q_anchor[:, :, None]) & valid[:, None]  # strictly before
    block_id = torch.arange(A * S, device=dev) // S
    sees_block = (block_id[:, None] == block_id[None])[None].expand(Bt, -1, -1)
    mask = torch.cat([sees_ctx, sees_block], dim=-1)  # (Bt, A*S, T + A*S)
    h = model.blocks(model.embed(block_tokens.reshape(Bt, A * S)), block_pos, past, mask).view(Bt, A, S, -1)
    rows = h[:, :, :n] if cfg.next_token else h[:, :, 1:]  # (Bt, A, n, H)
    label_pos = anchors[:, :, None] + 1 + torch.arange(n, device=dev)  # (Bt, A, n)
    safe = label_pos.clamp(max=T - 1)
    ok = (label_pos < T) & valid.gather(1, safe.view(Bt, -1)).view(Bt, A, n) & keep[:, :, None]
    ok = ok.long().cumprod(-1).bool()
    prev = tokens.gather(1, (safe - 1).view(Bt, -1)).view(Bt, A, n)  # x_{a+d}: the anchor, then the labels
    logits = model.logits(rows)  # (Bt, A, n, V)
    markov = getattr(model, "markov_head", None)
    if markov is not None:
        state, biases = None, []
        for d in range(n):
            bias, state = markov.step(prev[:, :, d].reshape(-1), rows[:, :, d].reshape(Bt * A, -1), state)
            biases.append(bias.view(Bt, A, -1))
        logits = logits + torch.stack(biases, dim=2)
    weights = ok.float() * torch.exp(-torch.arange(n, device=dev, dtype=torch.float32) / decay)
    denom = weights.sum().clamp(min=1e-6)
    V = logits.shape[-1]
    t_logits = out_t.logits(rows=(safe - 1).view(Bt, -1)).view(Bt, A, n, V)  # at x_{a+d}: predicting x_{a+1+d}
    # cross-entropy against the target's own distribution at x_{a+1+d} (self-distillation, as the MTP and
    # EAGLE-3 heads here): the published recipe's hard labels x_{a+1+d} are its samples in expectation, on
    # text the target regenerated; specdec's data also holds plain corpus text the target would not write
    ce = -(torch.softmax(t_logits.float(), -1) * torch.log_softmax(logits.float(), -1)).sum(-1)  # (Bt, A, n)
    total = ce_weight * (ce * weights).sum() / denom
    need_tv = l1_weight > 0 or getattr(model, "confidence_head", None) is not None
    if need_tv:
        tv = (torch.softmax(logits.float(), -1) - torch.softmax(t_logits.float(), -1)).abs().sum(-1)  # (Bt, A, n)
        if l1_weight > 0:
            total = total + l1_weight * (tv * weights).sum() / denom
        if getattr(model, "confidence_head", None) is not None:
            conf = model.confidence(rows.reshape(-1, rows.shape[-1]), prev.reshape(-1)).view(Bt, A, n)
            accept = (1 - 0.5 * tv).clamp(0, 1).detach()
            bce = F.binary_cross_entropy_with_logits(conf.float(), accept, reduction="none")
            total = total + confidence_weight * (bce * weights).sum() / denom
    with torch.no_grad():  # draft d counts where drafts 0..d-1 all matched: matches / counts is conditional
        prefix = ((logits.argmax(-1) == t_logits.argmax(-1)) & ok).long().cumprod(-1).bool()
        before = torch.cat([torch.ones_like(prefix[:, :, :1]), prefix[:, :, :-1]], dim=-1) & ok
        matches = [float(prefix[:, :, d].sum()) for d in range(n)]
        counts = [int(before[:, :, d].sum()) for d in range(n)]
    return total, matches, counts


class BlockLoss(torch.nn.Module):
    """block_loss with freshly sampled anchors as a module's forward (DDP wraps it under torchrun)."""

    def __init__(self, model, target, anchors: int, decay: float, ce_weight: float, l1_weight: float,
                 confidence_weight: float, seed: int = 0):
        super().__init__()
        self.head, self.target, self.anchors = model, target, anchors
        self.weights = dict(decay=decay, ce_weight=ce_weight, l1_weight=l1_weight, confidence_weight=confidence_weight)
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor, answer: torch.Tensor | None = None) -> torch.Tensor:
        anchors, keep = sample_anchors(valid, self.anchors, self.generator, answer)
        return block_loss(self.head, self.target, tokens, valid, anchors, keep, **self.weights)[0]

    def evaluate(self, tokens: torch.Tensor, valid: torch.Tensor, answer: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, list[float], list[int]]:
        """Validation (loss, matches, counts per draft position) on anchors drawn with a fixed seed (the
        training draws are left where they are)."""
        anchors, keep = sample_anchors(valid, self.anchors, torch.Generator().manual_seed(1234), answer)
        return block_loss(self.head, self.target, tokens, valid, anchors, keep, **self.weights)

