"""Decode speed of two ONNX graphs of one model on ORT, token by token in turn: the graph this checkout builds
(`--backend ort`) against another build of it, e.g. the cached graph of an earlier version of edge.

    python benchmarks/graph_ab.py qwen2.5-coder-1.5b --baseline ~/.cache/edge/graphs/<key>/model.onnx

Both graphs run in one process on one KV cache (written by each in turn: this times them, its tokens are not
a generation), alternating every decode step so that a shared machine's load falls on both alike; no thread
spinning (a session's threads spinning after its turn would slow the other's). Prints median ms per token.
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
from edge.devices.runners import OrtRunner, RunnerOptions  # noqa: E402
from edge.models.gguf_file import open_gguf  # noqa: E402
from edge.models.resolve import resolve_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument(
        "--baseline", type=Path, required=True, help="model.onnx of the other build (the ratios' base)"
    )
    ap.add_argument("--also", type=Path, action="append", default=[], help="more graphs to time alike")
    ap.add_argument("--precision", default="fast", choices=["exact", "fast"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4, help="prefills, each followed by --steps steps")
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args()
    opts = GraphOptions(
        backend="ort", capacity=512, precision=args.precision, threads=args.threads, spin=False
    )
    dec = GraphDecoder(open_gguf(resolve_model(args.model)), opts)
    ropts = RunnerOptions("cpu", args.threads, args.precision, spin=False)
    runners = {"baseline": OrtRunner(args.baseline, ropts), "current": dec.runner}
    runners |= {f"also {i + 1}": OrtRunner(path, ropts) for i, path in enumerate(args.also)}
    secs: dict[str, list[float]] = {name: [] for name in runners}
    try:
        for _ in range(args.rounds):
            dec.reset()
            dec.forward(list(range(100, 132)), last_only=True)
            for i in range(args.steps):
                for name, runner in runners.items():
                    dec.runner = runner
                    t0 = time.perf_counter()
                    dec.forward([1000 + i], last_only=True)
                    secs[name].append(time.perf_counter() - t0)
    finally:
        dec.runner = runners.pop("current")
        for runner in runners.values():
            runner.close()
        dec.close()
    base = statistics.median(secs["baseline"])
    print(
        f"{args.model} --precision {args.precision}, {args.threads} threads, {len(secs['current'])} steps each"
    )
    print(f"current graph:  {dec.graph_path}")
    print(f"baseline graph: {args.baseline}")
    for i, path in enumerate(args.also):
        print(f"also {i + 1}: {path}")
    print("| graph | ms / token (median) | tok/s | x baseline |")
    print("|---|---|---|---|")
    for name, ts in secs.items():
        med = statistics.median(ts)
        print(f"| {name} | {1e3 * med:.1f} | {1 / med:.2f} | {base / med:.3f} |")


if __name__ == "__main__":
    main()
