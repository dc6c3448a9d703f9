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

import math

import torch
import torch.nn.functional as F


def ttt_loss(head, kind: str, target, tokens: torch.Tensor, valid: torch.Tensor, steps: int,
             draft_ids: torch.Tensor | None = None, answer: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, list[float], list[int]]:
    """Loss over `steps` TTT steps; also (per-step top-1 matches, per-step counted positions).
    target: a DenseTarget or a FeatureCache (its .outputs). answer (B, T): where given, only the pairs whose
    token x_{j+1} is in it are scored (loss and counts), as drafting starts a chain only after a token of the
    answer; the prompt's pairs are still attended."""
    out_t = target.outputs(tokens, valid, hidden_layers=head.hidden_layers)
    # the soft labels: EAGLE-3 over its draft vocabulary, MTP over the whole one; the top ids for the metric
    labels = out_t.logits(draft_ids if kind == "eagle3" else None)  # (B, T, V')
    B, T = tokens.shape
    n = T - 1  # pairs j = 0 .. T-2
    dev = tokens.device
    feats = head.feature({k: v[:, :n] for k, v in out_t.hidden.items()}).float()  # (B, n, H)
    keys: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (module, k, v) per step
    total = torch.zeros((), device=dev)
    matches, counts = [], []
    prefix = torch.ones(B, n, dtype=torch.bool, device=dev)  # pairs whose steps so far all matched the target
    modules = getattr(head, "num_modules", 1)
    idx = torch.arange(n, device=dev)
    for s in range(steps):
        lab = 1 + s  # row of the target's distribution for pair j: j + 1 + s
        if lab >= T:
            break
        in_tok = torch.zeros(B, n, dtype=torch.long, device=dev)
        in_tok[:, : n - s] = tokens[:, 1 + s : 1 + s + n - s]
        ok = torch.zeros(B, n, dtype=torch.bool, device=dev)
        ok[:, : T - 1 - lab] = valid[:, lab : T - 1] & valid[:, lab + 1 : T]  # input token and label row exist
        if answer is not None:
            ok &= answer[:, 1:T]
        module = s % modules
        past = [(k, v) for (m, k, v) in keys if m == module]
        # step 0 (module 0) keys: causal over pairs; any other step's keys: only the same pair j
        attend = ChainAttention(B, past, module == 0 and bool(past), s == 0, valid[:, :n])
        positions = (idx + s)[None].expand(B, n)
        if kind == "eagle3":
            logits, out, k, v = head.draft_logits(feats, in_tok, positions, None, None, attend)
        else:
            logits, out, k, v = head.step(module, feats, in_tok, positions, None, None, attend)
        t_logits = _rows(labels, lab, n)
        keys.append((module, k, v))
        logp = torch.log_softmax(logits.float(), -1)
        target_probs = torch.softmax(t_logits.float(), -1)
        per_pos = -(target_probs * logp).sum(-1)  # (B, n)
        w = ok.float()
        total = total + (0.8 ** s) * (per_pos * w).sum() / w.sum().clamp(min=1)
        with torch.no_grad():
            full = _rows(out_t.top, lab, n)
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


def _rows(x: torch.Tensor, first: int, n: int) -> torch.Tensor:
    """x[:, first : first + n], zero-padded to n rows."""
    rows = x[:, first : first + n]
    if rows.shape[1] < n:
        pad = [0, 0] * (x.dim() - 2) + [0, n - rows.shape[1]]
        rows = F.pad(rows, pad)
    return rows


class ChainAttention:
    """The Attend of TTT step s (model/layers.py's protocol: called with the new rows' q, k, v; .k, .v hold the
    new keys and values after the call), over what drafting would have in its cache at pair j:

        past[0]        step 0's keys of every pair i <= j      (when `causal_past`: module 0 at a later step)
        past[1:]       the later steps' keys of pair j alone
        the new keys   of every pair i <= j at step 0 (`causal_new`), else of pair j alone

    A key block that only its own pair sees is one score a row, (B, nh, n), not an n x n masked block: a step
    costs one n x n block whatever s is (as a dense mask, step s cost s + 1 of them)."""

    def __init__(self, batch: int, past: list[tuple[torch.Tensor, torch.Tensor]], causal_past: bool,
                 causal_new: bool, valid: torch.Tensor):
        """past: (k, v) per earlier step of this module, (B, nkv, n, hd) each; valid: (B, n), False = padding."""
        self.batch, self.past, self.causal_past, self.causal_new, self.valid = batch, past, causal_past, causal_new, valid
        self.k = self.v = None

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B = self.batch
        n, nh, hd = q.shape[0] // B, q.shape[1], q.shape[2]
        self.k = k.view(B, n, -1, hd).transpose(1, 2)  # (B, nkv, n, hd)
        self.v = v.view(B, n, -1, hd).transpose(1, 2)
        blocks = self.past + [(self.k, self.v)]
        causal = 0 if self.causal_past else (len(blocks) - 1 if self.causal_new else None)
        nkv = self.k.shape[1]
        qg = q.view(B, n, nkv, nh // nkv, hd).permute(0, 2, 3, 1, 4) / math.sqrt(hd)  # (B, nkv, g, n, hd)
        scores = []
        for i, (bk, _) in enumerate(blocks):
            if i == causal:
                s = qg @ bk[:, :, None].transpose(-1, -2)  # (B, nkv, g, n, n)
                idx = torch.arange(n, device=q.device)
                see = (idx[None, :] <= idx[:, None])[None] & self.valid[:, None, :]  # (B, n, n)
                scores.append(s.masked_fill(~see[:, None, None], float("-inf")))
            else:
                scores.append((qg * bk[:, :, None]).sum(-1, keepdim=True))  # (B, nkv, g, n, 1)
        p = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
        out, col = 0, 0
        for i, (_, bv) in enumerate(blocks):
            width = scores[i].shape[-1]
            part = p[..., col : col + width]
            out = out + (part @ bv[:, :, None] if i == causal else part * bv[:, :, None])  # (B, nkv, g, n, hd)
            col += width
        return out.reshape(B, nh, n, hd).transpose(1, 2).reshape(B * n, nh, hd)


class TTTLoss(torch.nn.Module):
    """ttt_loss as a module's forward, so DistributedDataParallel can wrap it (torchrun)."""

    def __init__(self, head, kind: str, target, steps: int, draft_ids=None):
        super().__init__()
        self.head, self.kind, self.target, self.steps, self.draft_ids = head, kind, target, steps, draft_ids

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor, answer: torch.Tensor | None = None) -> torch.Tensor:
        return ttt_loss(self.head, self.kind, self.target, tokens, valid, self.steps, self.draft_ids, answer)[0]

