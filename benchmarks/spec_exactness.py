"""Does speculative decoding change greedy output on the own graphs? Same model, same prompts, `--draft auto`'s
drafters vs no draft, at both precisions; counts identical answers and where the others first differ. (This
is why auto drafts greedy generations only where the decoder is batch-invariant or at --precision exact.)

    python -m benchmarks.spec_exactness                       # qwen2.5-coder-0.5b and smollm2-135m on ort
    python -m benchmarks.spec_exactness --models qwen2.5-coder-1.5b --backend openvino --tokens 96

Why answers can differ at all: a verify forward of k + 1 tokens and k + 1 single-token steps compute the same
sums in a different order in some kernels (the attention's GEMMs), so logits differ in the last bits; at
--precision fast those bits move an activation across an int8 rounding boundary now and then, and the
difference grows to the size of the quantization noise. Where the top two tokens are closer than that, the
choice flips. (ORT's MatMulNBits at accuracy level 4 itself gives bit-identical rows for 1 or 16 tokens.)
Writes benchmarks/results/spec-exactness-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from benchmarks.sample_code import CODE
from edge.api import load
from edge.generate import GenerationConfig
from edge.speculative import SpeculativeDecoding

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with a docstring.",
    "Write a Python function that parses an ISO 8601 date string into a datetime object.",
    "Explain what a hash map is in three sentences.",
    "Write a bash script that counts the lines of every .py file in a folder.",
    "What is the difference between a list and a tuple in Python?",
    f"Add type hints to this code and return the whole code:\n\n{CODE}",
    f"Rename the function total to column_sum everywhere in this code:\n\n{CODE}",
    f"Add a docstring to every function in this code:\n\n{CODE}",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Tell me a short story about a robot who learns to paint.",
    "List five prime numbers and explain why each is prime.",
    "Write a JavaScript function that debounces another function.",
]


def run(model: str, backend: str, precision: str, tokens: int) -> tuple[bool, list[dict[str, Any]]]:
    """(whether the decoder claims batch invariance, per prompt the comparison)."""
    cfg = GenerationConfig(max_tokens=tokens)  # greedy (GenerationConfig's default temperature is 0)
    out = []
    with load(model, backend=backend, precision=precision, n_ctx=2048, draft="auto") as m:
        assert m.speculative is not None, f"--draft auto gave no drafter for {model} on {backend}"
        invariant = m.decoder.capabilities().batch_invariant
        # auto's drafters, drafting greedy generations too (auto itself does not where it could change them)
        spec = SpeculativeDecoding(m.decoder, m.speculative.drafters, m.speculative.config)
        for prompt in PROMPTS:
            m.speculative = spec
            drafted = m.generate(prompt, cfg, reuse=False)
            m.speculative = None
            plain = m.generate(prompt, cfg, reuse=False)
            a, b = drafted.token_ids, plain.token_ids
            first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
            if first is None and len(a) != len(b):
                first = min(len(a), len(b))
            st = drafted.stats.draft
            out.append(
                {
                    "prompt": prompt[:60],
                    "identical": first is None,
                    "first_difference": first,
                    "tokens": len(b),
                    "draft": None if st is None else st.to_dict(),
                }
            )
            print(f"  {model} {backend} {precision}: {'same' if first is None else f'differs at {first}'}")
        m.speculative = spec
    return invariant, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-coder-0.5b", "smollm2-135m"])
    ap.add_argument("--backend", default="ort")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--tag", default="", help="appended to the result files' names")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for model in args.models:
        for precision in ("exact", "fast"):
            invariant, res = run(model, args.backend, precision, args.tokens)
            same = sum(r["identical"] for r in res)
            rows.append({"model": model, "backend": args.backend, "precision": precision, "same": same,
                         "prompts": len(res), "batch_invariant": invariant, "results": res})  # fmt: skip
    day = dt.date.today().isoformat()
    stem = RESULTS / f"spec-exactness-{args.backend}-{day}{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        f"# Greedy output with `--draft auto` vs no draft ({day})",
        "",
        f"`python -m benchmarks.spec_exactness --models {' '.join(args.models)} --backend {args.backend} "
        f"--tokens {args.tokens}{' --tag=' + args.tag if args.tag else ''}`; {len(PROMPTS)} prompts (code, edits, chat), greedy, {args.tokens} tokens.",
        "",
        "| model | backend | precision | batch-invariant | identical answers | first differences (token index) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        diffs = [x["first_difference"] for x in r["results"] if not x["identical"]]
        lines.append(
            f"| {r['model']} | {r['backend']} | {r['precision']} | {r['batch_invariant']} | "
            f"{r['same']}/{r['prompts']} | "
            f"{', '.join(map(str, diffs)) or '-'} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
