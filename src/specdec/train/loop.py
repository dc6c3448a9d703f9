"""The optimisation loop of a drafter head (Trainer): batches, the learning-rate schedule, validation,
checkpoints resumable from DIR/state.pt, and data parallel under torchrun. The losses are in ttt.py
(MTP / EAGLE-3) and block_loss.py (DFlash / DSpark).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from specdec.model.files import replaced
from specdec.train.curves import write_curves
from specdec.train.data import answer_start
from specdec.train.resume import read_state
from specdec.train.ttt import TTTLoss, ttt_loss


def pad_batch(seqs: list[list[int]], device, marker: tuple[int, ...] = ()
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """B sequences -> (tokens (B, T) zero-padded, valid (B, T): True on real tokens, answer (B, T): True on
    the tokens of the target's answer, from data.answer_start(seq, marker) on), T the longest."""
    width = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), width, dtype=torch.long)
    valid = torch.zeros(len(seqs), width, dtype=torch.bool)
    answer = torch.zeros(len(seqs), width, dtype=torch.bool)
    for b, s in enumerate(seqs):
        tokens[b, : len(s)] = torch.tensor(s)
        valid[b, : len(s)] = True
        answer[b, answer_start(s, marker) : len(s)] = True
    return tokens.to(device), valid.to(device), answer.to(device)


def length_grouped_order(lengths: list[int], batch: int, generator: torch.Generator, window: int = 16) -> list[int]:
    """A shuffled order of the sequences whose consecutive groups of `batch` hold sequences of like length, so
    that padding each batch to its longest wastes little (random batches of the shipped heads' data were 60-70%
    real tokens): the shuffled order is cut into windows of `window` batches, each window sorted by length and
    cut into batches, and the batches shuffled. A batch left short (the last window's) goes last, where an
    epoch that takes whole batches leaves it out, as it left out the tail of a plain shuffled order."""
    perm = torch.randperm(len(lengths), generator=generator).tolist()
    span = batch * window
    full, short = [], []
    for i in range(0, len(perm), span):
        chunk = sorted(perm[i : i + span], key=lambda j: lengths[j])
        for k in range(0, len(chunk), batch):
            (full if len(chunk) - k >= batch else short).append(chunk[k : k + batch])
    full = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
    return [j for b in full + short for j in b]


def mean_padded(order: list[int], lengths: list[int], batch: int) -> float:
    """The mean size of a padded batch (batch x its longest sequence) over the whole batches of `order`: what a
    step of this epoch costs, in tokens. lengths [3, 5, 2, 2], order [0, 1, 2, 3], batch 2 -> (10 + 4) / 2 = 7."""
    sizes = [batch * max(lengths[j] for j in order[i : i + batch]) for i in range(0, len(order) - batch + 1, batch)]
    return sum(sizes) / len(sizes) if sizes else 1.0


def mean_accept_length(accs: list[float]) -> float:
    """1 + sum_s prod_{t<=s} accs[t]: the mean accepted length of a chain whose step s matches at the
    conditional rate accs[s]. [0.5, 0.5] -> 1 + 0.5 + 0.25 = 1.75."""
    length, run = 1.0, 1.0
    for a in accs:
        run *= a
        length += run
    return length


class Trainer:
    """Runs the optimisation for a head; saves with `save(head, folder)`; resumable from DIR/state.pt."""

    def __init__(self, head, kind: str, target, out: Path, save, steps: int, batch: int, lr: float, ttt: int,
                 draft_ids=None, save_every: int = 200, log=print, rank: int = 0, world: int = 1,
                 loss: torch.nn.Module | None = None, settings: dict | None = None, marker: tuple[int, ...] = ()):
        """loss: a module whose forward(tokens, valid, answer) is the training loss and whose evaluate(tokens,
        valid, answer) gives (loss, matches, counts per draft position) (default: TTT for MTP / EAGLE-3 heads).
        settings: what a resumed run must repeat (check_resume), saved in state.pt. marker: the ids before each
        answer (data.answer_marker): losses and validation score the answers' tokens only."""
        self.head, self.kind, self.target, self.out, self.save = head, kind, target, Path(out), save
        self.settings = settings or {}
        self.steps, self.batch, self.lr, self.ttt = steps, batch, lr, ttt
        self.draft_ids, self.marker = draft_ids, tuple(marker)
        self.save_every, self.log, self.rank, self.world = save_every, log, rank, world
        params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
        self.loss = loss if loss is not None else TTTLoss(head, kind, target, ttt, draft_ids)
        # validation: (loss, matches, counts) per draft position; a block drafter's on anchors of a fixed seed
        self.evaluate = getattr(self.loss, "evaluate", None) or (
            lambda tokens, valid, answer: ttt_loss(head, kind, target, tokens, valid, ttt, draft_ids, answer))
        if world > 1:  # data parallel under torchrun: DDP averages the gradients of all ranks
            self.loss = DistributedDataParallel(self.loss, broadcast_buffers=False)
        self.step = 0
        self._data = None  # {"rng", "order", "pos"}: where run() is in the shuffled data (saved in state.pt)
        # one entry per validation (curves.json): step, epoch, train_loss (mean since the last entry), val_loss,
        # val_acc, accept_len, tokens (trained so far); saved in state.pt, so a resumed run's curves go on
        self.history: list[dict] = []
        self._loss_sum, self._loss_n, self.tokens = 0.0, 0, 0

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
        # anchors the run would have taken (each sequence once per epoch)
        self._data = state.get("data")
        self.history = list(state.get("history", []))
        self._loss_sum, self._loss_n, self.tokens = state.get("running", (0.0, 0, 0))
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
            extra.update(history=self.history, running=(self._loss_sum, self._loss_n, self.tokens))
            if self._loss_generator() is not None:
                extra["loss_rng"] = self._loss_generator().get_state()
            torch.save({"head": self.head.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                        "kind": self.kind, "settings": self.settings, **extra}, tmp)

    def _agree(self, value, how):
        """The same decision on every rank (how: min or max over ranks), so that all stop together."""
        if self.world <= 1:
            return value
        t = torch.tensor([int(value)], dtype=torch.long, device=next(self.head.parameters()).device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN if how is min else dist.ReduceOp.MAX)
        return type(value)(t.item())

    @torch.no_grad()
    def validate(self, seqs: list[list[int]], device) -> list[float]:
        """Per draft position, the rate the held-out answers agree with the target at (conditional on the
        positions before; pairs and anchors in the answers only, as drafting meets them); self.val_loss: their
        mean loss per batch."""
        self.head.eval()
        m_tot, c_tot, losses = None, None, []
        seqs = sorted(seqs, key=len)  # batches of like length: little padding
        for i in range(0, len(seqs), self.batch):
            tokens, valid, answer = pad_batch(seqs[i : i + self.batch], device, self.marker)
            loss, m, c = self.evaluate(tokens, valid, answer)
            losses.append(float(loss))
            m_tot = m if m_tot is None else [a + b for a, b in zip(m_tot, m)]
            c_tot = c if c_tot is None else [a + b for a, b in zip(c_tot, c)]
        self.head.train()
        self.val_loss = sum(losses) / len(losses) if losses else None
        return [a / max(b, 1) for a, b in zip(m_tot or [], c_tot or [])]

    def record(self, val: list[list[int]], device, epoch: float) -> list[float]:
        """Validate, add the entry to the history, rewrite DIR/curves.json and .png (rank 0); the accuracies."""
        accs = self.validate(val, device)
        self.history.append({"step": self.step, "epoch": round(epoch, 4),
                             "train_loss": round(self._loss_sum / self._loss_n, 5) if self._loss_n else None,
                             "val_loss": round(self.val_loss, 5) if self.val_loss is not None else None,
                             "val_acc": [round(a, 4) for a in accs],
                             "accept_len": round(mean_accept_length(accs), 4), "tokens": self.tokens})
        self._loss_sum, self._loss_n = 0.0, 0
        if self.rank == 0:
            write_curves(self.out, self.history, f"{self.kind} head")
        return accs

    def run(self, train: list[list[int]], val: list[list[int]], device, seed: int = 0,
            max_seconds: float | None = None) -> list[float]:
        """Train to self.steps; with max_seconds, the step count shrinks to what fits (fitted after 30 steps and
        again after 100), and training stops when the time is up whatever the estimate said."""
        g = torch.Generator().manual_seed(seed + self.step)
        self.head.train()
        bar = tqdm(total=self.steps, initial=self.step, desc=f"train {self.kind}", unit="step", file=sys.stderr,
                   disable=self.rank != 0, dynamic_ncols=True)
        accs = []
        saved = self._data
        lengths = [len(t) for t in train]
        if saved is not None and sorted(saved["order"]) == list(range(len(train))):  # resumed where it was
            g.set_state(saved["rng"])
            order, pos = list(saved["order"]), int(saved["pos"])
        else:
            order = length_grouped_order(lengths, self.batch, g)
            pos = (self.step * self.batch) % max(len(train), 1)
        use_amp = str(device).startswith("cuda")
        start, t_start, t_first = self.step, time.perf_counter(), time.perf_counter()
        tokens_start, asked, timed = self.tokens, self.steps, 0  # timed: padded tokens since t_first
        while self.step < self.steps:
            if pos + self.batch > len(order):  # an epoch ends: validated (once a step), reshuffled
                if val and self.step > 0 and (not self.history or self.history[-1]["step"] != self.step):
                    accs = self.record(val, device, self.step * self.batch / max(len(train), 1))
                order = length_grouped_order(lengths, self.batch, g)
                pos = 0
            seqs = [train[i] for i in order[pos : pos + self.batch]]
            pos += self.batch
            self._data = {"rng": g.get_state(), "order": order, "pos": pos}
            tokens, valid, answer = pad_batch(seqs, device, self.marker)
            for group in self.opt.param_groups:
                group["lr"] = self.lr_at(self.step)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=use_amp):
                loss = self.loss(tokens, valid, answer)
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
            self.opt.step()
            self.step += 1
            self._loss_sum += loss.item()
            self._loss_n += 1
            self.tokens += int(valid.sum()) * self.world  # (ranks train batches of alike size)
            bar.update(1)
            timed += tokens.numel()
            if self.step == start + 20:  # time steps after the warm-up (allocator, kernel choice, the other jobs)
                t_first, timed = time.perf_counter(), 0
            if max_seconds and self._agree(time.perf_counter() - t_start > max_seconds, max):
                self.steps = self.step  # out of time: validate, save and stop here
            elif max_seconds and self.step in (start + 30, start + 100):
                # fitted early, so that a short run's warm-up (a tenth of its steps: lr_at) is planned for the
                # steps it will run, and again on more steps; a step's time per padded token, times this
                # epoch's mean batch (batches of like length vary several-fold)
                step_s = (time.perf_counter() - t_first) / max(timed, 1) * mean_padded(order, lengths, self.batch)
                left = max_seconds - (time.perf_counter() - t_start)
                fit = self._agree(self.step + int(left / step_s * 0.95), min)
                self.steps = max(min(fit, asked), self.step)
                bar.total = self.steps
            post = {"loss": f"{loss.item():.3f}"}
            if self.step % self.save_every == 0 or self.step == self.steps:  # on every rank (checkpoint's check)
                if val:
                    accs = self.record(val, device, self.step * self.batch / max(len(train), 1))
                    post["val_acc"] = "/".join(f"{a:.2f}" for a in accs)
                    post["accept_len"] = f"{mean_accept_length(accs):.2f}"
                self.checkpoint()
            bar.set_postfix(post)
        bar.close()
        self.tokens_per_s = (self.tokens - tokens_start) / max(time.perf_counter() - t_start, 1e-9)
        return accs
