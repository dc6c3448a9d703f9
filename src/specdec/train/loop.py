"""Training drafters against a frozen target: MTP and EAGLE-3 heads with training-time test (TTT), and
DFlash / DSpark block drafters (block_loss, below).

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
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.model.files import replaced


def pad_batch(seqs: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = torch.tensor(s)
        valid[b, : len(s)] = True
    return tokens.to(device), valid.to(device)


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
            # step s counts where steps 0..s-1 matched: matches / counts is conditional, as drafting accepts
            # (mean_accept_length multiplies them; unconditional rates under-reported it, 2.38 for 2.49)
            counts.append(int((prefix & ok).sum()))
            prefix = prefix & (guess == full) & ok
            matches.append(float(prefix.sum()))
        feats = out.float()  # what drafting feeds back (MTPHead.step picks normed or pre-norm per layout)
    return total, matches, counts


def sample_anchors(valid: torch.Tensor, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Block drafter training: `count` random anchor positions a per sequence (sorted) where the anchor
    and its first label a + 1 are real tokens, as DeepSpec samples them. valid (B, T) ->
    (anchors (B, count), keep (B, count): False for the padding anchors of short sequences)."""
    B, T = valid.shape
    ok = valid[:, :-1] & valid[:, 1:]  # (B, T-1): candidate anchors
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
    """DFlash / DSpark training loss on a padded batch, with one block per anchor (the published recipe,
    deepseek-ai/DeepSpec dspark/loss.py):

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
    target_logits, hidden = target.forward(tokens, valid, hidden_layers=cfg.hidden_layers)
    ctx = model.context(hidden)  # (Bt, T, H)
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
    t_logits = target_logits.gather(1, (safe - 1).view(Bt, -1, 1).expand(-1, -1, V)).view(Bt, A, n, V)
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

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        anchors, keep = sample_anchors(valid, self.anchors, self.generator)
        return block_loss(self.head, self.target, tokens, valid, anchors, keep, **self.weights)[0]

    def measure(self, tokens: torch.Tensor, valid: torch.Tensor) -> tuple[list[float], list[int]]:
        """Validation (matches, counts) per draft position, on anchors drawn with a fixed seed."""
        anchors, keep = sample_anchors(valid, self.anchors, torch.Generator().manual_seed(1234))
        return block_loss(self.head, self.target, tokens, valid, anchors, keep, **self.weights)[1:]


def mean_accept_length(accs: list[float]) -> float:
    length, run = 1.0, 1.0
    for a in accs:
        run *= a
        length += run
    return length


class TTTLoss(torch.nn.Module):
    """ttt_loss as a module's forward, so DistributedDataParallel can wrap it (torchrun)."""

    def __init__(self, head, kind: str, target, steps: int, draft_ids=None):
        super().__init__()
        self.head, self.kind, self.target, self.steps, self.draft_ids = head, kind, target, steps, draft_ids

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        return ttt_loss(self.head, self.kind, self.target, tokens, valid, self.steps, self.draft_ids)[0]


class Trainer:
    """Runs the optimisation for a head; saves with `save(head, folder)`; resumable from DIR/state.pt."""

    def __init__(self, head, kind: str, target, out: Path, save, steps: int, batch: int, lr: float, ttt: int,
                 draft_ids=None, save_every: int = 200, log=print, rank: int = 0, world: int = 1,
                 loss: torch.nn.Module | None = None, settings: dict | None = None):
        """loss: a module whose forward(tokens, valid) is the training loss and whose measure(tokens, valid)
        gives (matches, counts) per draft position (default: TTT for MTP / EAGLE-3 heads). settings: what a
        resumed run must repeat (check_resume), saved in state.pt."""
        self.head, self.kind, self.target, self.out, self.save = head, kind, target, Path(out), save
        self.settings = settings or {}
        self.steps, self.batch, self.lr, self.ttt = steps, batch, lr, ttt
        self.draft_ids = draft_ids
        self.save_every, self.log, self.rank, self.world = save_every, log, rank, world
        params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.loss = loss if loss is not None else TTTLoss(head, kind, target, ttt, draft_ids)
        self.measure = getattr(self.loss, "measure", None) or (
            lambda tokens, valid: ttt_loss(head, kind, target, tokens, valid, ttt, draft_ids)[1:])
        if world > 1:  # data parallel under torchrun: DDP averages the gradients of all ranks
            from torch.nn.parallel import DistributedDataParallel

            self.loss = DistributedDataParallel(self.loss, broadcast_buffers=False)
        self.step = 0
        self._data = None  # {"rng", "order", "pos"}: where run() is in the shuffled data (saved in state.pt)

    def lr_at(self, step: int) -> float:
        warm = max(1, min(100, self.steps // 10))
        if step < warm:
            return self.lr * (step + 1) / warm
        return self.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, self.steps - warm)))

    def state_path(self) -> Path:
        return self.out / "state.pt"

    def resume(self, state: dict | None = None) -> bool:
        """Load DIR/state.pt (or `state`, what check_resume read from it); False when there is none."""
        p = self.state_path()
        state = read_state(p) if state is None else state
        if state is None:
            return False
        head_state, opt_state, step = state["head"], state["opt"], int(state["step"])
        kind = state.get("kind", self.kind)
        params = {k for k, _ in self.head.named_parameters()}
        theirs = set(head_state)
        if kind != self.kind or not params <= theirs or theirs - set(self.head.state_dict()):
            raise ValueError(f"{p} was written by another head ({kind}) or with other settings (--draft-vocab, "
                             f"--target-layers, --block-size, ...): resume with the settings it was trained with, "
                             f"or train into another --out")
        try:
            self.head.load_state_dict(head_state, strict=False)  # buffers derived from the settings may be absent
            self.opt.load_state_dict(opt_state)
        except Exception as exc:  # a tensor of another shape
            raise ValueError(f"{p} does not fit this head ({type(exc).__name__}: {exc}): it was trained with other "
                             "settings; resume with those, or train into another --out") from None
        self.step = step
        # the data order and the loss's random draws where they were, so that a resumed run takes the batches and
        # anchors the run would have taken (without them some sequences came twice in an epoch, others never)
        self._data = state.get("data")
        rng = state.get("loss_rng")
        if rng is not None and self._loss_generator() is not None:
            self._loss_generator().set_state(rng)
        return True

    def _loss_generator(self) -> torch.Generator | None:
        loss = getattr(self.loss, "module", self.loss)  # DistributedDataParallel's wrapped module
        return getattr(loss, "generator", None)

    def checkpoint(self) -> None:
        """Save the head and the training state, each file replaced whole (a kill mid-save keeps the last)."""
        if not all(torch.isfinite(p).all() for p in self.head.parameters()):  # on every rank: DDP's weights agree,
            # so all ranks stop together instead of the others waiting for rank 0 in the next all-reduce
            raise ValueError(f"training diverged: the head's weights are not finite at step {self.step}; nothing "
                             f"was saved (the last checkpoint in {self.out}, if any, is kept): lower --lr")
        if self.rank != 0:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        self.save(self.head, self.out)
        with replaced(self.state_path()) as tmp:
            extra = {"data": self._data} if self._data is not None else {}
            if self._loss_generator() is not None:
                extra["loss_rng"] = self._loss_generator().get_state()
            torch.save({"head": self.head.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                        "kind": self.kind, "settings": self.settings, **extra}, tmp)

    def _agree(self, value, how):
        """The same decision on every rank (how: min or max over ranks), so that all stop together."""
        if self.world <= 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([int(value)], dtype=torch.long, device=next(self.head.parameters()).device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN if how is min else dist.ReduceOp.MAX)
        return type(value)(t.item())

    @torch.no_grad()
    def validate(self, seqs: list[list[int]], device) -> list[float]:
        self.head.eval()
        m_tot, c_tot = None, None
        for i in range(0, len(seqs), self.batch):
            tokens, valid = pad_batch(seqs[i : i + self.batch], device)
            m, c = self.measure(tokens, valid)
            m_tot = m if m_tot is None else [a + b for a, b in zip(m_tot, m)]
            c_tot = c if c_tot is None else [a + b for a, b in zip(c_tot, c)]
        self.head.train()
        return [a / max(b, 1) for a, b in zip(m_tot or [], c_tot or [])]

    def run(self, train: list[list[int]], val: list[list[int]], device, seed: int = 0,
            max_seconds: float | None = None) -> list[float]:
        """Train to self.steps; with max_seconds, the step count shrinks to what fits (measured after 20
        steps), and training stops when the time is up whatever the estimate said."""
        import time

        from tqdm import tqdm

        g = torch.Generator().manual_seed(seed + self.step)
        self.head.train()
        bar = tqdm(total=self.steps, initial=self.step, desc=f"train {self.kind}", unit="step", file=sys.stderr,
                   disable=self.rank != 0, dynamic_ncols=True)
        accs = []
        saved = self._data
        if saved is not None and sorted(saved["order"]) == list(range(len(train))):  # resumed where it was
            g.set_state(saved["rng"])
            order, pos = list(saved["order"]), int(saved["pos"])
        else:
            order = torch.randperm(len(train), generator=g).tolist()
            pos = (self.step * self.batch) % max(len(train), 1)
        use_amp = str(device).startswith("cuda")
        start, t_start, t_first = self.step, time.perf_counter(), time.perf_counter()
        while self.step < self.steps:
            if pos + self.batch > len(order):
                order = torch.randperm(len(train), generator=g).tolist()
                pos = 0
            seqs = [train[i] for i in order[pos : pos + self.batch]]
            pos += self.batch
            self._data = {"rng": g.get_state(), "order": order, "pos": pos}
            tokens, valid = pad_batch(seqs, device)
            for group in self.opt.param_groups:
                group["lr"] = self.lr_at(self.step)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
                loss = self.loss(tokens, valid)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
            self.opt.step()
            self.step += 1
            bar.update(1)
            if self.step == start + 20:  # time steps after the warm-up (allocator, kernel choice, the other jobs)
                t_first = time.perf_counter()
            if max_seconds and self._agree(time.perf_counter() - t_start > max_seconds, max):
                self.steps = self.step  # out of time: validate, save and stop here
            elif max_seconds and self.step == start + 100:
                per_step = (time.perf_counter() - t_first) / 80
                left = max_seconds - (time.perf_counter() - t_start)
                fit = self._agree(self.step + int(left / per_step * 0.95), min)
                if fit < self.steps:
                    self.steps = max(fit, self.step)
                    bar.total = self.steps
            post = {"loss": f"{loss.item():.3f}"}
            if self.step % self.save_every == 0 or self.step == self.steps:  # on every rank (checkpoint's check)
                if val:
                    accs = self.validate(val, device)
                    post["val_acc"] = "/".join(f"{a:.2f}" for a in accs)
                    post["accept_len"] = f"{mean_accept_length(accs):.2f}"
                self.checkpoint()
            bar.set_postfix(post)
        bar.close()
        return accs


def read_state(path: Path) -> dict | None:
    """DIR/state.pt as checkpoint wrote it, None when there is none; a clear error for anything else."""
    if path.exists() and not path.is_file():
        raise ValueError(f"{path} is not a file: remove it, or train into another --out")
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        state["head"], state["opt"], int(state["step"])
    except Exception as exc:  # truncated, or not torch's format
        raise ValueError(f"{path} is not a readable training state ({type(exc).__name__}: {exc}); remove it to "
                         "train from the start") from None
    return state


def check_resume(path: Path, kind: str, settings: dict) -> dict | None:
    """Before any data is generated: the state a --resume continues (None: none yet), refused when it was
    trained as another kind of head or with other settings (its data, world size, --seq-len, the head's
    shape and taps), which a resumed run would otherwise change silently half-way (an EAGLE-3 head's
    draft vocabulary comes from its data). States written before settings were saved are not checked."""
    state = read_state(path)
    if state is None:
        return None
    theirs = state.get("kind", kind)
    if theirs != kind:
        raise ValueError(f"{path} was written by another head ({theirs}): resume it with specdec train {theirs}, "
                         "or train into another --out")
    saved = state.get("settings")
    if saved:  # the settings the state recorded (one written before a setting was recorded is not held to it)
        differ = [f"{k} {saved.get(k)!r} then, {settings.get(k)!r} now" for k in sorted(saved)
                  if saved.get(k) != settings.get(k)]
        if differ:
            raise ValueError(f"{path} was trained with other settings ({'; '.join(differ)}): resume with the "
                             "settings it was trained with, or train into another --out")
    return state


def init_distributed():
    """(rank, world, device) from torchrun's environment; (0, 1, None) for a plain process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, None
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    device = None
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    return rank, world, device


def finish_distributed(world: int, ok: bool) -> None:
    """Leaves torchrun's process group before the interpreter shuts down: a gloo rank that exits
    without it can still hold finished work whose tensors are freed during finalization, and
    aborts (SIGABRT; seen once in CI, see pytorch PR 179291). After a barrier when this rank
    finished, so that none leaves while another still talks to it; without one after an error,
    which the other ranks may never reach."""
    if world <= 1:
        return
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if ok:
        dist.barrier()
    dist.destroy_process_group()
