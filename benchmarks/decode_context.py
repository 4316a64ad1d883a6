"""Decode step time against the context already in the KV cache, per backend, in one run: where the own
graphs' decode falls behind llama.cpp as the context grows (attention and the KV traffic around it) and where
it does not (the weights).

    python -m benchmarks.decode_context smollm2-135m
    python -m benchmarks.decode_context qwen2.5-coder-0.5b --contexts 16,256,512,1024 --rounds 3

Each backend opens the model once (`open_decoder`, `--precision fast`, n_ctx the largest context + steps);
per round and context it prefills that many tokens and times `--steps` single-token greedy-shaped forwards
(the same token ids for every backend). Backends take turns per (round, context), so machine noise hits all of
them. Prints the median ms per step and each backend's ratio to llama.cpp, plus the cost per 1,000 tokens of
context (a least-squares slope over the contexts); writes benchmarks/results/decode-context-<model>-<date>.md
and .json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.results_io import write_results
from edge.devices.registry import DecoderOptions, open_decoder
from edge.models.resolve import resolve_model

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"


def step_ms(dec: Any, context: int, steps: int) -> float:
    dec.reset()
    if context:
        dec.forward(list(range(100, 100 + context)), last_only=True)
    t = time.perf_counter()
    for i in range(steps):
        dec.forward([1000 + i], last_only=True)
    return (time.perf_counter() - t) / steps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--backends", default="llamacpp,ort,openvino")
    ap.add_argument("--contexts", default="16,256,512,1024")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="", help="suffix of the result files' names")
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    backends = args.backends.split(",")
    path = resolve_model(args.model)
    opts = DecoderOptions(n_ctx=max(contexts) + args.steps + 16, n_threads=args.threads)
    decs = {b: open_decoder(b, path, "cpu", opts) for b in backends}
    for dec in decs.values():  # first runs (kernel preparation) are not what this measures
        step_ms(dec, min(contexts), 2)
    times: dict[str, dict[int, list[float]]] = {b: {c: [] for c in contexts} for b in backends}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for c in contexts:
            for b, dec in decs.items():
                times[b][c].append(step_ms(dec, c, args.steps))
    load.append(os.getloadavg()[0])
    for dec in decs.values():
        dec.close()
    med = {b: {c: statistics.median(v) for c, v in per.items()} for b, per in times.items()}
    # ms per step per 1,000 tokens of context: the slope of a least-squares line through the medians
    slope = {b: float(np.polyfit(contexts, [m[c] for c in contexts], 1)[0]) * 1e3 for b, m in med.items()}
    ref = backends[0]
    lines = [
        f"# Decode step vs context: {args.model} ({dt.date.today()})",
        "",
        f"`python -m benchmarks.decode_context {args.model} --contexts {args.contexts} --steps {args.steps} "
        f"--rounds {args.rounds}{f' --tag={args.tag}' if args.tag else ''}` on {platform.machine()}, {os.cpu_count()} cores, {args.threads} threads; "
        f"--precision fast; medians of {args.rounds} interleaved rounds of {args.steps} one-token forwards "
        f"after a prefill of the context; load average {load[0]:.2f} -> {load[1]:.2f}.",
        "",
        "| backend | " + " | ".join(f"ctx {c} ms (x {ref})" for c in contexts) + " | ms per 1k ctx |",
        "|---|" + "---|" * (len(contexts) + 1),
    ]
    for b in backends:
        cells = [f"{med[b][c]:.2f} ({med[ref][c] / med[b][c]:.2f}x)" for c in contexts]
        lines.append(f"| {b} | " + " | ".join(cells) + f" | {slope[b]:.2f} |")
    payload = {"args": vars(args), "median_ms": med, "slope_ms_per_1k": slope, "runs_ms": times, "load": load}
    write_results(
        RESULTS / f"decode-context-{Path(args.model).name}-{dt.date.today()}{args.tag}", payload, lines
    )


if __name__ == "__main__":
    main()
