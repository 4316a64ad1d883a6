"""The kernels called directly (ctypes): for the tests against a float64 reference, per instruction set, and
for measuring a kernel alone. Inference runs them inside ONNX Runtime (the op in csrc/ort_op.c)."""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

from edge.devices.kquant.build import kernel_library
from edge.graph_opt.kquant_op import row_bytes, takes

__all__ = ["ISAS", "best_isa", "isa_runs", "matmul"]

# the instruction sets the library has kernels for, by the id csrc/kquant.h gives them
ISAS = {"portable": 0, "avx2": 1, "avx512": 2, "avx512vnni": 3}
_F32P = ctypes.POINTER(ctypes.c_float)
_U8P = ctypes.POINTER(ctypes.c_uint8)


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(kernel_library().path))
    lib.kq_matmul.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        _F32P,
        ctypes.c_int64,
        ctypes.c_int64,
        _U8P,
        ctypes.c_int64,
        _F32P,
    ]
    lib.kq_matmul.restype = ctypes.c_int
    lib.kq_kernels_for.argtypes = [ctypes.c_int]
    lib.kq_kernels_for.restype = ctypes.c_void_p
    lib.kq_best_isa.restype = ctypes.c_int
    return lib


def isa_runs(isa: str) -> bool:
    """Whether this CPU runs the kernels of `isa` (a key of ISAS)."""
    return _lib().kq_kernels_for(ISAS[isa]) is not None


def best_isa() -> str:
    best = _lib().kq_best_isa()
    return next(name for name, i in ISAS.items() if i == best)


def matmul(x: np.ndarray, w: np.ndarray, ggml_type: int, *, isa: str | None = None) -> np.ndarray:
    """x [m, k] float32 times the GGUF rows w [n, row_bytes] (uint8) of `ggml_type`: y [m, n], on the calling
    thread with the kernels of `isa` (default: the best this CPU runs)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    w = np.ascontiguousarray(w, dtype=np.uint8)
    m, k = x.shape
    if not takes(ggml_type, k):
        raise ValueError(f"the K-quant kernels take no type {ggml_type} rows of {k} inputs (bytes per row?)")
    if w.ndim != 2 or w.shape[1] != row_bytes(ggml_type, k):
        raise ValueError(
            f"type {ggml_type} rows of {k} inputs are {row_bytes(ggml_type, k)} bytes, got {w.shape}"
        )
    if isa is not None and not isa_runs(isa):
        raise ValueError(f"this CPU does not run the {isa} kernels")
    n = w.shape[0]
    y = np.empty((m, n), np.float32)
    which = ISAS[isa] if isa is not None else _lib().kq_best_isa()
    rc = _lib().kq_matmul(
        which, ggml_type, x.ctypes.data_as(_F32P), m, k, w.ctypes.data_as(_U8P), n, y.ctypes.data_as(_F32P)
    )
    if rc != 0:
        raise RuntimeError(f"kq_matmul failed for type {ggml_type}, shape {(m, k)} x {(n, k)}")
    return y
