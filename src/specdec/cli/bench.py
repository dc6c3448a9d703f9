"""specdec bench: the plain baseline, each method and the peers on the same prompts, in one process.

    specdec bench --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b \\
        --methods none,ngram-simple,suffix,draft-simple,auto --prompts mixed \\
        --temperature 0,0.7 --max-tokens 128 --repeats 3 --draft-lengths 1,2,3,5 \\
        --peers hf-plain,hf-prompt-lookup --out bench-out

Writes results.json, report.md and PNG plots to --out. The bench itself is bench/method_bench.py;
this module holds its flags and their checks.

Server-load mode (bench/load.py): an OpenAI-compatible server under 1, 4, 16 concurrent streaming
clients; without --url the bench starts `specdec serve` (same --model/--weights/--spec-type) itself.

    specdec bench --concurrency 1,4,16 --requests 16 --max-tokens 32 --spec-type ngram-simple
    specdec bench --concurrency 1,8 --url http://127.0.0.1:8080/v1 --peer-model my-model
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from specdec.bench.method_bench import DEFAULT_METHODS, bench
from specdec.bench.methods import parse_methods
from specdec.bench.peers import HF_PEERS, optional_module
from specdec.bench.prompts import load_prompts
from specdec.bench.provenance import artifact_of, client_runtime
from specdec.bench.report import load_table, write_load
from specdec.bench.results_file import check_load_joins
from specdec.cli.bench_sessions import add_session_args, check_not_sessions, cmd_sessions
from specdec.cli.grammar_args import FLAGS as GRAMMAR_FLAGS
from specdec.cli.grammar_args import add_grammar_args, grammar_from_args
from specdec.cli.options import add_model_args, add_threads_args
from specdec.drafters.registry import DEFAULT_DRAFT_LENGTH
from specdec.engine.config import MAX_DRAFT_LENGTH
from specdec.model.device import pick_device
from specdec.model.files import out_dir
from specdec.model.load import load_model
from specdec.model.threads import check_threads, set_threads
from specdec.sampling import SamplingParams


def _floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected a comma list of numbers, got {text!r}") from None


def temperatures(text: str) -> list[float]:
    """--temperature's comma list: one or more distinct temperatures a request can take."""
    temps = _floats(text)
    if not temps:
        raise ValueError(f"--temperature names no temperature: {text!r}")
    for t in temps:
        try:
            SamplingParams(temperature=t)
        except ValueError as exc:
            raise ValueError(f"--temperature: {exc}") from None
    if len(set(temps)) < len(temps):
        raise ValueError(f"--temperature lists a temperature twice: {text!r}")
    return temps


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected a comma list of integers, got {text!r}") from None


LOAD_DEFAULTS = {"requests": 32, "endpoint": "completions", "request_timeout": 300.0, "level_timeout": 1800.0,
                 "server_start_timeout": 600.0}
LOAD_ONLY = ("url", "spec_type", *LOAD_DEFAULTS)  # the flags of the server-load mode alone
# the method bench's own flags, with their defaults: the server-load mode refuses them set otherwise
METHOD_ONLY = {"methods": DEFAULT_METHODS, "repeats": 3, "draft_lengths": None, "peers": None, "peer_url": [],
               "hf_dtype": "bf16", "keep_drafter_memory": False}


def cmd_load(args) -> int:
    """`specdec bench --concurrency ...`: the server-load mode."""
    optional_module("httpx", "the server-load mode (--concurrency)")
    # these import httpx, an optional dependency: imported once it is known to be there
    from specdec.bench.load import LoadSettings, base_url, choose_model, run_load
    from specdec.bench.local_server import LocalServer

    given = ["--" + name.replace("_", "-") for name, default in METHOD_ONLY.items() if getattr(args, name) != default]
    if given:
        raise ValueError(f"{', '.join(given)} set the method bench; the server-load mode (--concurrency) measures the "
                         "server's own speculation (--spec-type) and would ignore them")
    for name, default in LOAD_DEFAULTS.items():  # None: not given (the method bench refuses them given)
        if getattr(args, name) is None:
            setattr(args, name, default)
    temps = temperatures(args.temperature)
    if len(temps) != 1:
        raise ValueError(f"--concurrency takes one --temperature, got {args.temperature!r}")
    if not 0 < args.server_start_timeout < float("inf"):
        raise ValueError(f"--server-start-timeout must be a positive number of seconds, got "
                         f"{args.server_start_timeout}")
    prompts = load_prompts(args.prompts, args.per_category)
    out_dir(args.out)
    settings = LoadSettings(url=args.url or "http://127.0.0.1", levels=tuple(_ints(args.concurrency)),
                            requests=args.requests, max_tokens=args.max_tokens, temperature=temps[0],
                            endpoint=args.endpoint, request_timeout_s=args.request_timeout,
                            level_timeout_s=args.level_timeout, seed=args.seed, api_key=args.api_key,
                            warmup=not args.no_warmup)
    progress = not args.no_progress
    if args.url:
        base_url(args.url)  # a malformed URL is a one-line error before anything runs
        if args.spec_type or args.draft_model:
            print("load: --spec-type and -md only configure the server the bench starts; ignored with --url",
                  file=sys.stderr)
        model, note = choose_model(settings, args.peer_model, args.model)
        if note and progress:
            print(f"load: {note}", file=sys.stderr)
        section = run_load(replace(settings, model=model), prompts, progress)
    else:
        served = artifact_of(args.model)
        check_load_joins(args.out, served)
        serve_args = ["--model", args.model, "--spec-draft-n-max", str(args.spec_draft_n_max)]
        serve_args += ["--ctx-size", str(args.ctx_size)] if args.ctx_size is not None else []
        serve_args += ["--weights", args.weights] if args.weights else []
        serve_args += ["--device", args.device] if args.device else []
        serve_args += ["--cache-type", args.cache_type] if args.cache_type else []
        serve_args += ["--spec-type", args.spec_type] if args.spec_type else []
        serve_args += ["-md", args.draft_model] if args.draft_model else []
        serve_args += ["--threads", str(args.threads)] if args.threads else []
        server = LocalServer(serve_args, Path(args.out) / "server.log", args.server_start_timeout)
        if progress:
            print(f"load: starting specdec serve {' '.join(serve_args)} (log: {server.log_path})", file=sys.stderr)
        with server:
            info = {"started_by_bench": True, "command_line": shlex.join(server.command),
                    "log": str(server.log_path), "weights": args.weights or "the model's default",
                    "spec_type": args.spec_type or "auto (the server decides)", **served,
                    "threads": args.threads or "torch default"}
            section = run_load(replace(settings, url=server.url, model=args.model), prompts, progress,
                               server=info)
    files = write_load(section, args.out, client_runtime())
    print("\n".join(load_table(section)))
    print(f"wrote {files['markdown']}", file=sys.stderr)
    if not any(row["completed"] for row in section["levels"]):
        first = next((m for row in section["levels"] for m in row["error_examples"].values()), "no request sent")
        print(f"specdec: error: no request completed ({first})", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args) -> int:
    check_threads(args.threads)
    if args.sessions is not None:
        return cmd_sessions(args)
    check_not_sessions(args)
    if args.max_tokens is None:  # --sessions' default is the session file's
        args.max_tokens = 128
    grammar_flags = ["--" + n.replace("_", "-") for n in GRAMMAR_FLAGS if getattr(args, n) is not None]
    if grammar_flags and (args.concurrency is not None or args.peers):
        raise ValueError(f"{grammar_flags[0]} constrains the method bench's specdec and --peer-url requests, not "
                         "the server-load mode nor the Hugging Face --peers")
    if args.concurrency is not None:  # "" too: it names no level (an error), not "no load test"
        return cmd_load(args)
    # check the settings before spending a minute loading the model
    given = ["--" + name.replace("_", "-") for name in LOAD_ONLY if getattr(args, name) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} set the server-load mode (--concurrency); the method bench measures "
                         "--methods (e.g. --methods none,ngram-simple) and would ignore them")
    if args.repeats < 1:
        raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
    temperatures(args.temperature)
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.draft_lengths:
        lengths = _ints(args.draft_lengths)
        if not lengths or len(set(lengths)) < len(lengths) or not all(1 <= n <= MAX_DRAFT_LENGTH for n in lengths):
            raise ValueError(f"--draft-lengths takes distinct lengths from 1 to {MAX_DRAFT_LENGTH}, got "
                             f"{args.draft_lengths!r}")
    load_prompts(args.prompts, args.per_category)
    out_dir(args.out)
    names = [m.strip() for m in args.methods.split(",")]
    peers = [p.strip() for p in args.peers.split(",") if p.strip()] if args.peers else []
    fixed = parse_methods(",".join(m for m in names if m != "auto"), args.draft_model, args.spec_draft_n_max)
    unused = [flag for flag, used in (
        ("--draft-model", args.draft_model is None or "auto" in names or "hf-assisted" in peers
         or any(m.spec.draft_model for m in fixed)),
        ("--peer-model", args.peer_model is None or args.peer_url),
        ("--hf-dtype", args.hf_dtype == METHOD_ONLY["hf_dtype"] or peers)) if not used]
    if unused:
        raise ValueError(f"{', '.join(unused)} would not be used: --draft-model serves draft-simple, auto and "
                         "hf-assisted, --peer-model the --peer-url servers, --hf-dtype the --peers")
    if peers:
        unknown = [p for p in peers if p not in HF_PEERS]
        if unknown or len(set(peers)) < len(peers):
            raise ValueError(f"--peers {args.peers!r}: choose each at most once from {', '.join(HF_PEERS)}")
        optional_module("transformers", "--peers")
    if args.peer_url:
        optional_module("httpx", "--peer-url")
        from specdec.bench.load import base_url  # imports httpx, an optional dependency

        bases = [base_url(url, "--peer-url") for url in args.peer_url]  # a malformed one: an error line now
        if len(set(bases)) < len(bases):
            raise ValueError(f"--peer-url names {next(b for b in bases if bases.count(b) > 1)} twice")
    set_threads(args.threads)
    model = load_model(args.model, args.weights, device=pick_device(args.device), cache_type=args.cache_type)
    results = bench(
        model, args.prompts, args.methods, args.draft_model, temperatures(args.temperature), args.max_tokens,
        args.repeats, args.spec_draft_n_max, _ints(args.draft_lengths) if args.draft_lengths else None,
        args.ctx_size, not args.no_warmup, args.seed, args.per_category, not args.keep_drafter_memory, peers,
        args.peer_url, args.peer_model, args.hf_dtype, not args.no_progress, args.out, api_key=args.api_key,
        grammar=grammar_from_args(args, model))
    a = results.get("auto")
    if a:
        print(f"auto chose {'+'.join(a['types']) or 'none'}; no slower than plain in every category: "
              f"{a['no_slower_than_plain']}", file=sys.stderr)
    for row in results["summary"]:
        if row["category"] == "all":
            spd = row["speedup_median"]
            print(f"{row['config']:32} T={row['temperature']:<4g} engaged {row['engaged']:7} "
                  f"{(row['decode_tokens_per_s_median'] or 0):7.1f} tok/s  speed-up "
                  f"{'–' if spd is None else f'{spd:.2f}x'}", file=sys.stderr)
    print(f"wrote {results['files']['markdown']}", file=sys.stderr)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="measure plain vs speculative decoding (and peers) on shipped prompt sets")
    add_model_args(p)
    add_threads_args(p)
    p.add_argument("--draft-model", "-md", "--model-draft", dest="draft_model", default=None,
                   help="draft model for draft-simple and hf-assisted")
    p.add_argument("--methods", default=DEFAULT_METHODS,
                   help="comma list: none, auto, spec types (suffix), combinations (ngram-simple+suffix), "
                        f"drafter options (ngram-map-k:min_hits=4); default {DEFAULT_METHODS}")
    p.add_argument("--prompts", default="mixed",
                   help="prompt set (mixed, quick), comma list of categories (code,edit,summarize,prose,chat), "
                        "or a .jsonl file")
    p.add_argument("--per-category", type=int, default=None, help="at most this many prompts per category")
    p.add_argument("--temperature", "--temp", default="0", help="comma list, e.g. 0,0.7 (0 = greedy)")
    add_grammar_args(p)  # every specdec request of the method bench follows it (plain and speculative)
    p.add_argument("--max-tokens", "-n", type=int, default=None,
                   help="tokens per answer (default 128; --sessions: the session file's)")
    p.add_argument("--repeats", "-r", type=int, default=3, help="rounds per prompt; medians are taken over them")
    p.add_argument("--spec-draft-n-max", type=int, default=DEFAULT_DRAFT_LENGTH,
                   help=f"draft length of every method (default {DEFAULT_DRAFT_LENGTH})")
    p.add_argument("--draft-lengths", default=None, help="also sweep these draft lengths, e.g. 1,2,3,5")
    p.add_argument("--peers", default=None,
                   help="comma list: hf-plain, hf-assisted, hf-prompt-lookup (--sessions: llama-server)")
    p.add_argument("--peer-url", action="append", default=[],
                   help="an OpenAI-compatible server to measure too (repeatable), e.g. http://127.0.0.1:8080")
    p.add_argument("--peer-model", default=None,
                   help="model name sent to --peer-url and --url servers (--url default: --model when served "
                        "there, else the server's first model)")
    p.add_argument("--hf-dtype", default="bf16", choices=["bf16", "fp32"],
                   help="format transformers holds the dequantized weights in (default bf16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-warmup", action="store_true")
    p.add_argument("--keep-drafter-memory", action="store_true",
                   help="let drafters remember earlier runs (inflates acceptance on repeated prompts)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--out", default="bench-out", help="folder for results.json, report.md and plots")
    add_session_args(p)
    g = p.add_argument_group("server load (--concurrency): an OpenAI-compatible server under concurrent streams")
    g.add_argument("--concurrency", default=None,
                   help="comma list of concurrent clients, e.g. 1,4,16: measure a server instead of the methods")
    g.add_argument("--url", default=None,
                   help="the server, e.g. http://127.0.0.1:8080/v1 (default: start specdec serve on 127.0.0.1 with "
                        "--model, --weights, --ctx-size, --spec-type, -md, --spec-draft-n-max)")
    g.add_argument("--requests", type=int, default=None, help="requests per concurrency level (default 32)")
    g.add_argument("--endpoint", default=None, choices=["completions", "chat"],
                   help="stream /v1/completions (chat prompts as a plain transcript; the default) or "
                        "/v1/chat/completions")
    g.add_argument("--spec-type", default=None, help="speculation of the started server (default: its auto)")
    g.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                   help="sent as 'Authorization: Bearer KEY' to the --url server and every --peer-url "
                        "(default: $SPECDEC_API_KEY)")
    g.add_argument("--request-timeout", type=float, default=None, help="seconds per request (default 300)")
    g.add_argument("--level-timeout", type=float, default=None,
                   help="no new request starts after this many seconds of a level (default 1800)")
    g.add_argument("--server-start-timeout", type=float, default=None,
                   help="seconds to wait for the started server's /health (default 600)")
    p.set_defaults(func=cmd_bench)
