"""One `specdec train` run: the target, the training text, a fresh (or resumed) head, the loop, the summary.

run_training takes the flags cli/train.py defines (argparse's namespace) and refuses what they get wrong
before the target loads and before any text is generated.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.drafters.block.io import save_block_drafter
from specdec.drafters.eagle3 import check_eagle3_folder, save_eagle3_head
from specdec.drafters.eagle_formats import Eagle3Error
from specdec.drafters.mtp import save_mtp_head
from specdec.model.catalogue import resolve, specdec_home
from specdec.model.checkpoint_facts import sidecar_path
from specdec.model.device import pick_device
from specdec.model.files import out_dir, replaced
from specdec.model.load import checkpoint_digest, load_model, open_checkpoint
from specdec.train.block_loss import BlockLoss
from specdec.train.data import (GEN_TEMPERATURE, answer_marker, answer_start, build_sequences, load_sequences,
                                read_corpus, read_prompts, save_sequences)
from specdec.train.engine_gen import EngineGenerator
from specdec.train.features import FeatureCache
from specdec.train.heads import (block_settings, build_block_model, build_eagle3_head, build_mtp_head,
                                 continued_eagle3_head, frequent_tokens, target_info)
from specdec.train.loop import Trainer
from specdec.train.resume import check_out, resume_settings, resumed_state
from specdec.train.summary import write_summary
from specdec.train.target import DenseTarget

MIN_SEQUENCE_TOKENS = 8  # a shorter training sequence (generated or read) is too short to teach anything
DEFAULT_TTT = {"eagle3": 7, "mtp": 3}  # EAGLE-3: SpecForge's 7 training-time-test steps


def run_training(args, rank: int, world: int, dist_device) -> int:
    """Train args.kind's head for args.model into args.out as process `rank` of `world` (torchrun; dist_device:
    its GPU, else None)."""
    device = _pick_device(args, dist_device)
    if getattr(args, "ttt", None) is None:
        args.ttt = DEFAULT_TTT.get(args.kind, 3)
    path = resolve(args.model)
    _default_out(args, path)
    check_out(Path(args.out), args.resume, data_only=args.steps == 0)
    data_file = Path(args.out) / f"data.rank{rank}.npz"
    generating = not args.sequences and not (args.resume and data_file.is_file())
    prompts = corpus = None
    if generating:  # the files are read and the counts checked now, not after the target has loaded
        prompts, corpus = _read_texts(args, rank, world)
    checkpoint, tokenizer = open_checkpoint(path)
    if args.init_from:  # checked now, not after hours of generating text
        try:
            check_eagle3_folder(args.init_from, checkpoint.config, args.name or args.model)
        except Eagle3Error as exc:
            raise ValueError(f"--init-from: {exc}") from None
    seq_len = _sequence_length(args, checkpoint.config.context_length, generating)
    layer_ids = mask = None
    if args.kind in ("dflash", "dspark"):  # checked against the target's shapes before anything is generated
        layer_ids, mask = block_settings(args, checkpoint.config)
    out = Path(args.out)
    log = (lambda *a: print(*a, file=sys.stderr)) if rank == 0 else (lambda *a: None)
    sequences = Path(args.sequences) if args.sequences else None
    if sequences is not None and not sequences.is_file():
        raise ValueError(f"--sequences {sequences}: no such file")
    settings = resume_settings(args, path, world, seq_len, sequences, layer_ids, mask)
    resumed = resumed_state(args, out, settings, data_file, generating, log)
    t0 = time.perf_counter()
    target = DenseTarget(checkpoint, device)
    log(f"target {args.model} on {device}: {target.config.num_layers} layers, hidden {target.config.hidden_size}")

    if not generating:
        seqs = _read_sequences(args, target, sequences or data_file, seq_len, rank, world, log)
    else:
        seqs = _generate_sequences(args, target, tokenizer, prompts, corpus, seq_len, out, data_file, rank, world,
                                   log, t0)
    val = seqs[: args.val] if rank == 0 else []
    train = seqs[args.val:] if rank == 0 else seqs
    if args.steps > 0 and not train:
        raise ValueError(f"{len(seqs)} training sequences and --val {args.val} held out: none left to train on "
                         "(lower --val or generate more)")
    info = target_info(args.name or args.model, path, checkpoint)
    # what the losses read from the target: kept per sequence after its first epoch (train/features.py)
    outputs = FeatureCache(target, int(args.feature_cache * 2**30)) if args.feature_cache > 0 else target
    marker = answer_marker(tokenizer)  # what comes before each answer: the losses score the answers only
    head, draft_ids, loss_module, save = _new_head(args, target, outputs, seqs, info, device, rank, world, layer_ids,
                                                   mask, marker)
    trainer = Trainer(head, args.kind, outputs, out, save, args.steps, args.batch, args.lr, args.ttt, draft_ids,
                      args.save_every, log, rank, world, loss=loss_module, settings=settings, marker=marker)
    if resumed is not None and trainer.resume(resumed):
        if draft_ids is not None and not torch.equal(head.draft_to_target(), draft_ids):
            raise ValueError(f"--resume: the draft vocabulary of {out / 'state.pt'} is not the one its data gives "
                             "now (the data changed): train into another --out")
        log(f"resumed at step {trainer.step}")
    resumed = None  # the state's tensors are the head's and the optimizer's now
    start = trainer.step
    accs = trainer.run(train, val, device, args.seed, args.max_minutes * 60 if args.max_minutes else None)
    write_summary(args, out, trainer.step, start, accs, len(seqs), t0, device, rank, log, trainer)
    return 0


def _pick_device(args, dist_device) -> str:
    """--threads applied; the device: torchrun's GPU for this rank, else --device (default cuda when available)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    device = dist_device or pick_device(args.device)
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    return device


def _default_out(args, path) -> None:
    """An MTP head goes beside the model by default (where auto finds it); the other kinds into
    $SPECDEC_HOME/train/<model file's name>/<kind>, where `--resume` finds them again."""
    if args.out is None:
        args.out = str(sidecar_path(path) if args.kind == "mtp" else specdec_home() / "train" / Path(path).name /
                       args.kind)
        out_dir(args.out)  # a file there, or a folder that cannot be written: said now, not after generating


def _read_texts(args, rank: int, world: int) -> tuple[list[str], list[str]]:
    """This rank's share of the prompts and of the corpus, the counts checked against --generate and --val."""
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
    return prompts, corpus


def _sequence_length(args, context: int, generating: bool) -> int:
    """--seq-len, at most the target's context; a prompt and its generated tokens must fit that context."""
    seq_len = min(args.seq_len, context)  # a longer sequence runs past the target's RoPE tables
    if generating and seq_len // 2 + args.gen_tokens > context:
        raise ValueError(f"--gen-tokens {args.gen_tokens} after a prompt of up to --seq-len/2 = {seq_len // 2} "
                         f"tokens passes the target's context of {context}: lower one of them")
    return seq_len


def _read_sequences(args, target, source: Path, seq_len: int, rank: int, world: int, log) -> list[list[int]]:
    """Training sequences from --sequences or the data file of the run a --resume continues, cut to seq_len;
    with --sequences under torchrun, this rank's share (rank 0 keeps the first --val for validation)."""
    loaded = load_sequences(source, target.config.vocab_size)
    seqs = [s[:seq_len] for s in loaded if len(s) >= MIN_SEQUENCE_TOKENS]  # as generated data is cut
    if len(seqs) < len(loaded):
        log(f"data: {len(loaded) - len(seqs)} sequences of fewer than {MIN_SEQUENCE_TOKENS} tokens left out")
    if args.sequences and world > 1:
        seqs = seqs[: args.val] + seqs[args.val :][rank::world] if rank == 0 else seqs[args.val :][rank::world]
    log(f"data: {len(seqs)} sequences from {source}")
    return seqs


def _generate_sequences(args, target, tokenizer, prompts, corpus, seq_len: int, out: Path, data_file: Path,
                        rank: int, world: int, log, t0: float) -> list[list[int]]:
    """This rank's sequences: the target continues its prompts, corpus chunks are added; saved in data_file."""
    n_gen = args.generate // world
    if args.steps > 0 and 0 < args.generate <= args.val:
        log(f"data: all {args.generate} generated sequences are held out for validation (--val {args.val}): "
            "the head trains on the corpus alone, not on text the target wrote (raise --generate)")
    writer = _writer(args, target, seq_len, log)
    batch = args.gen_slots * 8 if isinstance(writer, EngineGenerator) else 512
    # what generation has written so far, kept after each batch, so that a --resume of a run stopped while
    # generating goes on from there (the key: everything the text depends on; another key starts afresh)
    partial = data_file.with_name(f"data.rank{rank}.partial.npz")
    temperature = args.gen_temperature
    keyed = [prompts, corpus, n_gen, args.gen_tokens, seq_len, args.corpus_seqs, args.seed, args.val, rank, world,
             type(writer).__name__, batch, checkpoint_digest(resolve(args.model))]
    if temperature != GEN_TEMPERATURE:  # (another temperature: another text; the default keeps the key runs had before)
        keyed.append(temperature)
    key = hashlib.sha256(json.dumps(keyed).encode()).hexdigest()
    done = _partial_data(partial, key, target.config.vocab_size, log) if args.resume else []
    out.mkdir(parents=True, exist_ok=True)

    def keep(so_far):
        with replaced(partial) as tmp:
            save_sequences(so_far, tmp)
        partial.with_suffix(".json").write_text(json.dumps({"key": key, "sequences": len(so_far)}) + "\n")

    bar = tqdm(total=n_gen, desc="generate", unit="seq", file=sys.stderr, disable=rank != 0)
    seqs = build_sequences(writer, tokenizer, prompts, corpus, n_gen, args.gen_tokens, seq_len,
                           args.corpus_seqs // world, args.seed + rank, progress=bar.update,
                           held_out=args.val if rank == 0 else 0, batch=batch, temperature=temperature, done=done,
                           on_chunk=keep)
    bar.close()
    seqs = [s for s in seqs if len(s) >= MIN_SEQUENCE_TOKENS]
    with replaced(data_file) as tmp:
        save_sequences(seqs, tmp)
    partial.unlink(missing_ok=True)
    partial.with_suffix(".json").unlink(missing_ok=True)
    speed = f", generated at {writer.tokens_per_second():.1f} tokens/s" if isinstance(writer, EngineGenerator) else ""
    log(f"data: {len(seqs)} sequences, {sum(map(len, seqs))} tokens ({time.perf_counter() - t0:.0f}s{speed})")
    return seqs


def _partial_data(partial: Path, key: str, vocab: int, log) -> list[list[int]]:
    """The sequences an interrupted generation kept in `partial` under `key`; [] for none or another key."""
    try:
        saved = json.loads(partial.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(saved, dict) or saved.get("key") != key or not partial.is_file():
        log(f"data: {partial} was generated with other settings: generating afresh")
        return []
    done = load_sequences(partial, vocab)
    log(f"data: going on after the {len(done)} sequences generated before ({partial})")
    return done


def _writer(args, target, seq_len: int, log):
    """What writes the answers: specdec's engine on the model as it runs at inference (--gen-engine specdec,
    the default on a CPU: a GGUF file's own blocks, --gen-slots sequences a step), or the float training
    copy of the target (--gen-engine dense, the default on a GPU, where it runs as big padded batches)."""
    how = getattr(args, "gen_engine", None) or ("dense" if str(target.device).startswith("cuda") else "specdec")
    if how == "dense":
        return target
    model = load_model(str(resolve(args.model)), progress=False)
    log(f"generating with specdec's engine ({model.info.weights_dtype}, {args.gen_slots} sequences a step)")
    return EngineGenerator(model, args.gen_slots, seq_len // 2 + args.gen_tokens + 8)


def _new_head(args, target, outputs, seqs, info: dict, device, rank: int, world: int, layer_ids, mask,
              marker: tuple[int, ...]):
    """A fresh head of args.kind on the target: (head, its draft vocabulary or None, its loss module or None
    (the Trainer's TTT loss), save(head, folder) writing it in its published format). outputs: where the
    losses read the target's outputs (the target, or its FeatureCache)."""
    loss_module = None  # the TTT loss of MTP / EAGLE-3 heads
    if args.kind == "mtp":
        head = build_mtp_head(target, 1, args.seed).to(device)
        draft_ids = None

        def save(h, folder):
            save_mtp_head(h, folder, info)
    elif args.kind in ("dflash", "dspark"):
        head = build_block_model(target, args.kind, args.block_size, args.draft_layers, layer_ids, mask,
                                 args.markov_rank, args.markov_head, args.seed).to(device)
        draft_ids = None
        spark = args.kind == "dspark"
        loss_module = BlockLoss(head, outputs, args.anchors, args.loss_decay, 0.1 if spark else 1.0,
                                0.9 if spark else 0.0, 1.0, args.seed + rank)

        def save(h, folder):
            extra = dict(embed_tokens=target.embed, lm_head=target.lm_head) if spark else {}
            save_block_drafter(h, folder, info, **extra)
    else:
        if args.init_from:  # a trained head goes on learning: its draft vocabulary and weights
            head, draft_ids = continued_eagle3_head(args.init_from, target, args.name or args.model, args.seed)
        else:
            answers = [s[answer_start(s, marker):] for s in seqs]  # the tokens a draft proposes
            draft_ids = frequent_tokens(answers, args.draft_vocab, target.config.vocab_size, device, world)
            head = build_eagle3_head(target, draft_ids, args.seed)
        head = head.to(device)
        draft_ids = draft_ids.to(device)

        def save(h, folder):
            save_eagle3_head(h, folder, info)
    return head, draft_ids, loss_module, save
