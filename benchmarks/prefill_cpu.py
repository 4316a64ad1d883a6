"""CPU time of a prompt's prefill on a backend: the work it costs, less sensitive than wall time to a machine
that other jobs share (two runs of this script by different checkouts compare their code).

    python benchmarks/prefill_cpu.py gemma3-270m --backend ort --prompt 512 --rounds 5
    /path/to/other/checkout/.venv/bin/python benchmarks/prefill_cpu.py gemma3-270m   # that checkout's edge

The decoder is opened with non-spinning runtime threads (DecoderOptions.spin=False: a spinning thread's wait
would count as work); each round opens it afresh and times the first prompt after load, then the same prompt
again after reset (warm). Reports medians of process CPU seconds and of wall seconds, as tokens per second.
The `edge` imported is the interpreter's (its environment's editable install), not necessarily this file's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import edge
from edge.bench import bench_prompt
from edge.devices.registry import DecoderOptions, open_decoder
from edge.models.gguf_file import open_gguf
from edge.models.resolve import resolve_model
from edge.models.tokenizer import load_tokenizer


def _timed(fn) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--backend", default="ort")
    ap.add_argument("--precision", default="fast")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = ap.parse_args()
    path = resolve_model(args.model)
    prompt = bench_prompt(load_tokenizer(open_gguf(path).metadata), args.prompt)
    opts = DecoderOptions(
        n_ctx=args.prompt + 64, n_threads=args.threads, precision=args.precision, spin=False
    )
    first: list[tuple[float, float]] = []
    warm: list[tuple[float, float]] = []
    for _ in range(args.rounds):
        dec = open_decoder(args.backend, path, "cpu", opts)
        try:
            first.append(_timed(lambda: dec.forward(prompt, last_only=True)))  # noqa: B023
            dec.reset()
            warm.append(_timed(lambda: dec.forward(prompt, last_only=True)))  # noqa: B023
        finally:
            dec.close()
    n = len(prompt)

    def rate(xs: list[tuple[float, float]], i: int) -> float:
        return n / statistics.median(x[i] for x in xs)

    out = {
        "model": args.model,
        "backend": args.backend,
        "edge": str(edge.__file__),
        "prompt_tokens": n,
        "rounds": args.rounds,
        "first_cpu_tok_s": round(rate(first, 0), 1),
        "warm_cpu_tok_s": round(rate(warm, 0), 1),
        "first_wall_tok_s": round(rate(first, 1), 1),
        "warm_wall_tok_s": round(rate(warm, 1), 1),
    }
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{args.model} {args.backend} ({out['edge']}): {n}-token prompt, per CPU second (per wall second): "
        f"first {out['first_cpu_tok_s']} ({out['first_wall_tok_s']}), warm {out['warm_cpu_tok_s']} "
        f"({out['warm_wall_tok_s']}) tok/s"
    )


if __name__ == "__main__":
    main()
