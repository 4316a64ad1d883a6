"""What a decode step costs in Python around ONNX Runtime's own run, with the runner's output buffers kept
between runs (the default) vs bound afresh every run (what OrtRunner did before).

    python benchmarks/ort_runner_overhead.py smollm2-135m [--prompt 512] [--steps 24] [--rounds 6]

Prefills a prompt on the graph `--backend ort` runs, then times blocks of single-token decode steps, the two
variants taking turns in one process (noise from the machine hits both). Per step it splits the time into
ORT's run_with_iobinding (the graph itself), the runner around it (input and output binding, results), and
the decoder around the runner (embedding, masks, staging feeds, the KV commit). Prints medians over rounds;
the greedy logits of both variants are checked equal.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import edge.devices.runners as runners  # noqa: E402
from edge.devices.registry import DecoderOptions, open_decoder  # noqa: E402
from edge.models.resolve import resolve_model  # noqa: E402


class _TimedSession:
    """The runner's session with its run_with_iobinding timed."""

    def __init__(self, session: Any) -> None:
        self._session = session
        self.native = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def run_with_iobinding(self, binding: Any) -> None:
        t = time.perf_counter()
        self._session.run_with_iobinding(binding)
        self.native += time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    dec = open_decoder(
        "ort",
        resolve_model(args.model),
        "cpu",
        DecoderOptions(n_ctx=args.prompt + 64, n_threads=args.threads),
    )
    runner = dec.runner  # type: ignore[attr-defined]
    session = runner.session = _TimedSession(runner.session)
    inner = runner.run
    in_runner = [0.0]

    def timed_run(feeds: Any, outputs: Any) -> Any:
        t = time.perf_counter()
        out = inner(feeds, outputs)
        in_runner[0] += time.perf_counter() - t
        return out

    runner.run = timed_run
    keep = runners.KEEP_OUTPUTS_BYTES
    variants = {"kept outputs": keep, "fresh outputs": -1}
    figures: dict[str, dict[str, list[float]]] = {
        v: {"ort": [], "runner": [], "decoder": []} for v in variants
    }
    logits: dict[str, list[np.ndarray]] = {}
    prompt = list(range(100, 100 + args.prompt))
    for _ in range(args.rounds):
        for name, limit in variants.items():
            runners.KEEP_OUTPUTS_BYTES = limit
            runner._kept_outputs = None
            dec.reset()
            dec.forward(prompt, last_only=True)
            session.native = in_runner[0] = 0.0
            t = time.perf_counter()
            out = [dec.forward([1000 + i], last_only=True) for i in range(args.steps)]
            total = time.perf_counter() - t
            logits.setdefault(name, out)
            per = 1e3 / args.steps
            figures[name]["ort"].append(session.native * per)
            figures[name]["runner"].append((in_runner[0] - session.native) * per)
            figures[name]["decoder"].append((total - in_runner[0]) * per)
    runners.KEEP_OUTPUTS_BYTES = keep
    dec.close()
    a, b = logits.values()
    same = all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    print(f"{args.model}: ms per decode step, medians of {args.rounds} rounds of {args.steps} steps")
    print(f"{'variant':16} {'ORT run':>8} {'runner':>8} {'decoder':>8}")
    for name, f in figures.items():
        med = {k: statistics.median(v) for k, v in f.items()}
        print(f"{name:16} {med['ort']:8.2f} {med['runner']:8.3f} {med['decoder']:8.3f}")
    print(f"logits of the two variants equal: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
