"""Prefill time of one prompt on edge's ORT graph by prefill chunk (GraphOptions.prefill_chunk), side by side.

    python benchmarks/prefill_chunk.py gemma3-270m --chunks 128,256,512 --prompt 512 --rounds 7

One decoder per chunk size on the same cached graph (fast precision, the graph `--backend ort` runs), opened
together with non-spinning threads (an idle session's spinning threads would slow the one running); each
round prefills the prompt on every decoder in turn (reset first), so machine drift hits all alike. Reports the
median wall and process CPU time per chunk size (CPU time: less sensitive to other jobs on the machine) and
the ratio to the first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge.devices.graph_decoder import GraphDecoder, GraphOptions  # noqa: E402
from edge.models.gguf_file import open_gguf  # noqa: E402
from edge.models.resolve import resolve_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--chunks", default="128,256,512")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="fast")
    args = ap.parse_args()
    gguf = open_gguf(resolve_model(args.model))
    chunks = [int(c) for c in args.chunks.split(",")]
    decs = {
        c: GraphDecoder(
            gguf,
            GraphOptions(
                capacity=4096, threads=args.threads, precision=args.precision, prefill_chunk=c, spin=False
            ),
        )
        for c in chunks
    }
    prompt = [100 + i % 1000 for i in range(args.prompt)]
    times: dict[int, list[float]] = {c: [] for c in chunks}
    cpu: dict[int, list[float]] = {c: [] for c in chunks}
    for dec in decs.values():  # shapes seen once before timing
        dec.forward(prompt, last_only=True)
    for r in range(args.rounds):
        for c in chunks if r % 2 == 0 else chunks[::-1]:
            dec = decs[c]
            dec.reset()
            c0, t0 = time.process_time(), time.perf_counter()
            dec.forward(prompt, last_only=True)
            times[c].append(time.perf_counter() - t0)
            cpu[c].append(time.process_time() - c0)
    base, base_cpu = statistics.median(times[chunks[0]]), statistics.median(cpu[chunks[0]])
    print(f"{args.model}: {args.prompt}-token prompt, {args.rounds} rounds, {args.threads} threads")
    for c in chunks:
        med, med_cpu = statistics.median(times[c]), statistics.median(cpu[c])
        print(
            f"  chunk {c:4}: wall {med * 1e3:7.1f} ms ({args.prompt / med:6.0f} tok/s, x{base / med:.3f}), "
            f"CPU {med_cpu * 1e3:7.1f} ms (x{base_cpu / med_cpu:.3f}) vs chunk {chunks[0]}"
        )
    for dec in decs.values():
        dec.close()


if __name__ == "__main__":
    main()
