"""The precisions a backend runs at (a leaf: the graph builders and the registry both check it)."""

from __future__ import annotations

from edge.errors import PlanError
from edge.kvcache.spec import KV_DTYPES

__all__ = [
    "BF16",
    "HALF_PRECISIONS",
    "KV_CHOICES",
    "PRECISIONS",
    "check_f32_kv",
    "check_kv_dtype",
    "check_precision",
    "graph_precision",
    "kv_dtype_for",
]

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


# --kv-dtype: auto, or one of the ring's types (kvcache/spec.py)
KV_CHOICES = ("auto", *KV_DTYPES)
# Where auto keeps the KV in f16: llama.cpp (its own default cache type) and OpenVINO's GPU, which runs the
# graph in fp16 anyway. On a CPU the own graphs keep f32: neither ONNX Runtime's nor OpenVINO's CPU attention
# reads fp16 K/V, so the graph widens the ring every step, which cost 0-5% of a decode step here
# (benchmarks/results/kv-f16-2026-12-05.md); f16 is asked for where memory matters more.
_F16_GRAPHS = {("openvino", "gpu")}


def check_kv_dtype(requested: str) -> str:
    """`requested` if it is one of KV_CHOICES (ValueError naming them otherwise)."""
    if requested not in KV_CHOICES:
        raise ValueError(f"--kv-dtype must be {' or '.join(KV_CHOICES)}, not {requested!r}")
    return requested


def kv_dtype_for(requested: str, backend: str, device: str, precision: str) -> str:
    """The KV cache's type for `requested` (KV_CHOICES) on (backend, device) at `precision`: "f32" or "f16".
    ValueError for an unknown name, and for f16 at precision exact on the own graphs (exact keeps f32 K/V)."""
    if check_kv_dtype(requested) == "auto":
        if backend == "llamacpp":  # one precision, whatever --precision says
            return "f16"
        kind = device.partition(".")[0]  # gpu.1: a numbered GPU is a GPU
        return "f16" if (backend, kind) in _F16_GRAPHS and precision == "fast" else "f32"
    if requested == "f16" and precision == "exact" and backend != "llamacpp":
        raise ValueError(
            "--precision exact keeps the KV cache in f32 (f16 rounds every key and value); "
            "use --kv-dtype f32 or auto, or --precision fast"
        )
    return requested


def check_f32_kv(kv_dtype: str, what: str) -> None:
    """`what` holds its K/V in f32 only (partitioned plans, NPU-shaped halves, `edge convert` artifacts): auto
    means f32 there, f16 is refused."""
    if kv_dtype not in ("auto", "f32"):
        raise PlanError(
            f"{what} keeps its KV cache in f32; --kv-dtype {kv_dtype} runs on whole-model graphs and llama.cpp",
            hint="use --kv-dtype f32 or auto",
        )
