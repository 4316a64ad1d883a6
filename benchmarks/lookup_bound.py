"""What prompt lookup can reach on edit prompts on this machine (issue 15's 2.5x target), one process.

    python benchmarks/lookup_bound.py            # the recorded run (about 10 minutes on 2 cores, quiet)
    python benchmarks/lookup_bound.py --quick

qwen2.5-coder-1.5b on its own ORT graph (--precision fast) answers edit prompts greedily (whole answers, up to
--tokens). Measured, medians of --repeat rounds: plain llama.cpp's decode step (the baseline), the own graph's
decode step and its forwards of n = 2..16 tokens (17 extrapolated) at a window start (one staged forward each). Then each answer
is replayed with those costs (a forward cut at a window end costs its pieces, as on the staged graph):
- policy: edge's own NgramDrafter and AdaptiveK, as `--draft ngram` runs them;
- lookup oracle: the same lookups, each cut to exactly the tokens the target keeps (at most 16): no policy
  choosing k can do better with what lookup proposes;
- perfect drafter: every round drafts the answer's own next tokens up to the window end (at most 16): no drafter at all can
  do better on this graph.
Tokens per second of each over plain llama.cpp's: the ceiling of prompt lookup here.
Writes benchmarks/results/lookup-bound-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.sample_code import CODE_LONGER  # noqa: E402
from benchmarks.spec_bound import step_ms, verify_ms  # noqa: E402
from benchmarks.speculative_own import PROMPTS  # noqa: E402
from edge.api import load  # noqa: E402
from edge.devices.registry import DecoderOptions, open_decoder  # noqa: E402
from edge.drafters import NgramDrafter  # noqa: E402
from edge.generate import GenerationConfig  # noqa: E402
from edge.kvcache.staging import WINDOW, piece_sizes, window_end  # noqa: E402
from edge.sampling import SamplingConfig  # noqa: E402
from edge.speculative import AdaptiveK, SpecConfig  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TARGET = "qwen2.5-coder-1.5b"
EDITS = [
    *PROMPTS["edit"],
    f"Add a docstring to every function in this code and return the whole code:\n\n{CODE_LONGER}",
    f"Rename the variable rows to records everywhere in this code and return the whole code:\n\n{CODE_LONGER}",
]

# speculation verifies k + 1 <= 17 tokens: k <= the ring's rollback limit (16 by default; a limit of 32 or more
# gives up batch invariance, devices/graph_decoder.py)
MAX_FORWARD = 17
Chooser = Callable[[list[int], int, int], int]  # (drafted tokens, kind, position) -> k


def replay(prompt: list[int], answer: list[int], cost: Callable[[int, int], float], choose: Chooser) -> float:
    """Seconds the answer takes when each round drafts by lookup and keeps `choose`'s k."""
    drafter, rng, greedy = NgramDrafter(), np.random.default_rng(0), SamplingConfig()
    drafter.begin(prompt)
    history, i, seconds = list(prompt), 0, 0.0
    while i < len(answer):
        position = len(history) - 1  # the last token is not in the KV cache yet
        limit = min(MAX_FORWARD - 1, len(answer) - i - 1)
        draft = drafter.draft(history, limit, greedy, rng) if limit > 0 else None
        k = choose(draft.tokens, draft.kind, position) if draft is not None and draft.tokens else 0
        kept = 0
        while kept < k and draft is not None and draft.tokens[kept] == answer[i + kept]:
            kept += 1
        seconds += cost(position, k + 1)
        history += answer[i : i + kept + 1]
        i += kept + 1
    return seconds


def right_tokens(prompt: list[int], answer: list[int]) -> Chooser:
    """The lookup oracle: k = how many of the drafted tokens the target keeps."""

    def choose(tokens: Sequence[int], kind: int, position: int) -> int:
        i, k = position + 1 - len(prompt), 0
        while k < len(tokens) and tokens[k] == answer[i + k]:
            k += 1
        return k

    return choose


def perfect(answer: list[int], start: int, cost: Callable[[int, int], float]) -> float:
    """Seconds the answer takes when every round's draft is right and fills the window."""
    i, seconds = 0, 0.0
    while i < len(answer):
        position = start + i - 1
        n = min(window_end(position) - position, MAX_FORWARD, len(answer) - i)
        seconds += cost(position, n)
        i += n
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    repeat, n_tokens = (1, 48) if args.quick else (args.repeat, args.tokens)
    prompts = EDITS[:1] if args.quick else EDITS
    opts: dict[str, Any] = dict(n_ctx=2048, n_threads=2)
    target = load(TARGET, backend="ort", precision="fast", draft="ngram", **opts)  # the same tokens, sooner
    answers = [target.generate(t, GenerationConfig(max_tokens=n_tokens), reuse=False) for t in prompts]
    path = target.path
    ids = target.prompt_ids(prompts[0])
    target.close()
    ids = ids[: len(ids) // WINDOW * WINDOW]  # forwards measured at a window start: one piece each
    sizes = range(1, MAX_FORWARD)  # a forward is rolled back whole: at most max_rollback (16) tokens
    samples: dict[str, list[float]] = {"llamacpp_step_ms": []}
    forward_samples: dict[int, list[float]] = {n: [] for n in sizes}
    fast = dict(n_ctx=2048, n_threads=2, precision="fast")
    llama = open_decoder("llamacpp", path, "cpu", DecoderOptions(**fast))  # type: ignore[arg-type]
    for _ in range(repeat):
        samples["llamacpp_step_ms"].append(step_ms(llama, ids, 24))
    llama.close()
    own = open_decoder("ort", path, "cpu", DecoderOptions(**fast))  # type: ignore[arg-type]
    for _ in range(repeat):
        forward_samples[1].append(step_ms(own, ids, 24))
        for n in sizes[1:]:
            forward_samples[n].append(verify_ms(own, ids, n - 1))
    own.close()
    llama_ms = statistics.median(samples["llamacpp_step_ms"])
    forward_ms = {n: statistics.median(v) for n, v in forward_samples.items()}
    forward_ms[MAX_FORWARD] = 2 * forward_ms[MAX_FORWARD - 1] - forward_ms[MAX_FORWARD - 2]  # extrapolated

    def cost(position: int, n: int) -> float:
        return sum(forward_ms[size] for size in piece_sizes(position, n)) / 1e3

    chooser = AdaptiveK(SpecConfig(), pieces=piece_sizes)
    for n, ms in forward_ms.items():
        chooser.observe_forward(n, ms / 1e3)
    chooser.observe_draft(1, 2e-5)  # lookup: ~0.02 ms a token (DraftStats.draft_ms_per_token)

    def policy(tokens: Sequence[int], kind: int, position: int) -> int:
        return chooser.choose(len(tokens), kind, position, 1)

    rows = []
    for text, gen in zip(prompts, answers, strict=True):
        prompt, answer = list(gen.prompt_ids), list(gen.token_ids)
        chooser.new_generation()
        kept: dict[str, float] = {}

        oracle = right_tokens(prompt, answer)

        def observed(tokens: Sequence[int], kind: int, position: int, oracle: Chooser = oracle) -> int:
            k = policy(tokens, kind, position)
            chooser.observe_round(
                k, oracle(tokens[:k], kind, position), kind
            ) if k else chooser.observe_plain_step()
            return k

        kept["policy"] = replay(prompt, answer, cost, observed)
        kept["oracle"] = replay(prompt, answer, cost, oracle)
        kept["perfect"] = perfect(answer, len(prompt), cost)
        plain = len(answer) * forward_ms[1] / 1e3
        row: dict[str, Any] = {"prompt": text.split("\n", 1)[0], "tokens": len(answer)}
        for name, seconds in (("plain", plain), *kept.items()):
            rate = len(answer) / seconds
            row[name] = {"tok_s": round(rate, 2), "x_llamacpp": round(rate * llama_ms / 1e3, 3)}
        rows.append(row)
        print(row, flush=True)
    day = dt.date.today().isoformat()
    load_avg = os.getloadavg()[0]
    out = {
        "llamacpp_step_ms": llama_ms,
        "forward_ms": forward_ms,
        "rows": rows,
        "load_avg_1min_end": load_avg,
    }
    stem = RESULTS / f"lookup-bound-{day}"
    stem.with_suffix(".json").write_text(json.dumps(out, indent=1))
    step = forward_ms[1]
    lines = [
        f"# What prompt lookup can give {TARGET} on edit prompts on this machine ({day})",
        "",
        f"`python benchmarks/lookup_bound.py{' --quick' if args.quick else ''}`: greedy answers of up to "
        f"{n_tokens} tokens on the own ORT graph (--precision fast), 2 threads; costs are medians of {repeat} "
        f"rounds; load average at the end {load_avg:.2f}.",
        "",
        f"Plain llama.cpp decode step: {llama_ms:.1f} ms. Own graph: one token {step:.1f} ms; a forward of n "
        "tokens at a window start, in decode steps: "
        + ", ".join(f"{n}: {ms / step:.2f}" for n, ms in forward_ms.items() if n in (2, 4, 8, 12, 17))
        + ".",
        "",
        "x plain llama.cpp decode (tok/s):",
        "",
        "| prompt | tokens | own plain | policy (edge's lookup) | lookup oracle | perfect drafter |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['prompt'][:60]} | {r['tokens']} | "
            + " | ".join(
                f"{r[c]['x_llamacpp']:.2f} ({r[c]['tok_s']:.1f})"
                for c in ("plain", "policy", "oracle", "perfect")
            )
            + " |"
            for r in rows
        ),
    ]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
