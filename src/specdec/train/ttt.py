"""The training loss of MTP and EAGLE-3 heads: training-time test (TTT).

Step s of TTT feeds the head its own output of step s - 1, the way drafting does:

    step 0:  pair (f_j, x_{j+1}) at position j         -> predicts x_{j+2}
    step s:  pair (g^{s-1}_j, x_{j+1+s}) at position j+s -> predicts x_{j+2+s}

and attends what drafting would have in its cache: step-0 keys of pairs i <= j (module 0
only) and its own earlier steps' keys at j. The loss is the cross-entropy against the
target's own distribution at that position (self-distillation), weighted 0.8^s; the
validation metric is top-1 agreement with the target per step, and the mean accepted
length a chain of those steps would get, 1 + sum_s prod_{t<=s} acc_t.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ttt_loss(head, kind: str, target, tokens: torch.Tensor, valid: torch.Tensor, steps: int,
             draft_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, list[float], list[int]]:
    """Loss over `steps` TTT steps; also (per-step top-1 matches, per-step counted positions)."""
    target_logits, hidden = target.forward(tokens, valid, hidden_layers=head.hidden_layers)
    B, T = tokens.shape
    n = T - 1  # pairs j = 0 .. T-2
    dev = tokens.device
    feats = head.feature({k: v[:, :n] for k, v in hidden.items()}).float()  # (B, n, H)
    keys: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (module, k, v) per step
    idx = torch.arange(n, device=dev)
    causal = (idx[None, :] <= idx[:, None])[None] & valid[:, None, :n]  # (B, n, n)
    eye = torch.eye(n, dtype=torch.bool, device=dev)[None].expand(B, n, n)
    total = torch.zeros((), device=dev)
    matches, counts = [], []
    prefix = torch.ones(B, n, dtype=torch.bool, device=dev)  # pairs whose steps so far all matched the target
    modules = getattr(head, "num_modules", 1)
    for s in range(steps):
        lab = 1 + s  # row of the target's distribution for pair j: j + 1 + s
        if lab >= T:
            break
        in_tok = torch.zeros(B, n, dtype=torch.long, device=dev)
        in_tok[:, : n - s] = tokens[:, 1 + s : 1 + s + n - s]
        ok = torch.zeros(B, n, dtype=torch.bool, device=dev)
        ok[:, : T - 1 - lab] = valid[:, lab : T - 1] & valid[:, lab + 1 : T]  # input token and label row exist
        module = s % modules
        past = [(m, k, v) for (m, k, v) in keys if m == module]
        # step 0 (module 0) keys: causal over pairs; any other step's keys: only the same pair j
        masks = [causal if (module == 0 and i == 0) else eye for i in range(len(past))]
        masks.append(causal if s == 0 else eye)
        mask = torch.cat(masks, dim=-1)  # (B, n, n * (len(past) + 1))
        past_k = torch.cat([k for _, k, _ in past], dim=2) if past else None
        past_v = torch.cat([v for _, _, v in past], dim=2) if past else None
        positions = (idx + s)[None].expand(B, n)
        if kind == "eagle3":
            logits, out, k, v = head.draft_logits(feats, in_tok, positions, past_k, past_v, mask)
            t_logits = target_logits[:, lab : lab + n][..., draft_ids] if draft_ids is not None else None
        else:
            logits, out, k, v = head.step(module, feats, in_tok, positions, past_k, past_v, mask)
            t_logits = target_logits[:, lab : lab + n]
        if t_logits.shape[1] < n:
            t_logits = F.pad(t_logits, (0, 0, 0, n - t_logits.shape[1]))
        keys.append((module, k, v))
        logp = torch.log_softmax(logits.float(), -1)
        target_probs = torch.softmax(t_logits.float(), -1)
        per_pos = -(target_probs * logp).sum(-1)  # (B, n)
        w = ok.float()
        total = total + (0.8 ** s) * (per_pos * w).sum() / w.sum().clamp(min=1)
        with torch.no_grad():
            full = target_logits[:, lab : lab + n].argmax(-1)
            if full.shape[1] < n:
                full = F.pad(full, (0, n - full.shape[1]))
            guess = logits.argmax(-1)
            if kind == "eagle3" and draft_ids is not None:
                guess = draft_ids[guess]
            # step s counts where steps 0..s-1 matched: matches / counts is the conditional rate that drafting
            # accepts at and mean_accept_length multiplies
            counts.append(int((prefix & ok).sum()))
            prefix = prefix & (guess == full) & ok
            matches.append(float(prefix.sum()))
        feats = out.float()  # what drafting feeds back (MTPHead.step picks normed or pre-norm per layout)
    return total, matches, counts


class TTTLoss(torch.nn.Module):
    """ttt_loss as a module's forward, so DistributedDataParallel can wrap it (torchrun)."""

    def __init__(self, head, kind: str, target, steps: int, draft_ids=None):
        super().__init__()
        self.head, self.kind, self.target, self.steps, self.draft_ids = head, kind, target, steps, draft_ids

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return ttt_loss(self.head, self.kind, self.target, tokens, valid, self.steps, self.draft_ids)[0]

