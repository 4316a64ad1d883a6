"""What a CLI user's one prompt costs: load, the first prompt after load and its first decode steps, against
llama.cpp, and whether warming a decoder up at load (a 16-row and a one-row forward, then a reset) pays. Each
run is a fresh process.

    python benchmarks/first_prompt.py gemma3-270m --rounds 5
    python benchmarks/first_prompt.py qwen2.5-coder-1.5b --backends llamacpp,openvino,openvino-warm --rounds 2

Per round and variant a new process opens the decoder (graph and compiled blob already cached: a warm disk),
then times a --prompt-token prompt (the first after load), 16 decode steps, and the same prompt again after a
reset (warm). "B-warm" is backend B with that warm-up counted in its load: OpenVINO's CPU plugin repacks its
weights on the first runs, not in compile_model, so a warm-up moves that cost out of the first prompt. "load +
first + 16 steps" is what a one-shot run waits for; a chat or a server, whose load comes before the user's
first prompt, waits only for the first prompt.
Writes benchmarks/results/first-prompt-<model>-<date><tag>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from fresh_process import interleaved_runs
from results_io import write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STEPS = 16


def _child(model: str, variant: str, prompt_tokens: int, threads: int) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from edge.bench import bench_prompt
    from edge.devices.base import warm_kernels
    from edge.devices.registry import DecoderOptions, open_decoder
    from edge.models.gguf_file import open_gguf
    from edge.models.resolve import resolve_model
    from edge.models.tokenizer import load_tokenizer

    backend = variant.removesuffix("-warm")
    path = resolve_model(model)
    prompt = bench_prompt(load_tokenizer(open_gguf(path).metadata), prompt_tokens)
    t0 = time.perf_counter()
    dec = open_decoder(
        backend, path, "cpu", DecoderOptions(n_ctx=prompt_tokens + 2 * STEPS, n_threads=threads)
    )
    if variant.endswith("-warm"):
        warm_kernels(dec)  # what Model.warm_up runs where a backend has first-run costs
    load = time.perf_counter() - t0

    def timed(tokens: list[int]) -> tuple[float, int]:
        t = time.perf_counter()
        logits = dec.forward(tokens, last_only=True)
        return time.perf_counter() - t, int(logits[-1].argmax())

    first, tok = timed(prompt)
    t1 = time.perf_counter()
    for _ in range(STEPS):
        _, tok = timed([tok])
    steps = time.perf_counter() - t1
    dec.reset()
    warm, _ = timed(prompt)
    dec.close()
    return {"load_s": load, "first_s": first, "steps_s": steps, "warm_s": warm, "tokens": len(prompt)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--backends", default="llamacpp,ort,openvino,openvino-warm")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tag", default="")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.model, args.child, args.prompt, args.threads)))
        return
    variants = args.backends.split(",")

    def command(v: str) -> list[str]:
        cmd = [sys.executable, __file__, args.model, "--child", v, "--prompt", str(args.prompt)]
        return [*cmd, "--threads", str(args.threads)]

    runs = interleaved_runs(command, variants, args.rounds)
    rows: dict[str, dict[str, Any]] = {}
    for v, rs in runs.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("load_s", "first_s", "steps_s", "warm_s")}
        n = rs[0]["tokens"]
        med["answer_s"] = statistics.median(r["load_s"] + r["first_s"] + r["steps_s"] for r in rs)
        rows[v] = {
            **{k: round(x, 3) for k, x in med.items()},
            "first_tok_s": round(n / med["first_s"], 1),
            "warm_tok_s": round(n / med["warm_s"], 1),
        }
    base = rows.get("llamacpp")
    day = dt.date.today().isoformat()
    out = {
        "model": args.model,
        "prompt_tokens": runs[variants[0]][0]["tokens"],
        "rounds": args.rounds,
        "threads": args.threads,
        "rows": rows,
        "runs": runs,
        "load_avg_1min_end": os.getloadavg()[0],
    }
    stem = RESULTS / f"first-prompt-{args.model}-{day}{args.tag}"
    lines = [
        f"# First prompt after load, {args.model} ({day})",
        "",
        f"`python benchmarks/first_prompt.py {args.model} --backends {args.backends} --rounds {args.rounds}`: "
        f"a {out['prompt_tokens']}-token prompt, {STEPS} decode steps, {args.threads} threads, medians of "
        f"{args.rounds} fresh processes per variant (interleaved); load average at the end {out['load_avg_1min_end']:.2f}.",
        "",
        "| variant | load s | first prompt s | first tok/s | warm tok/s | 16 steps s | load + first + 16 steps s |"
        + (" x llama.cpp first |" if base else ""),
        "|---|---|---|---|---|---|---|" + ("---|" if base else ""),
    ]
    for v, r in rows.items():
        ratio = f" {r['first_tok_s'] / base['first_tok_s']:.2f} |" if base else ""
        lines.append(
            f"| {v} | {r['load_s']:.2f} | {r['first_s']:.3f} | {r['first_tok_s']:.0f} | {r['warm_tok_s']:.0f} | "
            f"{r['steps_s']:.3f} | {r['answer_s']:.2f} |{ratio}"
        )
    write_results(stem, out, lines)


if __name__ == "__main__":
    main()
