"""What staged attention (the batch-invariant graph, kvcache/staging.py) costs: ORT --precision fast, staged
vs unstaged graph of the same model in one process, decode steps and verify forwards, interleaved rounds.

    python benchmarks/staged_cost.py                                   # the catalog's 1.5b and smollm2
    python benchmarks/staged_cost.py --models qwen2.5-coder-0.5b --context 1000

Per round and graph: prefill a --context token prompt, 48 one-token decode steps (ms each), then 6 verify
forwards of 5 tokens (each rolled back). Medians over --rounds; the graphs take turns in alternating order,
their ORT threads not spinning between runs (so neither slows the other).
Writes benchmarks/results/staged-cost-<date>.json and .md.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge.devices.graph_decoder import GraphDecoder, GraphOptions  # noqa: E402
from edge.models.catalog import CATALOG  # noqa: E402
from edge.models.gguf_file import open_gguf  # noqa: E402
from edge.models.pull import pull  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def measure(dec: GraphDecoder, prompt: list[int], rng: np.random.Generator) -> tuple[float, float]:
    dec.reset()
    dec.forward(prompt, last_only=True)
    token = int(rng.integers(100, 5000))
    t = time.perf_counter()
    for _ in range(48):
        dec.forward([token])
    step = (time.perf_counter() - t) / 48 * 1e3
    t = time.perf_counter()
    for _ in range(6):
        dec.forward([token] * 5)
        dec.rollback(5)
    return step, (time.perf_counter() - t) / 6 * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-1.5b", "smollm2-135m"])
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for model in args.models:
        gguf = open_gguf(pull(CATALOG[model]) if model in CATALOG else Path(model))
        decs = {
            staged: GraphDecoder(
                gguf, GraphOptions(backend="ort", precision="fast", staged=staged, threads=2)
            )
            for staged in (False, True)
        }
        rng = np.random.default_rng(0)
        prompt = [int(t) for t in rng.integers(100, 5000, args.context)]
        got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for r in range(args.rounds):
            for staged in (False, True) if r % 2 == 0 else (True, False):
                got[staged].append(measure(decs[staged], prompt, rng))
        for d in decs.values():
            d.close()
        med = {
            s: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v))
            for s, v in got.items()
        }
        rows.append(
            {
                "model": model,
                "context": args.context,
                "decode_ms": {"unstaged": round(med[False][0], 2), "staged": round(med[True][0], 2)},
                "verify5_ms": {"unstaged": round(med[False][1], 2), "staged": round(med[True][1], 2)},
                "decode_ratio": round(med[True][0] / med[False][0], 3),
                "verify5_ratio": round(med[True][1] / med[False][1], 3),
            }
        )
        print(rows[-1], flush=True)
    day = dt.date.today().isoformat()
    load_avg = os.getloadavg()[0]
    stem = RESULTS / f"staged-cost-{day}"
    stem.with_suffix(".json").write_text(json.dumps({"rows": rows, "load_avg_1min_end": load_avg}, indent=1))
    lines = [
        f"# Staged (batch-invariant) vs unstaged ORT graph, --precision fast ({day})",
        "",
        f"`python benchmarks/staged_cost.py --models {' '.join(args.models)} --context {args.context} "
        f"--rounds {args.rounds}`: 2 threads, medians of {args.rounds} interleaved rounds; load average at the "
        f"end {load_avg:.2f}.",
        "",
        "| model | context | decode ms unstaged | staged | ratio | verify of 5 ms unstaged | staged | ratio |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['model']} | {r['context']} | {r['decode_ms']['unstaged']} | {r['decode_ms']['staged']} | "
            f"{r['decode_ratio']:.3f} | {r['verify5_ms']['unstaged']} | {r['verify5_ms']['staged']} | "
            f"{r['verify5_ratio']:.3f} |"
            for r in rows
        ),
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
