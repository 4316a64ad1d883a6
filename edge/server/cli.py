"""`edge serve [MODEL...]`: the OpenAI-compatible server on the command line (the parser and its command)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from edge.cli_args import add_load_args, load_kwargs

__all__ = ["add_parser", "cmd_serve"]


def add_parser(sub: Any) -> None:
    srv = sub.add_parser(
        "serve", help="an OpenAI-compatible HTTP server on this machine (loopback by default)"
    )
    srv.add_argument(
        "models", nargs="*", metavar="MODEL", help="catalog names or .gguf paths (default smollm2-135m)"
    )
    srv.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need a key)"
    )
    srv.add_argument("--port", type=int, default=8080, help="default 8080 (0: a free port)")
    srv.add_argument(
        "--api-key", default=None, help="require Authorization: Bearer KEY (default $EDGE_API_KEY)"
    )
    srv.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="allow this web origin (repeatable)",
    )
    srv.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="accept this Host header besides the loopback names (repeatable)",
    )
    srv.add_argument(
        "--models-max",
        type=int,
        default=None,
        help="models held at once; above those named, pulled ones load on demand",
    )
    srv.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="requests served at once per model: N slots of one model, their tokens in one forward a step "
        "(one copy of the weights); N replicas with a draft model or where the backend runs one sequence",
    )
    srv.add_argument(
        "--queue", type=int, default=32, help="requests waiting per model before 429 (default 32)"
    )
    srv.add_argument("--max-tokens", type=int, default=4096, help="the most new tokens a request may ask for")
    srv.add_argument(
        "--grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="on SIGINT/SIGTERM, the time requests in flight get to finish (default 5)",
    )
    srv.add_argument(
        "--keep-alive",
        type=_duration,
        default=None,
        metavar="DURATION",
        help="unload a model idle this long (5m, 1h, 0; default -1: keep it); it loads again on demand",
    )
    add_load_args(srv, phases=True)
    srv.set_defaults(func=cmd_serve)


def _duration(text: str) -> float | None:
    from edge.server.config import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_serve(args: argparse.Namespace) -> int:
    from edge.server.config import Limits
    from edge.server.runner import serve

    serve(
        args.models,
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get("EDGE_API_KEY") or None,
        cors_origins=args.cors_origin,
        allowed_hosts=args.allowed_host,
        models_max=args.models_max,
        parallel=args.parallel,
        limits=Limits(max_tokens=args.max_tokens, queue_size=args.queue),
        grace_s=args.grace,
        keep_alive_s=args.keep_alive,
        **load_kwargs(args),
    )
    return 0
