"""What speculative decoding with a draft model can reach on this machine (issue 15's 1.6x target): the
measured cost model and the speedup it allows, one process.

    python benchmarks/spec_bound.py            # the recorded run (about 10 minutes on 2 cores, quiet)
    python benchmarks/spec_bound.py --quick

Measured in --repeat rounds (each cost once per round), medians: plain llama.cpp's decode step of the target (the baseline), the own
ORT graph's (--precision fast) decode step and verify forwards of k + 1 tokens (k = 1..15), the draft model's
decode step on the own ORT graph (a non-spinning session, as --draft uses it) and on llama.cpp. Acceptance:
the target's greedy answer to code-writing prompts is fed to the draft model in one forward, and the draft's
argmax compared with the target's token at every position: the per-token acceptance a of greedy drafting.

The model: a round drafts k tokens (k draft steps) and verifies them in one forward of k + 1 tokens; with
independent acceptance a it yields (1 - a^(k+1)) / (1 - a) tokens. Speedup vs llama.cpp = tokens per second
of the best k over llama.cpp's plain tokens per second; reported at the measured a and at a = 1 (every draft
right: the ceiling no drafting policy can beat). Drafting is never overlapped with verifying: on 2 cores both
are memory-bound and use both cores.
Writes benchmarks/results/spec-bound-<date>.json and .md.
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

from benchmarks.speculative_own import PROMPTS  # noqa: E402
from edge.api import load  # noqa: E402
from edge.devices.base import Decoder  # noqa: E402
from edge.devices.registry import DecoderOptions, open_decoder  # noqa: E402
from edge.generate import GenerationConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TARGET, DRAFT = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
KS = (1, 2, 4, 8, 15)  # k + 1 <= 16: what the ring can roll back (speculation keeps 1 of the k + 1)


def step_ms(dec: Decoder, prompt: list[int], n: int) -> float:
    """The mean one-token forward after `prompt`."""
    dec.reset()
    dec.forward(prompt, last_only=True)
    t = time.perf_counter()
    for i in range(n):
        dec.forward([prompt[i % len(prompt)]])
    return (time.perf_counter() - t) / n * 1e3


def verify_ms(dec: Decoder, prompt: list[int], k: int) -> float:
    """The median of 3 forwards of k + 1 tokens after `prompt` (each rolled back, as a rejected round is)."""
    dec.reset()
    dec.forward(prompt, last_only=True)
    runs = []
    for i in range(3):
        t = time.perf_counter()
        dec.forward(prompt[i : i + k + 1])
        runs.append((time.perf_counter() - t) * 1e3)
        dec.rollback(k + 1)
    return statistics.median(runs)


def tokens_per_round(a: float, k: int) -> float:
    return float(k + 1) if a >= 1.0 else (1 - a ** (k + 1)) / (1 - a)


def best(a: float, draft: float, target: float, verify: dict[int, float]) -> tuple[int, float]:
    """(k, tokens per second) maximising tokens per round over the round's time, k from the measured ones."""
    rates = {k: tokens_per_round(a, k) / ((k * draft + verify[k]) / 1e3) for k in verify}
    k = max(rates, key=rates.__getitem__)
    return k, rates[k]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    repeat, n_tokens = (2, 32) if args.quick else (args.repeat, args.tokens)
    prompts = PROMPTS["code"][:1] if args.quick else PROMPTS["code"]
    opts: dict[str, Any] = dict(n_ctx=2048, n_threads=2, draft="none")
    # acceptance: the draft's argmax along the target's own greedy answers
    target = load(TARGET, backend="ort", precision="fast", **opts)
    ids = target.prompt_ids(prompts[0])
    answers = [target.generate(text, GenerationConfig(max_tokens=n_tokens), reuse=False) for text in prompts]
    paths = {TARGET: target.path}
    target.close()
    draft = load(DRAFT, backend="ort", precision="fast", **opts)
    paths[DRAFT] = draft.path
    agree = total = 0
    for gen in answers:
        seq = list(gen.prompt_ids) + list(gen.token_ids)
        draft.decoder.reset()
        guess = draft.decoder.forward(seq[:-1])[len(gen.prompt_ids) - 1 :].argmax(axis=-1)
        agree += int(np.sum(guess == np.asarray(gen.token_ids)))
        total += len(gen.token_ids)
    draft.close()
    a = agree / total
    # costs, one engine at a time (another engine's threads in the process would slow it), each as speculation
    # runs it: the target's ORT session spinning, the draft's not (edge.drafters)
    samples: dict[str, list[float]] = {}
    verify_samples: dict[int, list[float]] = {k: [] for k in KS}
    for engine in ("llamacpp", "ort"):
        fast = dict(n_ctx=2048, n_threads=2, precision="fast")
        decs = {
            f"{engine}_target_ms": open_decoder(engine, paths[TARGET], "cpu", DecoderOptions(**fast)),  # type: ignore[arg-type]
            f"{engine}_draft_ms": open_decoder(
                engine, paths[DRAFT], "cpu", DecoderOptions(**fast, spin=False)
            ),  # type: ignore[arg-type]
        }
        for _ in range(repeat):  # each cost once per round: a load change hits all of them alike
            for name, dec in decs.items():
                samples.setdefault(name, []).append(step_ms(dec, ids, 24))
            if engine == "ort":
                for k in KS:
                    verify_samples[k].append(verify_ms(decs["ort_target_ms"], ids, k))
        for dec in decs.values():
            dec.close()
    costs = {name: statistics.median(v) for name, v in samples.items()}
    verify = {k: statistics.median(v) for k, v in verify_samples.items()}
    print(costs, verify, flush=True)
    base = 1e3 / costs["llamacpp_target_ms"]
    table = []
    for where, d_ms in (("ort", costs["ort_draft_ms"]), ("llamacpp", costs["llamacpp_draft_ms"])):
        for acc in (a, 1.0):
            k, rate = best(acc, d_ms, costs["ort_target_ms"], verify)
            table.append(
                {
                    "draft_on": where,
                    "acceptance": round(acc, 3),
                    "best_k": k,
                    "tok_s": round(rate, 2),
                    "x_llamacpp": round(rate / base, 3),
                }
            )
    day = dt.date.today().isoformat()
    load_avg = os.getloadavg()[0]
    out = {
        "costs_ms": costs,
        "verify_ms": verify,
        "acceptance": a,
        "positions": total,
        "table": table,
        "load_avg_1min_end": load_avg,
    }
    stem = RESULTS / f"spec-bound-{day}"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1))
    step = costs["ort_target_ms"]
    lines = [
        f"# What a draft model can give {TARGET} on this machine ({day})",
        "",
        f"`python benchmarks/spec_bound.py{' --quick' if args.quick else ''}`: {DRAFT} drafting for {TARGET}, "
        f"2 threads, own graphs at --precision fast; medians of {repeat} runs; load average at the end "
        f"{load_avg:.2f}.",
        "",
        "| cost | ms |",
        "|---|---|",
        *(f"| {name} | {ms:.1f} |" for name, ms in costs.items()),
        *(f"| ort verify of {k + 1} tokens | {ms:.1f} ({ms / step:.2f} steps) |" for k, ms in verify.items()),
        "",
        f"Greedy acceptance of the draft along the target's answers to {len(prompts)} code prompt(s): "
        f"a = {a:.3f} over {total} positions.",
        "",
        "| draft on | acceptance | best k | tok/s | x plain llama.cpp |",
        "|---|---|---|---|---|",
        *(
            f"| {r['draft_on']} | {r['acceptance']} | {r['best_k']} | {r['tok_s']} | {r['x_llamacpp']:.2f} |"
            for r in table
        ),
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
