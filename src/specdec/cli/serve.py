"""`specdec serve`: the OpenAI-compatible server (app.py) on uvicorn.

    specdec serve --model smollm2-135m --spec-type ngram-simple --port 8000 --api-key KEY

Binds 127.0.0.1 unless --host says otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys

import uvicorn

from specdec.cli.options import (UNLIMITED, add_model_args, add_spec_args, add_threads_args, build_engine,
                                 check_max_tokens, token_limit)
from specdec.engine.constrain import warm_vocabulary
from specdec.engine.prefix_cache import PREFIX_CACHE_MODES, PrefixCache
from specdec.server.app import create_app
from specdec.server.scheduler import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_CHUNK


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, SSE, /metrics)")
    add_model_args(p)
    add_threads_args(p)
    add_spec_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY") or None,
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $SPECDEC_API_KEY, else none)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    p.add_argument("--max-tokens", "-n", type=int, default=UNLIMITED,
                   help="most tokens of a completion whose request names no max_tokens; -1 (the default, as "
                        "llama-server's -n): until the model ends it or the context is full")
    p.add_argument("--max-batch", "--parallel", "-np", type=int, default=DEFAULT_MAX_BATCH,
                   help="sequences generated together, one target forward per step (continuous batching; "
                        f"llama.cpp's -np); each gets a --ctx-size context (default {DEFAULT_MAX_BATCH})")
    p.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait for a place in the batch; beyond that 503 + Retry-After "
                        "(default 64)")
    p.add_argument("--request-timeout", type=float, default=None,
                   help="seconds from arrival after which a request fails with 504 (default: no limit)")
    p.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK,
                   help=f"prompt tokens a sequence prefills per step, so running streams keep flowing "
                        f"(default {DEFAULT_PREFILL_CHUNK})")
    p.add_argument("--prefix-cache", choices=PREFIX_CACHE_MODES, default=None,
                   help="reuse the KV rows earlier requests left for a prompt that starts the same (a system "
                        "prompt, a conversation so far): on (default, where the model allows), exact (a warm "
                        "answer is bitwise the cold one; prompts prefill at decode's numerics, slower), off "
                        "(docs/server.md)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    # build_engine also reads the sampling flags of `generate`; a server takes sampling per request
    p.set_defaults(func=cmd_serve, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None)


def cmd_serve(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be between 0 and 65535, got {args.port}")
    check_max_tokens(args.max_tokens)
    if not 1 <= args.max_batch <= 256:
        raise ValueError(f"--max-batch must be between 1 and 256, got {args.max_batch}")
    if args.max_queue < 0:
        raise ValueError(f"--max-queue must be 0 or more, got {args.max_queue}")
    if args.request_timeout is not None and not 0 < args.request_timeout < float("inf"):
        raise ValueError(f"--request-timeout must be a positive number of seconds, got {args.request_timeout}")
    if args.prefill_chunk < 1:
        raise ValueError(f"--prefill-chunk must be at least 1, got {args.prefill_chunk}")
    if args.api_key == "":
        raise ValueError("--api-key is empty, which would let every request in; give a key, or leave the flag out "
                         "to serve without one")
    sock = listen(args.host, args.port)  # a busy port or a bad host: said now, not after the model loads
    engine, _server_sampling = build_engine(args)  # the same target + drafters `generate` would run (and checks)
    prefix = args.prefix_cache or ("on" if engine.cache.holds_prefixes else "off")  # a recurrent model: off
    engine.prefix = PrefixCache(prefix, engine.cache)  # before any request: the slots hold nothing yet
    name = args.served_model_name or args.model
    app = create_app(engine, name, api_key=args.api_key, default_max_tokens=token_limit(args.max_tokens, engine),
                     max_batch=args.max_batch, max_queue=args.max_queue, request_timeout=args.request_timeout,
                     prefill_chunk=args.prefill_chunk)
    warm_vocabulary(engine.model)  # the grammar engine's vocabulary, built while the server starts (1-5 s)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"warning: serving on {args.host} without --api-key: anyone who can reach it can use it",
              file=sys.stderr)
    port = sock.getsockname()[1]  # --port 0: the one the system chose
    print(f"specdec: serving {name} on http://{args.host}:{port}/v1 (speculation: {engine.spec.method}; "
          f"up to {args.max_batch} sequences per step, {args.max_queue} more may wait; prefix cache {prefix})",
          file=sys.stderr)
    config = uvicorn.Config(app, host=args.host, port=port, log_level=args.log_level,
                            timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
    GracefulServer(config, app.state.worker).run(sockets=[sock])
    return 0


SHUTDOWN_GRACE_S = 5.0  # what running requests get to finish after SIGINT/SIGTERM


class GracefulServer(uvicorn.Server):
    """uvicorn's server, answering every request in flight when it stops: waiting ones get a 503 at once,
    running ones the grace period to finish, then a 503 (a stream: its error event and [DONE]) shortly before
    uvicorn would cancel their handlers (which answered a plain-text 500, or cut a stream mid-body)."""

    def __init__(self, config: uvicorn.Config, worker):
        super().__init__(config)
        self.worker = worker

    async def shutdown(self, sockets=None) -> None:
        self.worker.drain()
        grace = self.config.timeout_graceful_shutdown
        if grace is not None:  # None: uvicorn waits for them for ever
            asyncio.get_running_loop().call_later(max(grace - 1.0, 0), self.worker.end_running)
        await super().shutdown(sockets)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port and listening (as uvicorn would bind it); ValueError saying why not."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:  # socket.gaierror: a host name that does not resolve
        raise ValueError(f"--host {host}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock
