"""The fast-graphs figures: edge's own graphs at --precision fast against llama.cpp (and OpenVINO GenAI where it
loads the file), and the fidelity guard, per catalog model; writes results/fast-graphs-<date>.json and .md.

    python -m benchmarks.fast_graphs                                   # all four models, 3 rounds
    python -m benchmarks.fast_graphs --models qwen2.5-coder-1.5b --repeat 5

Speed: one `edge bench` process per model (backends interleaved per round; a 512-token prompt, the first after
load and a warm one; 128 greedy tokens; the cost of a k-token forward in decode steps).
Fidelity (decode path, one token per forward): `edge eval M --backend B --reference B --reference-precision
exact --test-chunk 1` for B in ort, openvino against `edge eval M --backend llamacpp --reference B ...`:
edge fast must be no further from the exact graph than llama.cpp is.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.results_io import write_results

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
# OpenVINO GenAI's GGUF reader takes F16/Q4_0/Q4_1/Q4_K/Q6_K/Q8_0 only (not the 0.5b's Q5_0, not gemma3)
GENAI_LOADS = ("smollm2-135m", "qwen2.5-coder-1.5b")


def edge(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "edge.cli", *args]
    print("$ edge " + " ".join(args), file=sys.stderr, flush=True)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)


def bench(model: str, args: argparse.Namespace) -> dict[str, Any]:
    backends = "llamacpp,ort,openvino" + (",openvino-genai" if model in GENAI_LOADS and args.genai else "")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        edge(
            "bench", model, "--backends", backends, "--repeat", str(args.repeat),
            "--prompt-tokens", str(args.prompt_tokens), "--gen-tokens", str(args.gen_tokens),
            "--json", str(out),
        )  # fmt: skip
        return json.loads(out.read_text())


def fidelity(model: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    base = ("eval", model, "--tokens", str(args.eval_tokens), "--test-chunk", "1", "--json")
    for b in ("ort", "openvino"):
        ref = ("--reference", b, "--reference-precision", "exact")
        fast = json.loads(edge(*base, "--backend", b, "--precision", "fast", *ref).stdout)
        llama = json.loads(edge(*base, "--backend", "llamacpp", *ref).stdout)
        out[b] = {
            "edge_fast_kl": fast["kl_mean"],
            "edge_fast_top1": fast["top1_agree"],
            "llamacpp_kl": llama["kl_mean"],
            "llamacpp_top1": llama["top1_agree"],
            "ok": fast["kl_mean"] <= llama["kl_mean"],
        }
    return out


def markdown(runs: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [
        f"# Own graphs at --precision fast vs llama.cpp ({dt.date.today()})",
        "",
        f"`python -m benchmarks.fast_graphs --repeat {args.repeat}`; prompt {args.prompt_tokens} tokens, "
        f"{args.gen_tokens} greedy tokens, medians of {args.repeat} interleaved rounds, 2 threads. "
        "Prefill: the first prompt after load / a warm one. k=8: a forward of 8 tokens in decode steps.",
        "",
        "| model | backend | prefill first | prefill warm | decode tok/s | x llama.cpp decode | x prefill first "
        "| x prefill warm | k=8 cost | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, run in runs.items():
        rep = run["bench"]
        load = rep["machine"].get("load_avg_1m", {})
        for r in rep["results"]:
            k8 = r.get("batch_cost_steps", {}).get("8")
            lines.append(
                f"| {model} | {r['backend']} | {r['prefill_tok_s']:.0f} | {r['prefill_warm_tok_s']:.0f} | "
                f"{r['decode_tok_s']:.1f} | {r['ratio_decode']:.2f} | {r['ratio_prefill']:.2f} | "
                f"{r['ratio_prefill_warm']:.2f} | {'-' if k8 is None else f'{k8:.2f}'} | {r['peak_rss_mb']:.0f} |"
            )
        lines.append(f"| | load average 1 min: {load.get('start')} -> {load.get('end')} | | | | | | | | |")
    lines += [
        "",
        "## Fidelity (decode path, KL to the same backend's exact graph)",
        "",
        "| model | backend | edge fast KL | top-1 | llama.cpp KL | top-1 | fast no further |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, run in runs.items():
        for b, f in run.get("fidelity", {}).items():
            lines.append(
                f"| {model} | {b} | {f['edge_fast_kl']:.5f} | {100 * f['edge_fast_top1']:.1f}% | "
                f"{f['llamacpp_kl']:.5f} | {100 * f['llamacpp_top1']:.1f}% | {'yes' if f['ok'] else 'NO'} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--eval-tokens", type=int, default=512)
    ap.add_argument("--no-genai", dest="genai", action="store_false", help="leave OpenVINO GenAI out")
    ap.add_argument("--no-fidelity", dest="fidelity", action="store_false")
    ap.add_argument("--tag", default="", help="suffix of the result files")
    args = ap.parse_args()
    runs: dict[str, Any] = {}
    for model in args.models.split(","):
        runs[model] = {"bench": bench(model, args)}
        if args.fidelity:
            runs[model]["fidelity"] = fidelity(model, args)
    write_results(
        RESULTS / f"fast-graphs-{dt.date.today()}{args.tag}", runs, markdown(runs, args).splitlines()
    )


if __name__ == "__main__":
    main()
