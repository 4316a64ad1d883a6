"""Which catalog instruct model answers plain factual questions right, at `edge run`'s default sampling:
how the default model is chosen (the smallest download that answers most of them right).

    python benchmarks/default_model.py                 # every catalog instruct model, seeds 0..2
    python benchmarks/default_model.py --models smollm2-135m --seeds 5

Writes results/default-model-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import edge  # noqa: E402
from edge.models.catalog import CATALOG  # noqa: E402
from tests.factual_questions import QUESTIONS, is_right  # noqa: E402

# `edge run`'s defaults (edge/cli.py)
SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
INSTRUCT = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")  # gemma3-270m is a base model


def score(model: str, seeds: int, max_tokens: int) -> dict[str, object]:
    rows = []
    t0 = time.perf_counter()
    with edge.load(model) as m:
        backend = m.backend
        for q, keys in QUESTIONS:
            for seed in range(seeds):
                text = m.generate(q, max_tokens=max_tokens, seed=seed, reuse=False, **SAMPLING).text
                rows.append({"question": q, "seed": seed, "right": is_right(text, keys), "answer": text})
    right = sum(r["right"] for r in rows)
    return {
        "model": model,
        "backend": backend,  # what --backend auto ran it on (edge run's default)
        "right": right,
        "asked": len(rows),
        "seconds": time.perf_counter() - t0,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(INSTRUCT))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    runs = [score(m, args.seeds, args.max_tokens) for m in args.models.split(",")]
    stem = ROOT / "benchmarks" / "results" / f"default-model-{dt.date.today()}"
    stem.with_suffix(".json").write_text(json.dumps(runs, indent=1) + "\n")
    lines = [
        f"# Factual questions per catalog instruct model ({dt.date.today()})",
        "",
        f"`python benchmarks/default_model.py --seeds {args.seeds}`: {len(QUESTIONS)} questions x {args.seeds} "
        f"seeds at edge run's default sampling ({SAMPLING}), {args.max_tokens} tokens at most, llama.cpp.",
        "",
        "| model | download MB | right | share |",
        "|---|---|---|---|",
    ]
    for r in runs:
        mb = CATALOG[str(r["model"])].size / 1e6
        lines.append(
            f"| {r['model']} | {mb:.0f} | {r['right']}/{r['asked']} | {r['right'] / r['asked']:.0%} |"
        )  # type: ignore[operator]
    lines += ["", "Wrong answers:", ""]
    for r in runs:
        for row in r["rows"]:  # type: ignore[attr-defined]
            if not row["right"]:
                answer = " ".join(row["answer"].split())[:160]
                lines.append(f"- {r['model']} (seed {row['seed']}): {row['question']} -> {answer}")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[: 6 + len(runs)]))


if __name__ == "__main__":
    main()
