"""A draft model's ORT session beside its target's, in one process: does letting the draft's intra-op threads
spin between runs slow the target's next verify? (Why `DecoderOptions.spin` is False for draft models.)

    python benchmarks/draft_session_spin.py 1     # the draft session spins (ORT's default)
    python benchmarks/draft_session_spin.py 0     # it does not (what edge.drafters.open_drafter does)

qwen2.5-coder-1.5b target and qwen2.5-coder-0.5b draft on ORT, 2 threads each; 16 rounds of 3 drafted tokens
then a 4-token target forward (rolled back). Prints medians of a draft token and of the verify, in ms. Run
the two settings alternately on a quiet machine (2026-12-01, an earlier form of this script that switched
spinning through ort.SessionOptions: verify 84-87 ms with the draft spinning, 58-62 ms without).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edge.devices.registry import DecoderOptions, open_decoder  # noqa: E402
from edge.models.resolve import resolve_model  # noqa: E402


def main() -> None:
    spin = sys.argv[1:] == ["1"]
    target = open_decoder("ort", resolve_model("qwen2.5-coder-1.5b"), "cpu", DecoderOptions(512, 2))
    draft = open_decoder("ort", resolve_model("qwen2.5-coder-0.5b"), "cpu", DecoderOptions(512, 2, spin=spin))
    try:
        target.forward(list(range(100, 164)), last_only=True)
        draft.forward(list(range(100, 164)), last_only=True)
        drafted, verify = [], []
        for _ in range(16):
            for j in range(3):
                t0 = time.perf_counter()
                draft.forward([600 + j], last_only=True)
                drafted.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            target.forward([700 + j for j in range(4)])
            verify.append(time.perf_counter() - t0)
            target.rollback(4)
            draft.rollback(3)
    finally:
        target.close()
        draft.close()
    ms = lambda xs: round(1e3 * statistics.median(xs), 1)  # noqa: E731
    print(f"draft spins: {spin}  draft token {ms(drafted)} ms  4-token verify {ms(verify)} ms")


if __name__ == "__main__":
    main()
