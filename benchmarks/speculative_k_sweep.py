"""Prompt lookup on the edit-this-code prompt of benchmarks/speculative.py: adaptive k against fixed k, in one
process, wall clock, variants interleaved per round (the question: does the adaptive choice find the best k?).

    python benchmarks/speculative_k_sweep.py                      # 256 tokens, 2 rounds, k_max 16 and 32
    python benchmarks/speculative_k_sweep.py --tokens 128 --rounds 3

Prints one line per (round, variant): decode tok/s, ratio to the target alone in that round, acceptance,
mean k, and whether the tokens equal the target's own greedy tokens.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import speculative as bench  # the sibling benchmark: its prompt and its timed runner

from edge.api import load
from edge.drafters import NgramDrafter
from edge.generate import GenerationConfig
from edge.speculative import SpecConfig


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = load(bench.TARGET, backend="llamacpp", draft="none", n_ctx=4096, n_threads=args.threads)
    ids = model.prompt_ids(bench.EDIT_PROMPT)
    cfg = GenerationConfig(max_tokens=args.tokens)
    variants: dict[str, Any] = {
        "plain": None,
        "ngram adaptive (k_max 16)": (NgramDrafter(), SpecConfig()),
        "ngram adaptive (k_max 32)": (NgramDrafter(), SpecConfig(k_max=32)),
        "ngram k=15": (NgramDrafter(), SpecConfig(adaptive=False, k_max=15)),
        "ngram k=31": (NgramDrafter(), SpecConfig(adaptive=False, k_max=31)),
    }
    print(f"{bench.TARGET}, {len(ids)}-token edit prompt, {args.tokens} tokens, {args.threads} threads")
    for r in range(args.rounds):
        base: dict[str, Any] | None = None
        for name, v in variants.items():
            model.decoder.reset()
            model.session.invalidate()
            row = bench._generation_run(model, ids, cfg, v, time.perf_counter)()
            base = base or row
            d = row.get("draft") or {}
            print(
                f"round {r + 1} {name}: {row['decode_tok_s']:.1f} tok/s, "
                f"{row['decode_tok_s'] / base['decode_tok_s']:.2f}x, acceptance {d.get('acceptance_rate')}, "
                f"mean k {d.get('mean_k')}, same tokens {row['token_ids'] == base['token_ids']}",
                flush=True,
            )
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
