"""The precisions a backend runs at (a leaf: the graph builders and the registry both check it)."""

from __future__ import annotations

__all__ = ["BF16", "HALF_PRECISIONS", "PRECISIONS", "check_precision", "graph_precision"]

# fast: a backend may quantize activations to int8 (ORT accuracy level 4, OpenVINO's dynamic quantization)
# and keep lower-precision state, as llama.cpp does; exact: fp32 math on the file's own blocks
PRECISIONS = ("fast", "exact")
# bf16: OpenVINO's CPU runs the exact graph's products in bf16 on a matrix engine (AVX512-BF16, AMX), with no
# dynamic int8 quantization: a prompt's precision. Only a phase split's half takes it (devices/phase_split.py):
# alone it would also decode in bf16, slower than int8 (Xeon AMX, smollm2: 37.3 against 47.7 tok/s)
BF16 = "bf16"
HALF_PRECISIONS = (*PRECISIONS, BF16)


def check_precision(precision: str, *, half: bool = False) -> str:
    """`precision` if it is one of PRECISIONS (half: of HALF_PRECISIONS, a phase split's half)."""
    allowed = HALF_PRECISIONS if half else PRECISIONS
    if precision not in allowed:
        raise ValueError(f"--precision must be {' or '.join(allowed)}, not {precision!r}")
    return precision


def graph_precision(precision: str) -> str:
    """The precision the graph is built at: bf16 runs the exact graph (float zero points, no int8 lowerings);
    the runtime does the rounding."""
    return "exact" if precision == BF16 else precision
