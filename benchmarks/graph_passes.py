"""Decode and prefill speed of edge's graphs with vs without the graph_opt passes, per backend, in one run,
against llama.cpp on the same GGUF.

    python -m benchmarks.graph_passes                          # smollm2-135m, 3 rounds, 2 threads
    python -m benchmarks.graph_passes --model qwen2.5-coder-0.5b --rounds 5 --skip-int4

Variants (each an `edge convert` artifact; the unfused ones run the builder's graph with only folding):
    ort unfused / ort fused            --target ort [--no-fuse], weights as imported (Q4_1 blocks + block bias)
    ort fused, int8 activations        the same with MatMulNBits accuracy level 4 (llama.cpp also quantizes
                                       activations to 8 bits): the not-fp32-exact fast path
    ort fused, INT8 / INT4 re-quantized  --quant int8 (per channel) / int4 (g32, integer zero points): no
                                       block-bias nodes; accuracy level 4
    openvino unfused / fused           --target openvino [--no-fuse]
    llamacpp                           llama-cpp-python on the GGUF

Every (round, variant) runs in its own process, variants interleaved, so one noisy moment hits all of them;
the figures are medians over rounds of: prefill tok/s (one prompt of --prompt tokens), decode ms/token
(median step over --gen greedy tokens), and the process CPU time per decoded token. Writes
benchmarks/results/graph-passes-<model>-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.results_io import write_results

ROOT = Path(__file__).resolve().parents[1]


def _variants(skip_int4: bool) -> dict[str, dict[str, Any]]:
    v: dict[str, dict[str, Any]] = {
        "ort unfused": {"target": "ort", "fuse": False},
        "ort fused": {"target": "ort", "fuse": True},
        "ort fused, int8 act": {"target": "ort", "fuse": True, "accuracy_level": 4},
        "ort fused, int8 requant, int8 act": {
            "target": "ort",
            "fuse": True,
            "accuracy_level": 4,
            "quant": "int8",
        },
        "ort fused, int4 requant, int8 act": {
            "target": "ort",
            "fuse": True,
            "accuracy_level": 4,
            "quant": "int4",
        },
        "openvino unfused": {"target": "openvino", "fuse": False},
        "openvino fused": {"target": "openvino", "fuse": True},
    }
    if skip_int4:
        v.pop("ort fused, int4 requant, int8 act")
    return v


def _convert(model: str, spec: dict[str, Any], out: Path) -> dict[str, Any]:
    from edge.graph_opt import QuantSpec
    from edge.models.artifact import is_artifact
    from edge.models.convert import ConvertOptions, convert
    from edge.models.resolve import resolve_model

    if not is_artifact(out):
        opts = ConvertOptions(
            target=spec["target"],
            fuse=spec["fuse"],
            quant=QuantSpec(spec.get("quant", "keep")),
            accuracy_level=spec.get("accuracy_level"),
        )
        convert(resolve_model(model), out, opts, source_name=model)
    manifest = json.loads((out / "manifest.json").read_text())
    return {
        "nodes": manifest["passes"][-1]["nodes"][1],
        "weight_mib": manifest["passes"][-1]["weight_bytes"][1] / 2**20,
    }


def _child(args: argparse.Namespace) -> None:
    """One measurement in this process: prefill, then greedy decode; prints one JSON line."""
    from edge.devices.partitioned import PartitionedOptions, open_artifact_decoder
    from edge.devices.registry import DecoderOptions, open_decoder
    from edge.models.resolve import resolve_model

    prompt = np.random.default_rng(0).integers(100, 20000, args.prompt).tolist()
    if args.backend == "llamacpp":
        dec = open_decoder(
            "llamacpp", resolve_model(args.model), "cpu", DecoderOptions(n_ctx=1024, n_threads=args.threads)
        )
    else:
        dec = open_artifact_decoder(
            Path(args.artifact), args.backend, options=PartitionedOptions(capacity=1024, threads=args.threads)
        )
    dec.forward(prompt[:16], last_only=True)  # warm up (first-run allocations)
    dec.reset()
    t0 = time.perf_counter()
    logits = dec.forward(prompt, last_only=True)
    prefill = time.perf_counter() - t0
    steps, cpu0 = [], time.process_time()
    for _ in range(args.gen):
        tok = int(np.argmax(logits[-1]))
        t = time.perf_counter()
        logits = dec.forward([tok], last_only=True)
        steps.append(time.perf_counter() - t)
    cpu = (time.process_time() - cpu0) / args.gen
    dec.close()
    print(
        json.dumps(
            {
                "prefill_tok_s": args.prompt / prefill,
                "decode_ms": 1000 * float(np.median(steps)),
                "cpu_ms": 1000 * cpu,
            }
        )
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument(
        "--skip-int4", action="store_true", help="skip the INT4 re-quantized variant (its convert is slow)"
    )
    ap.add_argument("--work", type=Path, default=None, help="artifact directory (default: the edge cache)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--artifact", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return

    from edge.models.store import cache_dir

    work = args.work or cache_dir() / "bench-artifacts"
    work.mkdir(parents=True, exist_ok=True)
    variants = _variants(args.skip_int4)
    info: dict[str, dict[str, Any]] = {}
    for name, spec in variants.items():
        out = work / f"{args.model}-{name.replace(' ', '').replace(',', '-')}"
        print(f"converting: {name}", file=sys.stderr)
        info[name] = {**spec, **_convert(args.model, spec, out), "artifact": str(out)}
    info["llamacpp"] = {"target": "llamacpp"}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in info}
    for rnd in range(args.rounds):
        for name, meta in info.items():
            cmd = [sys.executable, "-m", "benchmarks.graph_passes", "--child", "--model", args.model,
                   "--threads", str(args.threads), "--prompt", str(args.prompt), "--gen", str(args.gen),
                   "--backend", meta["target"]]  # fmt: skip
            if "artifact" in meta:
                cmd += ["--artifact", meta["artifact"]]
            proc = subprocess.run(
                cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "ORT_LOGGING_LEVEL": "3"}
            )
            if proc.returncode:
                raise SystemExit(f"{name}: {proc.stderr[-2000:]}")
            results[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"round {rnd + 1} {name}: {results[name][-1]}", file=sys.stderr)

    def med(name: str, key: str) -> float:
        return float(np.median([r[key] for r in results[name]]))

    ref_decode = med("llamacpp", "decode_ms")
    ref_best = min(r["decode_ms"] for r in results["llamacpp"])
    rows = []
    for name, meta in info.items():
        rows.append(
            {
                "variant": name,
                "nodes": meta.get("nodes"),
                "weight_mib": round(meta["weight_mib"], 1) if "weight_mib" in meta else None,
                "prefill_tok_s": round(med(name, "prefill_tok_s"), 1),
                "decode_ms": round(med(name, "decode_ms"), 2),
                "decode_tok_s": round(1000 / med(name, "decode_ms"), 1),
                "cpu_ms_per_token": round(med(name, "cpu_ms"), 2),
                "decode_vs_llamacpp": round(ref_decode / med(name, "decode_ms"), 2),
                # the least-disturbed round: on a shared machine the minimum is the steadier figure
                "best_decode_ms": round(min(r["decode_ms"] for r in results[name]), 2),
                "best_prefill_tok_s": round(max(r["prefill_tok_s"] for r in results[name]), 1),
                "rounds": results[name],
            }
        )
    date = dt.date.today().isoformat()
    machine = (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {args.threads} threads used"
    )
    report = {
        "benchmark": "graph_passes",
        "date": date,
        "model": args.model,
        "machine": machine,
        "prompt_tokens": args.prompt,
        "gen_tokens": args.gen,
        "rounds": args.rounds,
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# graph_opt passes: {args.model}, {date}",
        "",
        f"`python -m benchmarks.graph_passes --model {args.model} --rounds {args.rounds}` on {machine}; "
        f"prompt {args.prompt} tokens, {args.gen} greedy tokens; medians over {args.rounds} interleaved rounds, "
        f"one process per measurement. Load average at the end: {', '.join(f'{x:.1f}' for x in os.getloadavg())}.",
        "",
        "| variant | nodes | weights MiB | prefill tok/s | decode ms/token | decode tok/s | CPU ms/token "
        "| decode vs llama.cpp | best round: prefill tok/s, decode ms, vs llama.cpp |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['variant']} | {r['nodes'] or '-'} | {r['weight_mib'] or '-'} | {r['prefill_tok_s']} | {r['decode_ms']} | "
            f"{r['decode_tok_s']} | {r['cpu_ms_per_token']} | {r['decode_vs_llamacpp']}x | "
            f"{r['best_prefill_tok_s']}, {r['best_decode_ms']}, {ref_best / r['best_decode_ms']:.2f}x |"
        )
    write_results(args.out / f"graph-passes-{args.model}-{date}", report, lines)


if __name__ == "__main__":
    main()
