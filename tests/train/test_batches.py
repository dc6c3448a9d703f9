"""train/loop.py's epoch order: every sequence once, batches of like length, the same order for the same seed."""

import torch

from specdec.train.loop import length_grouped_order


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
