"""`specdec serve`: the OpenAI-compatible server (app.py) on uvicorn.

    specdec serve --model smollm2-135m --spec-type ngram-simple --port 8000 --api-key KEY

Binds 127.0.0.1 unless --host says otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys

from specdec.options import add_model_args, add_spec_args, build_engine
from specdec.server.app import DEFAULT_MAX_TOKENS


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, SSE, /metrics)")
    add_model_args(p)
    add_spec_args(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get("SPECDEC_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on /v1 (default: $SPECDEC_API_KEY, else none)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model)")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"completion length when a request names none (default {DEFAULT_MAX_TOKENS})")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    # build_engine also reads the sampling flags of `generate`; a server takes sampling per request
    p.set_defaults(func=cmd_serve, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=None)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from specdec.server.app import create_app

    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    engine, _server_sampling = build_engine(args)  # the same target + drafters `generate` would run
    name = args.served_model_name or args.model
    app = create_app(engine, name, api_key=args.api_key, default_max_tokens=args.max_tokens)
    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.api_key:
        print(f"warning: serving on {args.host} without --api-key: anyone who can reach it can use it",
              file=sys.stderr)
    print(f"specdec: serving {name} on http://{args.host}:{args.port}/v1 (speculation: {engine.spec.method}; "
          "one generation at a time, requests queue in arrival order)", file=sys.stderr)
    # on shutdown, streams still open get 5 s; then their handlers are cancelled, which cancels their generation
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5)
    return 0
