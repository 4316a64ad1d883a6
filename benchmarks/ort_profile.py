"""Where edge's ORT graph spends a decode step: ONNX Runtime's own profiler, per op type.

    python benchmarks/ort_profile.py qwen2.5-coder-0.5b
    python benchmarks/ort_profile.py smollm2-135m --prompt 128 --steps 64

Prefills a prompt, decodes `--steps` single tokens on the default ORT graph (the one `--backend ort` runs),
and reports the mean model_run time of the decode steps and each op type's kernel time per step.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime as ort  # noqa: E402

from edge.devices.registry import DecoderOptions, open_decoder  # noqa: E402
from edge.models.store import resolve_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
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
    dec = open_decoder("ort", resolve_model(args.model), "cpu", opts)
    ort.SessionOptions = base  # type: ignore[misc]
    dec.forward(list(range(100, 100 + args.prompt)), last_only=True)
    for i in range(args.steps):
        dec.forward([1000 + i + j for j in range(args.batch)], last_only=args.batch == 1)
        if args.batch > 1:
            dec.rollback(args.batch)
    events = json.loads(Path(dec.runner.session.end_profiling()).read_text())  # type: ignore[attr-defined]
    dec.close()
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"][-args.steps :]
    start = runs[0]["ts"]
    per_op: collections.Counter[str] = collections.Counter()
    per_node: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["ts"] >= start and e["name"].endswith("_kernel_time"):
            op = e["args"].get("op_name", "?")
            per_op[op] += e["dur"]
            # blk.3.ffn_down/... and blk.17.ffn_down/... are one row: the layers differ only in their types
            per_node[f"{op} {re.sub(r'[0-9]+', '#', e['name'].removesuffix('_kernel_time'))}"] += e["dur"]
    step_ms = sum(r["dur"] for r in runs) / len(runs) / 1e3
    print(
        f"{args.model}: {args.batch}-token forward {step_ms:.2f} ms (ORT model_run, mean of {len(runs)}, profiler on)"
    )
    for op, us in per_op.most_common(10):
        ms = us / len(runs) / 1e3
        print(f"  {op:34} {ms:7.3f} ms/step  {100 * ms / step_ms:5.1f}%")
    for node, us in per_node.most_common(args.nodes):
        ms = us / len(runs) / 1e3
        print(f"  {node[:70]:70} {ms:7.3f} ms/step  {100 * ms / step_ms:5.1f}%")


if __name__ == "__main__":
    main()
