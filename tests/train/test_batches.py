"""train/loop.py's epoch order: every sequence once, batches of like length, the same order for the same seed."""

import torch

from specdec.train import loop
from specdec.train.loop import length_grouped_order, mean_padded


def test_length_grouped_order_is_a_shuffle_whose_batches_hold_like_lengths():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 385, (1003,), generator=g).tolist()
    batch = 8
    order = length_grouped_order(lengths, batch, torch.Generator().manual_seed(1))
    assert sorted(order) == list(range(len(lengths)))
    assert order == length_grouped_order(lengths, batch, torch.Generator().manual_seed(1))
    assert order != length_grouped_order(lengths, batch, torch.Generator().manual_seed(2))
    whole = len(lengths) // batch * batch  # 1003 = 125 batches of 8 and a short one of 3, last
    batches = [order[i : i + batch] for i in range(0, whole, batch)]
    real = sum(lengths[j] for b in batches for j in b)
    padded = sum(max(lengths[j] for j in b) * batch for b in batches)
    assert real / padded > 0.9  # random batches: about 0.7
    assert [lengths[j] for j in order[whole:]] == sorted(lengths[j] for j in order[whole:])
    assert len(order) - whole == 3
    firsts = [lengths[b[0]] for b in batches]
    assert firsts != sorted(firsts)  # the batches themselves are shuffled, not sorted by length


def test_mean_padded_is_a_steps_cost_in_tokens():
    assert mean_padded([0, 1, 2, 3], [3, 5, 2, 2], 2) == 7.0  # (2 * 5 + 2 * 2) / 2
    assert mean_padded([0, 1, 2], [3, 5, 2], 2) == 10.0  # the short batch left out, as an epoch leaves it


def test_max_minutes_plans_the_warm_up_for_the_steps_that_fit(tmp_path, monkeypatch):
    """A step costs a millisecond a padded token on a fake clock. The count is fitted after 30 steps, so a run
    asked for 100000 steps in 60 seconds warms its learning rate up over a tenth of the ~150 that fit; fitted at
    step 100 (as it was), it spent those 100 steps warming up to a warm-up of 100000 steps' length."""
    clock, lrs = [0.0], []
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])
    head = torch.nn.Linear(4, 4)

    class Loss(torch.nn.Module):
        def forward(self, tokens, valid, answer):
            clock[0] += tokens.numel() * 1e-3
            lrs.append(trainer.opt.param_groups[0]["lr"])
            return (head.weight ** 2).sum()

    g = torch.Generator().manual_seed(0)
    train = [[1] * n for n in torch.randint(10, 200, (400,), generator=g).tolist()]
    trainer = loop.Trainer(head, "mtp", None, tmp_path, lambda h, folder: None, 100000, 4, 1e-3, 1, loss=Loss(),
                           save_every=10**9)
    trainer.run(train, [], "cpu", max_seconds=60)
    assert trainer.steps < 300 and 0.85 * 60 < clock[0] < 61  # the steps that fit the time (a step past it at most)
    assert max(lrs[:40]) > 0.9e-3  # warmed up within 40 steps (a tenth of 100000 steps' warm-up gave 0.4e-3)
