"""Where edge's ORT graph spends a decode step: ONNX Runtime's own profiler, per op type.

    python -m benchmarks.ort_profile qwen2.5-coder-0.5b
    python -m benchmarks.ort_profile smollm2-135m --prompt 128 --steps 64
    python -m benchmarks.ort_profile gemma3-270m --prefill --prompt 512 --steps 3

--prefill times whole prompts instead (reset, then the prompt again, `--steps` times; each is one or more
chunked forwards, reported together per prompt).

Prefills a prompt, decodes `--steps` single tokens on the default ORT graph (the one `--backend ort` runs),
and reports the mean model_run time of the decode steps and each op type's kernel time per step, beside the
wall time of each forward through the decoder (the ring's bookkeeping, the binding and Python outside the run).
With --prompt 4096 the decode steps run at a depth of 4,096 tokens (the prompt's prefill is not profiled).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import tempfile
import time
from pathlib import Path

import onnxruntime as ort

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.registry import DecoderOptions, open_decoder
from edge.models.gguf_file import open_gguf
from edge.models.resolve import resolve_model

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", action="store_true", help="time prompts (after reset), not decode steps")
    ap.add_argument("--chunk", type=int, default=0, help="prefill chunk (default: GraphOptions')")
    ap.add_argument("--nodes", type=int, default=0, help="also the N costliest nodes, layers folded together")
    ap.add_argument(
        "--batch", type=int, default=1, help="tokens per timed forward (a speculative verify's size)"
    )
    args = ap.parse_args()
    prefix = str(Path(tempfile.mkdtemp()) / "ort")
    base = ort.SessionOptions

    class Profiled(base):  # type: ignore[misc,valid-type]
        """The runner's SessionOptions with ORT's profiler on (the runner sets everything else)."""

        def __init__(self) -> None:
            super().__init__()
            self.enable_profiling = True
            self.profile_file_prefix = prefix

    ort.SessionOptions = Profiled  # type: ignore[misc]
    opts = DecoderOptions(n_ctx=args.prompt + args.steps + 16, n_threads=args.threads)
    if args.chunk:  # the graph `--backend ort` opens, with another prefill chunk
        graph = GraphOptions(
            capacity=opts.n_ctx, threads=opts.n_threads, precision=opts.precision, prefill_chunk=args.chunk
        )
        dec = GraphDecoder(open_gguf(resolve_model(args.model)), graph)
    else:
        dec = open_decoder("ort", resolve_model(args.model), "cpu", opts)
    ort.SessionOptions = base  # type: ignore[misc]
    prompt = list(range(100, 100 + args.prompt))
    dec.forward(prompt, last_only=True)
    runs_per_step = 1
    if args.prefill:
        runs_per_step = -(-args.prompt // dec.chunk)  # type: ignore[attr-defined]
    for _ in range(args.steps if args.prefill else 0):
        dec.reset()
        dec.forward(prompt, last_only=True)
    wall = 0.0
    for i in range(0 if args.prefill else args.steps):
        t0 = time.perf_counter()
        dec.forward([1000 + i + j for j in range(args.batch)], last_only=args.batch == 1)
        wall += time.perf_counter() - t0
        if args.batch > 1:
            dec.rollback(args.batch)
    events = json.loads(Path(dec.runner.session.end_profiling()).read_text())  # type: ignore[attr-defined]
    dec.close()
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    runs = runs[-args.steps * runs_per_step :]
    start = runs[0]["ts"]
    per_op: collections.Counter[str] = collections.Counter()
    per_node: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["ts"] >= start and e["name"].endswith("_kernel_time"):
            op = e["args"].get("op_name", "?")
            per_op[op] += e["dur"]
            # blk.3.ffn_down/... and blk.17.ffn_down/... are one row: the layers differ only in their types
            per_node[f"{op} {re.sub(r'[0-9]+', '#', e['name'].removesuffix('_kernel_time'))}"] += e["dur"]
    steps = len(runs) // runs_per_step
    step_ms = sum(r["dur"] for r in runs) / steps / 1e3
    what = f"{args.prompt}-token prompt" if args.prefill else f"{args.batch}-token forward"
    print(f"{args.model}: {what} {step_ms:.2f} ms (ORT model_run, mean of {steps}, profiler on)")
    if wall:
        wall_ms = wall / steps * 1e3
        print(f"  wall per forward {wall_ms:.2f} ms: {wall_ms - step_ms:.2f} ms outside ORT's run")
    for op, us in per_op.most_common(10):
        ms = us / steps / 1e3
        print(f"  {op:34} {ms:7.3f} ms/step  {100 * ms / step_ms:5.1f}%")
    for node, us in per_node.most_common(args.nodes):
        ms = us / steps / 1e3
        print(f"  {node[:70]:70} {ms:7.3f} ms/step  {100 * ms / step_ms:5.1f}%")


if __name__ == "__main__":
    main()
