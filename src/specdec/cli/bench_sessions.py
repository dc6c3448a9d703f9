"""`specdec bench --sessions [FILE]`: the agentic multi-turn sessions (bench/sessions.py) through the prefix
cache, each method beside plain decoding, free and under the sessions' JSON schema / tool call grammar, and
llama-server on the same token ids (bench/session_peer.py); the table goes into --out's results.json and
report.md (bench/session_report.py).

    specdec bench -m qwen2.5-coder-1.5b --sessions --methods none,auto,suffix --prefix-cache on \\
        --constrain both --peers llama-server --out bench-out
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from specdec.bench.methods import parse_methods
from specdec.bench.provenance import artifact, runtime_info
from specdec.bench.session_bench import CONSTRAIN_MODES, run_sessions
from specdec.bench.session_peer import PEER, LlamaServerSessions
from specdec.bench.report import write_sessions
from specdec.bench.session_report import summary_table
from specdec.bench.sessions import DEFAULT_SESSIONS, load_sessions, max_tokens_of
from specdec.bench.tool_gbnf import call_gbnf
from specdec.engine.prefix_cache import PREFIX_CACHE_MODES
from specdec.model.device import pick_device
from specdec.model.files import out_dir
from specdec.model.load import load_model
from specdec.model.threads import set_threads

# the method bench's flags and their defaults: --sessions refuses them set otherwise
METHOD_BENCH_ONLY = {"repeats": 3, "draft_lengths": None, "peer_url": [], "per_category": None, "prompts": "mixed",
                     "temperature": "0", "json_schema": None, "json_schema_file": None, "grammar": None,
                     "grammar_file": None, "keep_drafter_memory": False, "concurrency": None, "url": None,
                     "requests": None, "endpoint": None, "spec_type": None}


def add_session_args(p) -> None:
    g = p.add_argument_group("agentic sessions (--sessions): multi-turn tool and JSON sessions through the "
                             "prefix cache")
    g.add_argument("--sessions", nargs="?", const=str(DEFAULT_SESSIONS), default=None, metavar="FILE",
                   help="run the multi-turn sessions of FILE (default: the shipped agentic set) instead of the "
                        "prompt sets; --peers takes llama-server here")
    g.add_argument("--prefix-cache", default=None, choices=PREFIX_CACHE_MODES,
                   help="the engine's prefix cache in --sessions (default on)")
    g.add_argument("--constrain", default=None, choices=CONSTRAIN_MODES,
                   help="--sessions free (off, the default), under each session's response_format / tools (on), "
                        "or both")


def check_not_sessions(args) -> None:
    """The method bench and the load mode refuse the --sessions mode's own flags."""
    given = [f"--{n.replace('_', '-')}" for n in ("prefix_cache", "constrain") if getattr(args, n) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} set the --sessions mode; add --sessions or drop them")


def cmd_sessions(args) -> int:
    given = ["--" + n.replace("_", "-") for n, d in METHOD_BENCH_ONLY.items() if getattr(args, n, d) != d]
    if given:
        raise ValueError(f"{', '.join(given)} set the prompt-set bench or the load mode; --sessions runs each "
                         "session's turns once, greedy, as the session file writes them")
    path = Path(args.sessions)
    if not path.is_file():
        raise ValueError(f"--sessions {path}: no such file (a JSON Lines file of sessions; bare --sessions runs "
                         "the shipped set)")
    sessions = load_sessions(path)
    peers = [p.strip() for p in (args.peers or "").split(",") if p.strip()]
    if any(p != PEER for p in peers) or len(peers) > 1:
        raise ValueError(f"--peers {args.peers!r}: --sessions measures the peer {PEER} only")
    if peers and (args.constrain or "off") != "off":
        for s in sessions:  # llama-server's call grammar: a tool schema it cannot write fails now, not at its turn
            if s.tools:
                call_gbnf(list(s.tools))
    max_tokens = args.max_tokens if args.max_tokens is not None else max_tokens_of(path)
    if max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {max_tokens}")
    out_dir(args.out)
    set_threads(args.threads)
    model = load_model(args.model, args.weights, device=pick_device(args.device), cache_type=args.cache_type)
    methods = parse_methods(args.methods, args.draft_model, args.spec_draft_n_max, model)
    ctx = args.ctx_size or 4096
    server = None
    if peers:
        if not str(model.info.path).endswith(".gguf"):
            raise ValueError(f"--peers {PEER} loads the same GGUF file; {model.info.path} is not one")
        server = LlamaServerSessions.start(model.tokenizer, model.info.path, args.threads or torch.get_num_threads(),
                                           ctx, Path(args.out) / "llama-server.log")
    try:
        section = run_sessions(model, sessions, methods, args.prefix_cache or "on", max_tokens,
                               args.constrain or "off", [server] if server else [], ctx, not args.no_progress,
                               not args.no_warmup)
    finally:
        if server is not None:
            server.close()
    files = write_sessions(section, args.out, runtime_info(), artifact(model))
    print("\n".join(summary_table(section)))
    print(f"wrote {files['markdown']}", file=sys.stderr)
    return 0
