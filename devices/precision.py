"""The precisions a backend runs at (a leaf: the graph builders and the registry both check it)."""

from __future__ import annotations

__all__ = ["PRECISIONS", "check_precision"]

# fast: a backend may quantize activations to int8 (ORT accuracy level 4, OpenVINO's dynamic quantization)
# and keep lower-precision state, as llama.cpp does; exact: fp32 math on the file's own blocks
PRECISIONS = ("fast", "exact")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be fast or exact, not {precision!r}")
    return precision
