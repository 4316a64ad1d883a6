"""`edge embed MODEL [TEXT...] [--json]`: one vector per text (lines of stdin when no TEXT is given)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from edge.errors import EdgeError

__all__ = ["add_parser", "cmd_embed"]


def add_parser(sub: Any) -> None:
    emb = sub.add_parser("embed", help="embedding vectors of texts (an embedding model: all-minilm)")
    emb.add_argument(
        "model", help="catalog embedding model (all-minilm-l6-v2) or sentence-transformers folder"
    )
    emb.add_argument("texts", nargs="*", metavar="TEXT", help="texts (default: one per line of stdin)")
    emb.add_argument("--json", action="store_true", help="one JSON object on stdout")
    emb.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "ort", "openvino"),
        help="auto: openvino where installed",
    )
    emb.add_argument("--precision", default="fast", choices=("fast", "exact"))
    emb.add_argument("--threads", type=int, default=None, dest="n_threads")
    emb.add_argument("--truncate", action="store_true", help="cut inputs longer than the model takes")
    emb.set_defaults(func=cmd_embed)


def _texts(args: argparse.Namespace) -> list[str]:
    if args.texts:
        return list(args.texts)
    if sys.stdin is None:
        raise EdgeError("standard input is closed: no text to embed", hint="pass TEXT, or lines on stdin")
    lines = [line.rstrip("\r\n") for line in sys.stdin]
    texts = [t for t in lines if t.strip()]
    if not texts:
        raise EdgeError(
            "no text to embed", hint='pass TEXT (edge embed all-minilm "a cat"), or lines on stdin'
        )
    return texts


def cmd_embed(args: argparse.Namespace) -> int:
    from edge.embed import load_embedder

    texts = _texts(args)  # before the model is read
    with load_embedder(
        args.model, backend=args.backend, precision=args.precision, n_threads=args.n_threads
    ) as model:
        t0 = time.perf_counter()
        seqs = model.tokenize(texts, truncate=args.truncate)
        vectors = model.embed_tokens(seqs)
        ms = (time.perf_counter() - t0) * 1e3
    if args.json:
        out = {
            "model": model.name,
            "dim": model.dim,
            "embeddings": vectors.tolist(),
            "n_tokens": [len(s) for s in seqs],
            "backend": model.backend,
            "precision": model.precision,
            "ms": round(ms, 2),
        }
        print(json.dumps(out))
    else:
        for v in vectors:
            print(" ".join(f"{x:.6g}" for x in v))
    return 0
