"""Speculative decoding on edge's own graphs vs plain llama.cpp (issue 15's "Done when"), one process:
qwen2.5-coder-1.5b on `--backend ort --precision fast`, plain and with prompt lookup, the 0.5b draft (on ort)
and `--draft auto`, against llama.cpp's plain decode of the same prompts.

    python -m benchmarks.speculative_own              # the recorded run (about 15 minutes on 2 cores, quiet)
    python -m benchmarks.speculative_own --quick      # one round, one prompt per kind, 48 tokens

Prompts of three kinds: code writing (the draft model's case), edits of given code (prompt lookup's case),
and chit-chat (drafts mostly rejected: auto must not cost more than 5% there). Greedy, up to --tokens tokens;
the variants take turns in a different order each round; decode tok/s medians over the rounds. Every
variant's tokens are compared with the same backend's plain output ("same").
Writes benchmarks/results/speculative-own-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
from pathlib import Path
from typing import Any

from benchmarks.sample_code import CODE_LONGER
from edge.api import load
from edge.drafters import open_drafters
from edge.generate import GenerationConfig
from edge.model import Model
from edge.speculative import SpecConfig, SpeculativeDecoding

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "benchmarks" / "results"
TARGET = "qwen2.5-coder-1.5b"
PROMPTS = {
    "code": [
        "Write a Python function that parses an ISO 8601 date string into a datetime object without using "
        "any libraries, with a docstring and three examples.",
        "Write a Python class for a least-recently-used cache with get and put methods and type hints.",
        "Write a Python function that merges overlapping intervals in a list, with a docstring.",
    ],
    "edit": [
        f"Rename the function total to column_sum everywhere in this code and return the whole code:\n\n{CODE_LONGER}",
        f"Add type hints to every function in this code and return the whole code:\n\n{CODE_LONGER}",
    ],
    "chat": [
        "Tell me a short story about a lighthouse keeper and a storm.",
        "What are three good habits for staying focused while studying? Answer in prose.",
    ],
}


def variants(m: Model) -> dict[str, SpeculativeDecoding | None]:
    out: dict[str, SpeculativeDecoding | None] = {"none": None}
    for spec in ("ngram", "qwen2.5-coder-0.5b", "auto"):
        drafters = open_drafters(
            spec,
            m.tokenizer,
            TARGET,
            m.decoder.vocab_size,
            target_backend="ort",
            target_path=m.path,
            device="ort:cpu",
            n_ctx=2048,
            n_threads=m.options.n_threads,
        )
        out[spec] = SpeculativeDecoding(m.decoder, drafters, SpecConfig())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--kinds", nargs="+", choices=sorted(PROMPTS), default=list(PROMPTS))
    ap.add_argument("--tag", default="", help="appended to the result files' names")
    args = ap.parse_args()
    chosen = {k: v for k, v in PROMPTS.items() if k in args.kinds}
    prompts = {k: v[:1] for k, v in chosen.items()} if args.quick else chosen
    rounds, tokens = (1, 48) if args.quick else (args.rounds, args.tokens)
    cfg = GenerationConfig(max_tokens=tokens)  # greedy
    opts = dict(n_ctx=2048, n_threads=2, draft="none")
    llama = load(TARGET, backend="llamacpp", **opts)  # type: ignore[arg-type]
    own = load(TARGET, backend="ort", precision="fast", **opts)  # type: ignore[arg-type]
    decodings = variants(own)
    names = ["llamacpp", *(f"ort {v}" for v in decodings)]
    rates: dict[tuple[str, str], list[float]] = {}
    same: dict[tuple[str, str], bool] = {}
    stats: dict[tuple[str, str], Any] = {}
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        for kind, texts in prompts.items():
            for i, text in enumerate(texts):
                key_prompt = f"{kind}{i}"
                plain_ids = None
                for name in order:
                    if name == "llamacpp":
                        gen = llama.generate(text, cfg, reuse=False)
                    else:
                        own.speculative = decodings[name.split(" ", 1)[1]]
                        gen = own.generate(text, cfg, reuse=False)
                        own.speculative = None
                    rates.setdefault((name, key_prompt), []).append(gen.stats.decode_tok_s)
                    ids = gen.token_ids
                    if name == "ort none":
                        plain_ids = ids
                    stats[(name, key_prompt)] = (ids, gen.stats.draft.to_dict() if gen.stats.draft else None)
                    print(
                        f"round {r} {key_prompt:6} {name:24} {gen.stats.decode_tok_s:7.1f} tok/s", flush=True
                    )
                for name in names:
                    if name.startswith("ort"):
                        same[(name, key_prompt)] = stats[(name, key_prompt)][0] == plain_ids
    llama.close()
    own.close()
    rows = []
    for kind, texts in prompts.items():
        keys = [f"{kind}{i}" for i in range(len(texts))]
        base = statistics.median(statistics.median(rates[("llamacpp", k)]) for k in keys)
        plain = statistics.median(statistics.median(rates[("ort none", k)]) for k in keys)
        for name in names:
            tok_s = statistics.median(statistics.median(rates[(name, k)]) for k in keys)
            row = {
                "kind": kind,
                "variant": name,
                "decode_tok_s": round(tok_s, 2),
                "x_llamacpp": round(tok_s / base, 3),
                "x_ort_none": round(tok_s / plain, 3),
                "same_as_ort_none": None if name == "llamacpp" else all(same[(name, k)] for k in keys),
                "draft": [stats[(name, k)][1] for k in keys],
            }
            rows.append(row)
    day = dt.date.today().isoformat()
    load_avg = os.getloadavg()[0]
    stem = RESULTS / f"speculative-own-{day}{args.tag}"
    stem.with_suffix(".json").write_text(json.dumps({"rows": rows, "load_avg_1min_end": load_avg}, indent=1))
    lines = [
        f"# Speculative decoding on edge's own ORT graph vs llama.cpp, {TARGET} ({day})",
        "",
        f"`python -m benchmarks.speculative_own{' --quick' if args.quick else ''}"
        f"{'' if set(args.kinds) == set(PROMPTS) else ' --kinds ' + ' '.join(args.kinds)}"
        f"{' --tag=' + args.tag if args.tag else ''} --rounds {rounds}`: greedy, up to {tokens} tokens, "
        f"{rounds} round(s), 2 threads, --precision fast; decode tok/s medians; load average at the end "
        f"{load_avg:.2f}.",
        "",
        "| prompts | variant | decode tok/s | x llama.cpp | x ort plain | same tokens as ort plain |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['kind']} | {row['variant']} | {row['decode_tok_s']} | {row['x_llamacpp']:.2f} | "
            f"{row['x_ort_none']:.2f} | {'-' if row['same_as_ort_none'] is None else row['same_as_ort_none']} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
