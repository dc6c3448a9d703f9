"""`specdec generate` (one prompt) and `specdec chat` (a conversation), streaming the answer."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from specdec.cli.grammar_args import add_grammar_args, grammar_from_args
from specdec.cli.options import (UNLIMITED, add_model_args, add_sampling_args, add_spec_args, add_threads_args,
                                 build_engine, check_max_tokens, token_limit)
from specdec.completion import cut_by
from specdec.engine.prefix_cache import PREFIX_CACHE_MODES, PrefixCache
from specdec.model.errors import SpecdecError
from specdec.model.text_stream import TextStream

def read_prompt(args) -> str:
    """The prompt of `generate`: the argument, else --file, else stdin. Text read from a file or stdin
    loses one trailing line end, LF or CRLF (llama.cpp's --file drops an LF), so `echo P | specdec generate` is
    `specdec generate P`."""
    if args.prompt is not None and args.file is not None:
        raise ValueError("give the prompt as an argument or with --file, not both")
    if args.prompt is not None:
        return args.prompt
    if args.file is not None:
        try:
            with open(args.file, encoding="utf-8", errors="surrogateescape", newline="") as f:
                text = f.read()  # bytes that are not UTF-8 are refused later with the character named
        except OSError as e:
            raise ValueError(f"cannot read the prompt file {args.file}: {e.strerror or e}") from None
    else:
        text = sys.stdin.read()
    return text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text


def cmd_generate(args) -> int:
    if args.compact and not args.json:
        raise ValueError("--compact prints --json's object on one line; add --json")
    prompt = read_prompt(args)
    if not prompt:  # said before the model loads
        raise ValueError("the prompt is empty: give it as an argument, with --file or on stdin")
    check_max_tokens(args.max_tokens)
    engine, sampling = build_engine(args)
    sampling = replace(sampling, grammar=grammar_from_args(args, engine.model))  # --json-schema, --grammar
    max_tokens = token_limit(args.max_tokens, engine)
    tok = engine.model.tokenizer
    if args.chat:
        prompt_ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": prompt}]), add_bos=False)
    else:
        prompt_ids = tok.encode(prompt)
    if args.json:
        result = engine.generate(prompt_ids, sampling, max_tokens, args.stop)
        print(json.dumps(result_json(engine, result), indent=None if args.compact else 2))
        note_cut(engine, result, max_tokens)
        return 0
    result = print_answer(engine, prompt_ids, sampling, max_tokens, args.stop)
    print(timing_line(result), file=sys.stderr)
    print(result.stats.summary(), file=sys.stderr)
    return 0


def print_answer(engine, prompt_ids, sampling, max_tokens: int, stop, interruptible: bool = False):
    """Generate, writing the answer to stdout as it is committed: never a stop string or what follows it
    (the last characters that could start one wait for the next step). Returns the GenerationResult.
    interruptible: Ctrl-C ends the answer where it is (finish_reason "interrupted") instead of the program;
    None when it came in the prefill, before the answer began."""
    stream = TextStream(engine.model.tokenizer, tuple(stop or ()), engine.skip_special)
    req = None
    interrupted = False
    try:
        req = engine.start(prompt_ids, sampling, max_tokens, stop)  # the prefill, which Ctrl-C may cut too
        while not req.finished:
            engine.step(req)
            if not req.finished:  # a finishing step's text may hold the stop string: finish() cuts it
                sys.stdout.write(stream.advance(req.output))
                sys.stdout.flush()
    except KeyboardInterrupt:
        if not interruptible:
            raise
        interrupted = True
    finally:
        if req is not None:
            engine.finish(req)
    if req is None:  # interrupted in the prefill: no answer began (start gave its slot back)
        return None
    result = engine.result(req)
    if interrupted:
        result.finish_reason = "interrupted"
    sys.stdout.write(stream.finish(result.text) + "\n")
    sys.stdout.flush()
    note_cut(engine, result, max_tokens)
    return result


def note_cut(engine, result, max_tokens: int) -> None:
    """Say on stderr which limit cut an answer, -n or the context (with --json too: finish_reason "length"
    alone does not tell them apart). max_tokens: the engine's limit (token_limit's)."""
    limit = cut_by(result, max_tokens)
    if limit == "context":
        print(f"note: the answer stopped at the end of the {engine.cache.max_len}-token context (--ctx-size)",
              file=sys.stderr)
    elif limit == "max_tokens":
        print(f"note: the answer was cut at {max_tokens} tokens (--max-tokens); -n {UNLIMITED} lets the model end it",
              file=sys.stderr)


def timing_line(result) -> str:
    return (f"prompt {result.prompt_tokens} tokens, prefill {result.prefill_s:.2f}s; generated "
            f"{result.completion_tokens} tokens, decode {result.decode_s:.2f}s "
            f"({result.decode_tokens_per_s:.1f} tok/s)")


def result_json(engine, result) -> dict:
    return {
        "text": result.text,
        "token_ids": result.token_ids,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,  # the EOS that ended it included, as usage counts
        "model": engine.model.info.to_dict(),
        "timing": {"prefill_s": result.prefill_s, "decode_s": result.decode_s,
                   "decode_tokens_per_s": result.decode_tokens_per_s},
        "spec": result.stats.to_dict(),
    }


def cmd_chat(args) -> int:
    check_max_tokens(args.max_tokens)
    engine, sampling = build_engine(args)
    # each turn's prompt is the last one, its answer and the new line: the prefix cache prefills only those
    engine.prefix = PrefixCache(args.prefix_cache or ("on" if engine.cache.holds_prefixes else "off"), engine.cache)
    max_tokens = token_limit(args.max_tokens, engine)  # -n -1 (the default): until the end of the turn
    tok = engine.model.tokenizer
    if not tok.chat_template:
        raise ValueError(f"{engine.model.info.name} has no chat template, so chat cannot lay out a conversation; "
                         "give it plain text with `specdec generate`")
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = []  # user and assistant turns, oldest first
    context = engine.cache.max_len
    print("specdec chat: empty line or Ctrl-D to quit", file=sys.stderr)
    while True:
        try:
            line = input("> ")
        except EOFError:
            break
        if not line.strip():
            break
        turn = {"role": "user", "content": line}
        try:
            ids, dropped = fit_conversation(tok, system, history, turn, context, max_tokens)
        except ValueError as exc:  # text that is not UTF-8, a template that refuses it, a line longer than the
            print(f"specdec: error: {exc}; the line was not sent", file=sys.stderr)  # context: this line only
            continue
        if dropped:
            del history[:dropped]
            print(f"note: the conversation outgrew the {context}-token context (--ctx-size): its oldest {dropped} "
                  "turn(s) were dropped", file=sys.stderr)
        try:
            result = print_answer(engine, ids, sampling, max_tokens, args.stop, interruptible=True)
        except (SpecdecError, ValueError) as exc:  # this turn failed (e.g. a float16 cache overflow): it is
            print(f"\nspecdec: error: {exc}; the line was not answered", file=sys.stderr)  # dropped, chat goes on
            continue
        if result is None:
            print("\n(interrupted before the answer began; the line was not answered)", file=sys.stderr)
            continue
        if result.finish_reason == "interrupted":
            print("(interrupted)", file=sys.stderr)
        print(result.stats.summary(), file=sys.stderr)
        history += [turn, {"role": "assistant", "content": result.text}]
    return 0


def fit_conversation(tok, system: list[dict], history: list[dict], turn: dict, context: int,
                     max_tokens: int) -> tuple[list[int], int]:
    """The prompt ids of system + history + turn, dropping the oldest history turns (whole exchanges) while
    the prompt leaves no room for max_tokens of answer (at most half the context), and how many turns were
    dropped. ValueError when even system + turn leave no room for one token."""
    dropped = 0
    room = min(max_tokens, context // 2)  # an -n as long as the context must not cost every earlier turn
    while True:
        ids = tok.encode(tok.apply_chat_template(system + history[dropped:] + [turn]), add_bos=False)
        if len(ids) + room <= context or dropped >= len(history):
            break
        dropped += 2  # a user turn and its answer
    if len(ids) + 1 > context:
        raise ValueError(f"this message needs {len(ids)} tokens with the chat template; the context holds "
                         f"{context} (--ctx-size)")
    return ids, min(dropped, len(history))


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt")
    add_model_args(p)
    add_threads_args(p)
    add_spec_args(p)
    add_sampling_args(p)
    add_grammar_args(p)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object with text, ids, model, timing, spec")
    p.add_argument("--compact", action="store_true", help="with --json: one line")
    p.add_argument("-f", "--file", default=None, help="read the prompt from this file (one trailing newline dropped)")
    p.add_argument("prompt", nargs="?", default=None,
                   help="the prompt (default: --file, else stdin; one trailing newline dropped from either)")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("chat", help="interactive chat, streaming")
    add_model_args(p)
    add_threads_args(p)
    add_spec_args(p)
    add_sampling_args(p, max_tokens=UNLIMITED)  # an answer ends where the model ends its turn, as llama-cli's
    p.add_argument("--system", default=None, help="system message")
    p.add_argument("--prefix-cache", choices=PREFIX_CACHE_MODES, default=None,
                   help="each turn reuses the conversation's KV rows and prefills only the new ones: on (default, "
                        "where the model allows), exact (each answer bitwise the cold one), off (docs/server.md)")
    p.set_defaults(func=cmd_chat)
