"""Shared by the benchmarks that time a model's first moments (first_prompt.py, first_answer.py): every run in a
fresh process, the variants interleaved round by round."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from typing import Any


def interleaved_runs(
    command: Callable[[str], list[str]], variants: Sequence[str], rounds: int
) -> dict[str, list[dict[str, Any]]]:
    """Each variant once per round, each run a new process (`command(variant)`, whose last stdout line is one
    JSON object); interleaved, so the machine's drift spreads over all variants alike."""
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            out = subprocess.run(command(v), capture_output=True, text=True, check=True)
            runs[v].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(v, runs[v][-1], flush=True)
    return runs
