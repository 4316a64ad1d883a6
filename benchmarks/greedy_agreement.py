"""Greedy generations of edge's own graph (ORT, OpenVINO) against llama.cpp's, token for token.

    python -m benchmarks.greedy_agreement                         # 3 models x 2 backends x 10 prompts x 128
    python -m benchmarks.greedy_agreement --models smollm2-135m --tokens 32 --prompts 3
    python -m benchmarks.greedy_agreement --backends ort,openvino,llamacpp-tokenwise

`llamacpp-tokenwise` is llama.cpp against itself with the prompt fed one token at a time: how often its own
decode path keeps the greedy path of its batched prefill (the floor for any engine compared with it).

Each prompt runs through the model's chat template (a base model gets the raw text), then greedy decoding
on the Decoder contract with EOS ignored, so every run is `--tokens` long. Reports per (model, backend) how
many prompts are identical and, for the others, the first divergent position. Writes
benchmarks/results/greedy-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

import numpy as np

from edge.api import load
from edge.devices.base import Decoder
from edge.devices.registry import DecoderOptions, open_decoder

ROOT = Path(__file__).resolve().parents[1]

PROMPTS = (
    "Why is the sky blue?",
    "Write a Python function that checks whether a string is a palindrome.",
    "List three uses of a paperclip.",
    "Explain recursion to a ten-year-old.",
    "What is the capital of Australia, and why was it chosen?",
    "Translate 'good morning, my friend' into French and Spanish.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "def fibonacci(n):",
    "Give me a haiku about autumn rain.",
    "How do I reverse a linked list in C?",
)
MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b")


def greedy(dec: Decoder, prompt: list[int], n: int, piece: int | None = None) -> list[int]:
    """`piece`: feed the prompt that many tokens per forward (None: all at once)."""
    dec.reset()
    step = piece or len(prompt)
    for i in range(0, len(prompt), step):
        logits = dec.forward(prompt[i : i + step], last_only=True)[-1]
    out: list[int] = []
    for _ in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        if len(out) < n:
            logits = dec.forward([tok], last_only=True)[-1]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--backends", default="ort,openvino")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for name in args.models.split(","):
        with load(name, backend="llamacpp", n_ctx=1024) as ref_model:
            prompts = [ref_model.prompt_ids(p) for p in PROMPTS[: args.prompts]]
            refs = [greedy(ref_model.decoder, p, args.tokens) for p in prompts]
            path = ref_model.path
        for backend in args.backends.split(","):
            # llamacpp-tokenwise: llama.cpp itself, the prompt fed one token at a time (its decode path)
            tokenwise = backend == "llamacpp-tokenwise"
            dec = open_decoder("llamacpp" if tokenwise else backend, path, "cpu", DecoderOptions(n_ctx=1024))
            firsts = []
            for p, ref in zip(prompts, refs, strict=True):
                got = greedy(dec, p, args.tokens, 1 if tokenwise else None)
                diff = next((i for i, (a, b) in enumerate(zip(got, ref, strict=True)) if a != b), None)
                firsts.append(diff)
            dec.close()
            same = sum(d is None for d in firsts)
            row = {
                "model": name,
                "backend": backend,
                "prompts": len(prompts),
                "identical": same,
                "first_divergence": firsts,
                "tokens": args.tokens,
            }
            rows.append(row)
            print(
                f"{name:20} {backend:9} identical {same}/{len(prompts)}  first divergence {firsts}",
                flush=True,
            )
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / f"greedy-{dt.date.today().isoformat()}"
    stem.with_suffix(".json").write_text(json.dumps({"rows": rows}, indent=1))
    lines = [
        "| model | backend | identical | first divergent position (None = identical) |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['model']} | {r['backend']} | {r['identical']}/{r['prompts']} | {r['first_divergence']} |"
        for r in rows
    ]
    stem.with_suffix(".md").write_text(
        f"Greedy {args.tokens}-token generations vs llama.cpp (`python -m benchmarks.greedy_agreement`)\n\n"
        + "\n".join(lines)
        + "\n"
    )


if __name__ == "__main__":
    main()
