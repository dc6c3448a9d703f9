"""train/features.py: the target's outputs kept per training sequence are the ones the target computes,
whatever shares the batch and whatever the budget kept."""

import torch

from specdec.model.load import open_checkpoint
from specdec.train.features import FeatureCache
from specdec.train.loop import pad_batch
from specdec.train.target import DenseTarget


def test_kept_outputs_are_the_targets_own_and_do_not_depend_on_the_batch(tiny_hf_dir):
    target = DenseTarget(open_checkpoint(tiny_hf_dir)[0])
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, target.config.vocab_size, (n,), generator=g).tolist() for n in (9, 5, 12)]
    layers = (1, 2)
    tokens, valid, _ = pad_batch(seqs, "cpu")
    batched = target.outputs(tokens, valid, layers)

    cache = FeatureCache(target, budget=1 << 30)
    first = cache.outputs(tokens, valid, layers)
    assert (cache.hits, cache.misses) == (0, 3)
    for b, s in enumerate(seqs):  # each row: what the target gives that sequence in a padded batch
        n = len(s)
        assert torch.allclose(first.last[b, :n], batched.last[b, :n], atol=1e-5)
        assert torch.equal(first.top[b, :n], batched.top[b, :n])
        for i in layers:
            assert torch.allclose(first.hidden[i][b, :n], batched.hidden[i][b, :n], atol=1e-5)
        assert not first.last[b, n:].any()  # padding: zeros, never read
    vocab = torch.tensor([3, 1, 7])
    assert torch.allclose(first.logits(vocab), first.logits()[..., vocab])

    # another batch order and width: the rows come back from the cache, bit for bit what a cache that kept
    # nothing computes (a resumed run starts with an empty cache)
    order = [2, 0]
    tokens2, valid2, _ = pad_batch([seqs[i] for i in order], "cpu")
    again = cache.outputs(tokens2, valid2, layers)
    assert (cache.hits, cache.misses) == (2, 3)
    nothing = FeatureCache(target, budget=0)
    fresh = nothing.outputs(tokens2, valid2, layers)
    assert nothing.bytes == 0 and nothing.kept == {}
    for j, b in enumerate(order):
        n = len(seqs[b])
        assert torch.equal(again.last[j, :n], first.last[b, :n]) and torch.equal(fresh.last[j], again.last[j])
        assert all(torch.equal(fresh.hidden[i][j], again.hidden[i][j]) for i in layers)
    rows = torch.tensor([[0, 4], [1, 2]])
    assert torch.allclose(again.logits(rows=rows)[1, 0], again.logits()[1, 1])
