"""Which catalog chat model answers everyday questions right (tests/data/default_model_questions.json: facts,
arithmetic, short instructions, translation, small code tasks): how the default model is chosen. The rule
(tests/factual_questions.py `choose_default`): the smallest download that answers at least 90% right over every
run: greedy once (deterministic, so one run is its result) and at edge run's default sampling (temperature 0.7,
edge/cli.py) for each seed. gemma3-270m is excluded: a base model (no chat template) continues text rather
than answering, so it cannot be `edge run`'s default.

    python -m benchmarks.default_model                          # the three chat models, greedy + seeds 0..2
    python -m benchmarks.default_model --models smollm2-135m --seeds 0

Runs on llama.cpp (no graph build, the fastest load), one model at a time. Writes
results/default-model-<date>.json after each answer; run again, it resumes the runs that file holds unfinished.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path

import edge
from edge.models.catalog import CATALOG
from tests.factual_questions import QUESTIONS, choose_default, is_right, tally

ROOT = Path(__file__).resolve().parents[1]

# edge run's default sampling (edge/cli.py); greedy is temperature 0 with the same filters
SAMPLING = {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
CHAT_MODELS = ("smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")  # gemma3-270m: a base model


def one_run(
    m: edge.Model, seed: int | None, max_tokens: int, run: dict, save: Callable[[], None], every: int = 1
) -> None:
    """Every `every`-th question `run` has not answered yet: greedy when seed is None, else at the default
    sampling with that seed; `save` after each answer (an interrupted run keeps what it measured)."""
    sampling = {**SAMPLING, "temperature": 0.0} if seed is None else SAMPLING
    asked = {r["question"] for r in run["rows"]}
    for q in [q for q in QUESTIONS[::every] if q.q not in asked]:
        t0 = time.perf_counter()
        text = m.generate(q.q, max_tokens=max_tokens, seed=seed, reuse=False, **sampling).text
        run["seconds"] += time.perf_counter() - t0
        run["rows"].append({"kind": q.kind, "question": q.q, "right": is_right(text, q), "answer": text})
        run["finished"] = len(run["rows"]) == len(QUESTIONS)
        save()


def score(model: str, seeds: list[int], max_tokens: int, out: Path, runs: list[dict], every: int = 1) -> None:
    """Run `model` greedy, then per seed, resuming the runs `runs` (out's record) holds unfinished."""
    todo = []
    for seed in [None, *seeds]:
        run = next((r for r in runs if r["model"] == model and r["seed"] == seed), None)
        if run is None:
            run = {"model": model, "seed": seed, "max_tokens": max_tokens, "seconds": 0.0, "rows": []}
            runs.append(run)
        if not run.get("finished"):
            todo.append(run)
    if not todo:
        return
    with edge.load(model, backend="llamacpp", draft="none") as m:
        for run in todo:
            save = lambda: out.write_text(json.dumps(runs, indent=1) + "\n")  # noqa: E731
            one_run(m, run["seed"], max_tokens, run, save, every)
            right = sum(bool(r["right"]) for r in run["rows"])
            what = "greedy" if run["seed"] is None else f"seed {run['seed']}"
            print(f"{model} {what}: {right}/{len(run['rows'])}", flush=True)


def cell(run: dict | None) -> str:
    if run is None:
        return "-"
    right, asked = sum(bool(x["right"]) for x in run["rows"]), len(run["rows"])
    return f"{right}/{asked}" + ("" if run.get("finished") else f" (unfinished: {asked} of {len(QUESTIONS)})")


def table(runs: list[dict]) -> list[str]:
    """The markdown table: per model its right answers greedy and per seed, the share over all runs."""
    models = list(dict.fromkeys(r["model"] for r in runs))
    seeds = sorted({r["seed"] for r in runs if r["seed"] is not None})
    head = ["model", "download MB", "greedy", *(f"t0.7 seed {s}" for s in seeds), "all runs", "share"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    counts = tally(runs)
    for name in models:
        mine = {r["seed"]: r for r in runs if r["model"] == name}
        right, asked = counts[name]
        share = f"{right / asked:.1%}" if asked else "-"
        cells = [cell(mine.get(s)) for s in [None, *seeds]]
        mb = CATALOG[name].size / 1e6
        lines.append(f"| {name} | {mb:.0f} | " + " | ".join(cells) + f" | {right}/{asked} | {share} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(CHAT_MODELS))
    ap.add_argument("--seeds", default="0,1,2", help="seeds at temperature 0.7, after one greedy run")
    ap.add_argument("--max-tokens", type=int, default=112)
    ap.add_argument(
        "--every", type=int, default=1, help="every N-th question only (a quick, stratified look)"
    )
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / f"default-model-{dt.date.today()}.json"
    )
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    runs: list[dict] = json.loads(args.out.read_text()) if args.out.exists() else []  # resumed
    for model in [m for m in args.models.split(",") if m]:  # one at a time; --models "": the table only
        score(model, seeds, args.max_tokens, args.out, runs, args.every)
    print("\n".join(table(runs)))
    sizes = {m: CATALOG[m].size for m in tally(runs)}
    name, reached = choose_default({m: r / n for m, (r, n) in tally(runs).items() if n}, sizes)
    print(f"rule: {name}" + ("" if reached else " (none reached 90%: the best scoring one)"))
    if any(not r.get("finished") for r in runs):
        print("provisional: some runs are unfinished (run again to resume them)")


if __name__ == "__main__":
    main()
