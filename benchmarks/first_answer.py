"""What a chat user waits for before the first answer, with and without the warm-up `edge chat` and `edge
serve` run after load (`Model.warm_up`: the backend's first-run kernels, then the chat template's opening
prefilled). Each run is a fresh process.

    python -m benchmarks.first_answer qwen2.5-coder-1.5b --rounds 3
    python -m benchmarks.first_answer smollm2-135m --backends ort,openvino --system "Be brief."

Per round, backend and variant, a new process loads the model (graph and compiled blob already cached: a warm
disk), runs the warm-up or not, then the first chat turn (one question, 16 greedy tokens). "first answer" is
its time to first token: what the user waits for after sending, when the warm-up finished while they typed
(it takes "warm-up s"; a message sent sooner waits for the rest). "load + warm-up + first" is the whole span:
the warm-up moves work out of the answer, it does not remove it (apart from the opening's prefill, which a
one-shot prompt would pay too). Writes benchmarks/results/first-answer-<model>-<date><tag>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_io import write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
QUESTION = "Write a Python function that checks whether a number is prime."
KEYS = ("load_s", "warm_s", "ttft_s", "cached")


def interleaved_runs(
    command: Callable[[str], list[str]], variants: Sequence[str], rounds: int
) -> dict[str, list[dict[str, Any]]]:
    """Each variant once per round, each run a new process (`command(variant)`, whose last stdout line is one
    JSON object); interleaved, so the machine's drift spreads over all variants alike."""
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            out = subprocess.run(command(v), capture_output=True, text=True, check=True, cwd=ROOT)
            runs[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(v, runs[v][-1], flush=True)
    return runs


def _child(model: str, backend: str, warm: bool, system: str | None, threads: int) -> dict[str, Any]:
    import edge
    from edge.generate import GenerationConfig

    t0 = time.perf_counter()
    m = edge.load(model, backend=backend, n_threads=threads, n_ctx=1024, draft="none")
    load = time.perf_counter() - t0
    t1 = time.perf_counter()
    held = m.warm_up(system) if warm else 0
    warm_s = time.perf_counter() - t1
    head = [{"role": "system", "content": system}] if system else []
    r = m.chat([*head, {"role": "user", "content": QUESTION}], GenerationConfig(max_tokens=16))
    m.close()
    return {
        "load_s": load,
        "warm_s": warm_s,
        "ttft_s": r.stats.ttft_ms / 1e3,
        "cached": r.stats.n_cached_tokens,
        "held": held,
        "prompt_tokens": r.stats.n_prompt_tokens,
        "backend": r.backend,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--backends", default="llamacpp,ort,openvino")
    ap.add_argument("--system", default=None, help="the chat's system prompt (default: the template's own)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        backend, variant = args.child.split(":")
        print(json.dumps(_child(args.model, backend, variant == "warm", args.system, args.threads)))
        return
    variants = [f"{b}:{v}" for b in args.backends.split(",") for v in ("cold", "warm")]

    def command(v: str) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.first_answer",
            args.model,
            "--child",
            v,
            "--threads",
            str(args.threads),
        ]
        return cmd + ([] if args.system is None else ["--system", args.system])

    runs = interleaved_runs(command, variants, args.rounds)
    rows = {}
    for v, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in KEYS}
        med["total_s"] = statistics.median(r["load_s"] + r["warm_s"] + r["ttft_s"] for r in rs)
        rows[v] = {k: round(x, 3) for k, x in med.items()} | {"prompt_tokens": rs[0]["prompt_tokens"]}
    day = dt.date.today().isoformat()
    out = {
        "model": args.model,
        "system": args.system,
        "question": QUESTION,
        "rounds": args.rounds,
        "threads": args.threads,
        "rows": rows,
        "runs": runs,
        "load_avg_1min_end": os.getloadavg()[0],
    }
    stem = RESULTS / f"first-answer-{args.model}-{day}{args.tag}"
    system = "the template's own" if args.system is None else repr(args.system)
    lines = [
        f"# First chat answer after load, {args.model} ({day})",
        "",
        f"`python -m benchmarks.first_answer {args.model} --backends {args.backends} --rounds {args.rounds}`"
        f": system prompt {system}, one question, {args.threads} threads, medians of {args.rounds} fresh "
        f"processes per variant (interleaved); load average at the end {out['load_avg_1min_end']:.2f}.",
        "",
        "| backend | warm-up | load s | warm-up s | prompt tokens | reused | first answer (TTFT) s "
        "| load + warm-up + first s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for v, r in rows.items():
        backend, variant = v.split(":")
        lines.append(
            f"| {backend} | {'yes' if variant == 'warm' else 'no'} | {r['load_s']:.2f} | {r['warm_s']:.2f} | "
            f"{r['prompt_tokens']} | {r['cached']:.0f} | {r['ttft_s']:.3f} | {r['total_s']:.2f} |"
        )
    write_results(stem, out, lines)


if __name__ == "__main__":
    main()
