"""Fresh drafter heads for a target (DenseTarget), warm-started from its last layers; the EAGLE-3 draft
vocabulary; the record of the target that a saved head carries."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from specdec.drafters.block.config import BlockConfig, default_target_layers
from specdec.drafters.block.model import BlockDraftModel, TargetParts
from specdec.drafters.eagle3 import Eagle3Config, Eagle3Head, check_eagle3_folder, default_taps
from specdec.drafters.eagle_formats import read_tensors
from specdec.drafters.mtp import MTPHead
from specdec.model.catalogue import cached_sha256


def build_mtp_head(target, num_modules: int = 1, seed: int = 0):
    """A fresh MTPHead on a DenseTarget, its block initialised from the target's last layer."""
    torch.manual_seed(seed)
    c = target.config
    W = target.lm_head
    head = MTPHead(c, num_modules, target.embed, lambda x: F.linear(x.to(W.dtype), W).float(), target.norm)
    last = target.layers[-1].state_dict()  # the target's last DecoderLayer: the block's tensor names
    attn_norm = last.pop("input_layernorm.weight")  # which an MTP module keeps beside its block
    H = c.hidden_size
    with torch.no_grad():
        for mod in head.mods:
            mod.block.load_state_dict(last)
            mod.input_layernorm.weight.copy_(attn_norm)
            mod.norm.weight.copy_(target.norm)
            eh = torch.randn(H, 2 * H) * 0.01
            eh[:, H:] += torch.eye(H)  # start as h' = hnorm(h): the target's own state, then learn the token
            mod.eh_proj.weight.copy_(eh)
    return head


def build_eagle3_head(target, draft_ids: torch.Tensor, seed: int = 0):
    """A fresh Eagle3Head; lm_head rows from the target's output head, fc starting at the high tap."""
    torch.manual_seed(seed)
    c = target.config
    cfg = Eagle3Config(hidden_size=c.hidden_size, num_heads=c.num_heads, num_kv_heads=c.num_kv_heads,
                       head_dim=c.head_dim, intermediate_size=c.intermediate_size, vocab_size=c.vocab_size,
                       draft_vocab_size=len(draft_ids), rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                       max_positions=c.context_length, taps=default_taps(c.num_layers))
    head = Eagle3Head(cfg, target.embed)
    H = c.hidden_size
    with torch.no_grad():
        # warm start from the target's last layer: the attention's hidden half and the MLP copy it
        last, mid = target.layers[-1], head.midlayer  # two DecoderLayers
        for name in ("q_proj", "k_proj", "v_proj"):
            proj = getattr(mid.self_attn, name)
            proj.weight.normal_(0.0, 0.02)
            proj.weight[:, H:] = getattr(last.self_attn, name).weight
        mid.self_attn.o_proj.weight.copy_(last.self_attn.o_proj.weight)
        mid.mlp.load_state_dict(last.mlp.state_dict())
        mid.hidden_norm.weight.copy_(last.input_layernorm.weight)
        mid.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        fc = torch.randn(H, 3 * H) * 0.01
        fc[:, 2 * H :] += torch.eye(H)
        head.fc.weight.copy_(fc)
        head.norm.weight.copy_(target.norm.float())
        head.lm_head.weight.copy_(target.lm_head[draft_ids.to(target.lm_head.device)].float())
        head.set_vocab_map(draft_ids.cpu())
    return head


def continued_eagle3_head(folder, target, name: str, seed: int = 0) -> tuple[Eagle3Head, torch.Tensor]:
    """(head, draft vocabulary) of the EAGLE-3 head in `folder` that a run goes on training (--init-from): a
    head for this target in any published layout, of the shape build_eagle3_head gives it, with its weights."""
    cfg, files = check_eagle3_folder(folder, target.config, name)  # its target, names and shapes
    tensors = read_tensors(files)
    d2t = tensors.get("d2t")
    draft_ids = torch.arange(cfg.draft_vocab_size) + (d2t.long() if d2t is not None else 0)
    head = build_eagle3_head(target, draft_ids, seed)
    fresh = head.state_dict()
    differ = [f"{k} {tuple(v.shape)} (here {tuple(fresh[k].shape)})" for k, v in tensors.items()
              if k in fresh and v.shape != fresh[k].shape]
    if differ or tuple(cfg.taps) != default_taps(target.config.num_layers):
        raise ValueError(f"--init-from {folder}: the head is shaped otherwise than the one specdec trains for this "
                         f"target ({'; '.join(differ) or f'taps {tuple(cfg.taps)}'}): train a fresh head")
    head.load_state_dict({k: v.float() for k, v in tensors.items() if k in fresh and k not in ("d2t", "t2d")},
                         strict=False)
    return head, draft_ids


def block_settings(args, c) -> tuple[list[int], int]:
    """DFlash / DSpark training's target layers and mask token, checked against the target's config `c`."""
    if c.rope_freq_factors is not None:
        raise ValueError(f"specdec train {args.kind}: targets with scaled RoPE (Llama 3.x) are not supported yet")
    if args.block_size < 2:
        raise ValueError(f"--block-size must be at least 2, got {args.block_size}")
    if args.target_layers:
        try:
            ids = [int(i) for i in args.target_layers.split(",")]
        except ValueError:
            raise ValueError(f"--target-layers {args.target_layers!r}: give layer numbers separated by commas, "
                             "e.g. 1,8,15") from None
    else:
        ids = default_target_layers(c.num_layers, args.draft_layers)
    if not all(-1 <= i < c.num_layers for i in ids):
        raise ValueError(f"--target-layers {ids}: the target has layers 0..{c.num_layers - 1} (-1: the embeddings)")
    mask = c.vocab_size - 1 if args.mask_token_id is None else args.mask_token_id
    if not 0 <= mask < c.vocab_size:
        raise ValueError(f"--mask-token-id {mask} is outside the vocabulary (0..{c.vocab_size - 1})")
    return ids, mask


def build_block_model(target, layout: str, block_size: int, num_layers: int, layer_ids, mask_token_id: int,
                      markov_rank: int = 0, markov_head: str = "vanilla", seed: int = 0):
    """A fresh DFlash / DSpark BlockDraftModel on a DenseTarget: its layers start as copies of the target's
    last ones, fc as the identity on the last tapped layer, the Markov bias at zero."""
    c = target.config
    if c.rope_freq_factors is not None:
        raise ValueError("specdec train dflash/dspark: targets with scaled RoPE (Llama 3.x) are not supported yet")
    spark = layout == "dspark"
    cfg = BlockConfig(layout=layout, hidden_size=c.hidden_size, num_layers=num_layers, num_heads=c.num_heads,
                      num_kv_heads=c.num_kv_heads, head_dim=c.head_dim, intermediate_size=c.intermediate_size,
                      vocab_size=c.vocab_size, target_layer_ids=tuple(layer_ids), mask_token_id=mask_token_id,
                      block_size=block_size, num_target_layers=c.num_layers, rms_norm_eps=c.rms_norm_eps,
                      rope_theta=c.rope_theta, max_positions=c.context_length,
                      markov_rank=markov_rank if spark else 0, markov_head_type=markov_head if spark and markov_rank
                      else None, confidence_head=spark, confidence_with_markov=spark and markov_rank > 0)
    W = target.lm_head
    parts = TargetParts(target.embed, lambda x: F.linear(x.to(W.dtype), W).float(), target.norm, c.rms_norm_eps,
                        c.num_layers)
    torch.manual_seed(seed)
    model = BlockDraftModel(cfg, parts, c.context_length + block_size + 1)
    H, k = c.hidden_size, len(cfg.target_layer_ids)
    with torch.no_grad():
        for mine, theirs in zip(model.layers, target.layers[-num_layers:]):
            weights = {n: t.float() for n, t in theirs.state_dict().items() if "bias" not in n}
            mine.load_state_dict(weights, strict=False)
        fc = torch.randn(H, k * H) * 0.01
        fc[:, (k - 1) * H:] += torch.eye(H)
        model.fc.weight.copy_(fc)
        if cfg.markov_rank:
            model.markov_head.markov_w2.weight.zero_()
        if cfg.confidence_head:
            model.confidence_head.proj.weight.zero_()
            model.confidence_head.proj.bias.zero_()
    return model


def frequent_tokens(seqs: list[list[int]], size: int, vocab: int, device="cpu", world: int = 1) -> torch.Tensor:
    """The `size` most frequent token ids in seqs (ties by id), ascending: the EAGLE-3 draft vocabulary.

    Under torchrun (world > 1) the counts of every rank's share are summed first, so that all
    ranks train the same draft vocabulary."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in seqs:
        counts += torch.bincount(torch.tensor(s), minlength=vocab)[:vocab]
    if world > 1:
        counts = counts.to(device)
        dist.all_reduce(counts)
        counts = counts.cpu()
    size = min(size, vocab)
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))[:size]
    return torch.tensor(sorted(order))


def target_info(model_name: str, path, checkpoint) -> dict:
    """The target a saved head records (its config.json's specdec.target): name, file digest, shapes."""
    c = checkpoint.config
    sha = cached_sha256(path) if Path(path).is_file() else None
    return {"names": [model_name], "sha256": [sha] if sha else [], "arch": c.arch, "hidden_size": c.hidden_size,
            "num_layers": c.num_layers, "vocab_size": c.vocab_size}
