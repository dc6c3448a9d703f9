"""`specdec train mtp|eagle3|dflash|dspark`: train a drafter for a target by self-distillation.

    specdec train mtp --model smollm2-135m --out DIR            (CPU, one process)
    torchrun --nproc-per-node 8 -m specdec.cli train eagle3 --model M --out DIR   (data parallel)

Data: the target continues prompts (--prompts FILE, one per line; default a built-in list)
and a plain corpus is added (--data FILE ..., paragraphs; default Python stdlib docstrings).
Sequences are cached in DIR/data.rank0.npz, so a resumed run (--resume) trains on the same
text; --sequences FILE trains on a saved set instead (the shipped heads' data is in
specdec/heads/<model>/train_data.npz).
Heads are written in the formats the loaders read: MTP as config.json + model.safetensors in
the DeepSeek-V3 layout (default DIR: beside the model, `<model>.mtp/`, where auto finds it),
EAGLE-3 in the published format (fc, midlayer.*, norm, lm_head, d2t, t2d), DFlash / DSpark in
theirs (drafters/dflash.py: config.json with dflash_config / DSpark's keys, model.safetensors).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train an MTP, EAGLE-3, DFlash or DSpark drafter for a model (self-distillation)")
    add_arguments(p)
    p.set_defaults(func=cmd_train)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", choices=["mtp", "eagle3", "dflash", "dspark"])
    p.add_argument("--model", "-m", default="smollm2-135m", help="target: model name, GGUF file or HF folder")
    p.add_argument("--name", default=None, help="the target's registry name recorded in the head (default --model)")
    p.add_argument("--out", default=None, help="output folder (mtp default: <model path>.mtp beside the model)")
    p.add_argument("--prompts", default=None, help="prompts file, one per line (default: built-in prompts)")
    p.add_argument("--data", nargs="*", default=None, help="plain-text corpus files (default: stdlib docstrings)")
    p.add_argument("--sequences", default=None,
                   help="train on these token sequences (.npz from an earlier run) instead of generating")
    p.add_argument("--generate", type=int, default=512, help="sequences the target generates from prompts")
    p.add_argument("--gen-tokens", type=int, default=192, help="tokens generated per prompt")
    p.add_argument("--corpus-seqs", type=int, default=256, help="corpus chunks added")
    p.add_argument("--seq-len", type=int, default=384)
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps (0: build the training sequences only)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ttt", type=int, default=3, help="training-time-test steps (head fed its own outputs)")
    p.add_argument("--draft-vocab", type=int, default=6144, help="EAGLE-3 draft vocabulary size")
    p.add_argument("--val", type=int, default=32,
                   help="validation sequences (continuations of prompts held out of training)")
    block = p.add_argument_group("dflash / dspark")
    block.add_argument("--block-size", type=int, default=4, help="block: the last token + MASK x (B-1) (default 4)")
    block.add_argument("--draft-layers", type=int, default=1, help="decoder layers of the drafter (default 1)")
    block.add_argument("--target-layers", default=None,
                       help="target layer ids it reads, comma-separated, counted from 0 "
                            "(default: spread from 1 to N-3)")
    block.add_argument("--mask-token-id", type=int, default=None, help="the MASK token (default: the last id)")
    block.add_argument("--anchors", type=int, default=16, help="blocks per training sequence (default 16)")
    block.add_argument("--loss-decay", type=float, default=4.0, help="position weight exp(-d / decay) (default 4)")
    block.add_argument("--markov-rank", type=int, default=32, help="dspark: rank of the Markov bias (0 = none)")
    block.add_argument("--markov-head", default="vanilla", choices=["vanilla", "gated", "rnn"], help="dspark")
    p.add_argument("--save-every", type=int, default=200)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resume", action="store_true", help="continue from DIR/state.pt")
    p.add_argument("--max-minutes", type=float, default=None,
                   help="fit the step count (and its learning-rate schedule) into this much training time")


def build_mtp_head(target, num_modules: int = 1, seed: int = 0):
    """A fresh MTPHead on a DenseTarget, its block initialised from the target's last layer."""
    import torch.nn.functional as F

    from specdec.drafters.mtp import MTPHead

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
    from specdec.drafters.eagle3 import Eagle3Config, Eagle3Head, default_taps

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


def block_settings(args, c) -> tuple[list[int], int]:
    """DFlash / DSpark training's target layers and mask token, checked against the target's config `c`."""
    from specdec.drafters.dflash import default_target_layers

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
    import torch.nn.functional as F

    from specdec.drafters.dflash import BlockConfig, BlockDraftModel, TargetParts

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
        import torch.distributed as dist

        counts = counts.to(device)
        dist.all_reduce(counts)
        counts = counts.cpu()
    size = min(size, vocab)
    order = sorted(range(vocab), key=lambda i: (-int(counts[i]), i))[:size]
    return torch.tensor(sorted(order))


def target_info(model_name: str, path, checkpoint) -> dict:
    from specdec.model.catalogue import cached_sha256

    c = checkpoint.config
    sha = cached_sha256(path) if Path(path).is_file() else None
    return {"names": [model_name], "sha256": [sha] if sha else [], "arch": c.arch, "hidden_size": c.hidden_size,
            "num_layers": c.num_layers, "vocab_size": c.vocab_size}


MIN_SEQUENCE_TOKENS = 8  # a shorter training sequence (generated or read) is too short to teach anything

# the least each count may be (flags left at None keep their meaning: "the default")
# (seq_len: sequences of fewer than 8-9 tokens are dropped as too short to teach anything)
_LEAST = {"generate": 0, "gen_tokens": 1, "corpus_seqs": 0, "seq_len": 9, "steps": 0, "batch": 1, "ttt": 1,
          "draft_vocab": 1, "val": 0, "block_size": 2, "draft_layers": 1, "anchors": 1, "markov_rank": 0,
          "save_every": 1, "threads": 1}


def check_train_args(args) -> None:
    """A bad count or rate, or an --out that cannot be written, is one clear error before the target loads or
    any data is generated."""
    from specdec.model.device import pick_device
    from specdec.cli.options import out_dir

    if getattr(args, "out", None) is not None:
        out_dir(args.out)
    if getattr(args, "device", None) is not None:
        pick_device(args.device)  # a device torch cannot use: one line, not a traceback after loading
    for name, least in _LEAST.items():
        value = getattr(args, name, None)
        if value is not None and value < least:
            raise ValueError(f"--{name.replace('_', '-')} must be at least {least}, got {value}")
    if not -(2**62) <= args.seed < 2**62:  # torch's generators take 64 bits, and runs add the step and rank to it
        raise ValueError(f"--seed must be between -2**62 and 2**62, got {args.seed}")
    for name in ("lr", "loss_decay", "max_minutes"):
        value = getattr(args, name, None)
        if value is not None and not 0 < value < float("inf"):
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {value}")


def check_out(out: Path, resume: bool, data_only: bool = False) -> None:
    """A head (or a model) already in --out is replaced only by continuing its training (--resume): a new
    run wrote over it at its first checkpoint, and --out set to the target's own folder replaced its weights.
    data_only (--steps 0, which writes the data only) is refused there too: it replaced the text a --resume
    of that head trains on."""
    held = next((name for name in ("model.safetensors", "config.json", "state.pt") if (out / name).exists()), None)
    if held is None:
        return
    if data_only:
        raise ValueError(f"--steps 0 writes training data, and --out {out} holds {held} (a trained head, or a "
                         "model) whose data it would replace: write the data into another --out")
    if not resume:
        raise ValueError(f"--out {out} holds {held} already (a trained head, or a model): --resume continues the "
                         "training of a head there; else train into another --out, or remove it")
    if not (out / "state.pt").is_file():
        raise ValueError(f"--resume: {out} holds {held} but no state.pt, so there is no training to continue; "
                         "train into another --out")


def cmd_train(args) -> int:
    from specdec.train.distributed import finish_distributed, init_distributed

    check_train_args(args)
    rank, world, dist_device = init_distributed()
    ok = False
    try:
        code = _train(args, rank, world, dist_device)
        ok = True
    finally:
        finish_distributed(world, ok)
    return code


def _train(args, rank: int, world: int, dist_device) -> int:
    from specdec.model.device import pick_device
    from specdec.model.files import replaced
    from specdec.model.load import checkpoint_digest, open_checkpoint
    from specdec.model.catalogue import resolve, sha256_file
    from specdec.cli.options import out_dir
    from specdec.train.data import build_sequences, load_sequences, read_corpus, read_prompts, save_sequences
    from specdec.train.loop import Trainer
    from specdec.train.resume import check_resume
    from specdec.train.target import DenseTarget

    if args.threads:
        torch.set_num_threads(args.threads)
    device = dist_device or pick_device(args.device)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    path = resolve(args.model)
    if args.out is None:
        if args.kind != "mtp":
            raise ValueError(f"specdec train {args.kind} needs --out DIR")
        from specdec.model.checkpoint_facts import sidecar_path

        args.out = str(sidecar_path(path))
        out_dir(args.out)  # a file there, or a folder that cannot be written: said now, not after generating
    check_out(Path(args.out), args.resume, data_only=args.steps == 0)
    data_file = Path(args.out) / f"data.rank{rank}.npz"
    generating = not args.sequences and not (args.resume and data_file.is_file())
    if generating:  # the files are read and the counts checked now, not after the target has loaded
        all_prompts = read_prompts(args.prompts)
        if args.generate and len(all_prompts) < world:  # checked alike on every rank, so that all stop
            raise ValueError(f"{len(all_prompts)} prompts for {world} processes: each generates from its share of "
                             f"--prompts, so give at least {world} (or --generate 0)")
        prompts = all_prompts[rank::world]
        corpus = read_corpus(args.data)[rank::world]
        if args.steps > 0 and args.generate + args.corpus_seqs <= args.val:
            raise ValueError(f"--generate {args.generate} and --corpus-seqs {args.corpus_seqs} make "
                             f"{args.generate + args.corpus_seqs} sequences, and --val {args.val} of them are held "
                             "out: none would be left to train on (raise --generate or lower --val)")
    checkpoint, tokenizer = open_checkpoint(path)
    context = checkpoint.config.context_length
    seq_len = min(args.seq_len, context)  # a longer sequence runs past the target's RoPE tables
    if generating and seq_len // 2 + args.gen_tokens > context:
        raise ValueError(f"--gen-tokens {args.gen_tokens} after a prompt of up to --seq-len/2 = {seq_len // 2} "
                         f"tokens passes the target's context of {context}: lower one of them")
    if args.kind in ("dflash", "dspark"):  # checked against the target's shapes before anything is generated
        layer_ids, mask = block_settings(args, checkpoint.config)
    out = Path(args.out)
    log = (lambda *a: print(*a, file=sys.stderr)) if rank == 0 else (lambda *a: None)
    sequences = Path(args.sequences) if args.sequences else None
    if sequences is not None and not sequences.is_file():
        raise ValueError(f"--sequences {sequences}: no such file")
    # what a resumed run must repeat: its target (a head trained half against another model), its data, and
    # everything that shapes the head or the loss (another --ttt or --anchors changed the loss half-way)
    settings = {"target": checkpoint_digest(path), "world": world, "seq_len": seq_len,
                "val": args.val,  # --val moves sequences between the sets
                "data": f"--sequences sha256 {sha256_file(sequences)}" if sequences else "generated",
                "batch": args.batch, "lr": args.lr}
    if args.kind in ("mtp", "eagle3"):
        settings["ttt"] = args.ttt
    if args.kind == "eagle3":
        settings["draft_vocab"] = args.draft_vocab
    elif args.kind in ("dflash", "dspark"):
        settings.update(block_size=args.block_size, draft_layers=args.draft_layers, target_layers=list(layer_ids),
                        mask_token_id=mask, markov_rank=args.markov_rank if args.kind == "dspark" else 0,
                        markov_head=args.markov_head if args.kind == "dspark" else None, anchors=args.anchors,
                        loss_decay=args.loss_decay)
    resumed = check_resume(out / "state.pt", args.kind, settings) if args.resume else None
    if args.resume and resumed is None:
        log(f"--resume: {out} holds no state.pt yet: training from the start")
    elif resumed is not None and generating:  # its data file is gone: new text would be trained on silently
        raise ValueError(f"--resume: {data_file}, the text {out / 'state.pt'} was trained on, is gone: resume "
                         "with --sequences FILE of that text, or train into another --out")
    t0 = time.perf_counter()
    target = DenseTarget(checkpoint, device)
    log(f"target {args.model} on {device}: {target.config.num_layers} layers, hidden {target.config.hidden_size}")

    if not generating:
        source = sequences or data_file
        loaded = load_sequences(source, target.config.vocab_size)
        seqs = [s[:seq_len] for s in loaded if len(s) >= MIN_SEQUENCE_TOKENS]  # as generated data is cut
        if len(seqs) < len(loaded):
            log(f"data: {len(loaded) - len(seqs)} sequences of fewer than {MIN_SEQUENCE_TOKENS} tokens left out")
        if args.sequences and world > 1:
            seqs = seqs[: args.val] + seqs[args.val :][rank::world] if rank == 0 else seqs[args.val :][rank::world]
        log(f"data: {len(seqs)} sequences from {source}")
    else:
        from tqdm import tqdm

        n_gen = args.generate // world
        if args.steps > 0 and 0 < args.generate <= args.val:
            log(f"data: all {args.generate} generated sequences are held out for validation (--val {args.val}): "
                "the head trains on the corpus alone, not on text the target wrote (raise --generate)")
        bar = tqdm(total=n_gen, desc="generate", unit="seq", file=sys.stderr, disable=rank != 0)
        seqs = build_sequences(target, tokenizer, prompts, corpus, n_gen, args.gen_tokens, seq_len,
                               args.corpus_seqs // world, args.seed + rank, progress=bar.update,
                               held_out=args.val if rank == 0 else 0)
        bar.close()
        seqs = [s for s in seqs if len(s) >= MIN_SEQUENCE_TOKENS]
        out.mkdir(parents=True, exist_ok=True)
        with replaced(data_file) as tmp:
            save_sequences(seqs, tmp)
        log(f"data: {len(seqs)} sequences, {sum(map(len, seqs))} tokens ({time.perf_counter() - t0:.0f}s)")
    val = seqs[: args.val] if rank == 0 else []
    train = seqs[args.val:] if rank == 0 else seqs
    if args.steps > 0 and not train:
        raise ValueError(f"{len(seqs)} training sequences and --val {args.val} held out: none left to train on "
                         "(lower --val or generate more)")
    info = target_info(args.name or args.model, path, checkpoint)
    loss_module = None  # the TTT loss of MTP / EAGLE-3 heads
    if args.kind == "mtp":
        from specdec.drafters.mtp import save_mtp_head

        head = build_mtp_head(target, 1, args.seed).to(device)
        draft_ids = None

        def save(h, folder):
            save_mtp_head(h, folder, info)
    elif args.kind in ("dflash", "dspark"):
        from specdec.drafters.dflash import save_block_drafter
        from specdec.train.block_loss import BlockLoss

        head = build_block_model(target, args.kind, args.block_size, args.draft_layers, layer_ids, mask,
                                 args.markov_rank, args.markov_head, args.seed).to(device)
        draft_ids = None
        spark = args.kind == "dspark"
        loss_module = BlockLoss(head, target, args.anchors, args.loss_decay, 0.1 if spark else 1.0,
                                0.9 if spark else 0.0, 1.0, args.seed + rank)

        def save(h, folder):
            extra = dict(embed_tokens=target.embed, lm_head=target.lm_head) if spark else {}
            save_block_drafter(h, folder, info, **extra)
    else:
        from specdec.drafters.eagle3 import save_eagle3_head

        draft_ids = frequent_tokens(seqs, args.draft_vocab, target.config.vocab_size, device, world)
        head = build_eagle3_head(target, draft_ids, args.seed).to(device)
        draft_ids = draft_ids.to(device)

        def save(h, folder):
            save_eagle3_head(h, folder, info)
    trainer = Trainer(head, args.kind, target, out, save, args.steps, args.batch, args.lr, args.ttt, draft_ids,
                      args.save_every, log, rank, world, loss=loss_module, settings=settings)
    if resumed is not None and trainer.resume(resumed):
        if draft_ids is not None and not torch.equal(head.draft_to_target(), draft_ids):
            raise ValueError(f"--resume: the draft vocabulary of {out / 'state.pt'} is not the one its data gives "
                             "now (the data changed): train into another --out")
        log(f"resumed at step {trainer.step}")
    resumed = None  # the state's tensors are the head's and the optimizer's now
    start = trainer.step
    accs = trainer.run(train, val, device, args.seed, args.max_minutes * 60 if args.max_minutes else None)
    if rank == 0 and trainer.step == start and (out / "train_summary.json").is_file():
        log(f"nothing trained: the head is at step {start} already (--steps {args.steps}); "
            "train_summary.json is kept")  # a resume past --steps overwrote it with empty numbers
    elif rank == 0:
        from specdec.train.loop import mean_accept_length

        summary = {"kind": args.kind, "model": args.model, "steps": trainer.step, "sequences": len(seqs),
                   "val_top1_per_step": [round(a, 4) for a in accs],
                   "val_mean_accept_length": round(mean_accept_length(accs), 3) if accs else None,
                   "seconds": round(time.perf_counter() - t0, 1), "device": device,
                   "command": "specdec train " + shlex.join(_command_args(args))}
        (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        log(json.dumps(summary))
    return 0


def _command_args(args) -> list[str]:
    """The arguments after `specdec train` that asked for this run (main's argv, else the command line)."""
    if getattr(args, "argv", None) is not None:
        return args.argv
    return sys.argv[2:] if sys.argv[1:2] == ["train"] else sys.argv[1:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="specdec train")
    add_arguments(p)
    args = p.parse_args(argv)
    args.argv = None if argv is None else list(argv)
    return cmd_train(args)

