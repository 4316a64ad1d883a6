"""Whether a graph runs its K-quant linears on edge's kernels: where they run, on files that have such linears,
once the kernels are built here."""

from __future__ import annotations

import os
import sys
from functools import cache
from pathlib import Path
from typing import Protocol

from edge.devices.kquant.build import kernel_library
from edge.errors import BackendUnavailableError, DeviceError
from edge.graph_opt import kquant_op
from edge.models.gguf_file import GGUFFile

__all__ = ["kquant_library", "kquant_tensors"]

# EDGE_KQUANT=off turns the kernels off where auto would use them (a measurement against MatMulNBits, or a way
# round a kernel fault until it is fixed); forcing them on is GraphOptions.kquant=True
_OFF = ("0", "off", "no", "false")


class _Wants(Protocol):
    backend: str
    device: str
    precision: str
    static_shapes: bool
    kquant: bool | None
    accuracy_level: int | None
    head_accuracy_level: int | None


def kquant_tensors(gguf: GGUFFile) -> int:
    """How many of the file's linears the kernels read (K-quant types, rows of 256-multiples); the embedding
    table counts only where it is the head too (tied), else its rows are only gathered."""
    gathered = "token_embd.weight" if "output.weight" in gguf.tensors else None
    return sum(
        1
        for name, t in gguf.tensors.items()
        if name != gathered and len(t.shape) == 2 and kquant_op.takes(t.ggml_type, int(t.shape[0]))
    )


def kquant_library(gguf: GGUFFile, opts: _Wants) -> Path | None:
    """The kernel library when a graph of `gguf` with `opts` runs its K-quant linears on it, else None.
    opts.kquant None: where they run (ORT on the CPU at precision fast, dynamic shapes), the file has such
    linears and the kernels build (else a note, once, and the lossless MatMulNBits graph); True: required."""
    if opts.kquant is False or (opts.kquant is None and os.environ.get("EDGE_KQUANT", "").lower() in _OFF):
        return None
    where = (opts.backend, opts.device, opts.precision)
    runs_here = where == ("ort", "cpu", "fast") and not opts.static_shapes
    # an accuracy level asked for other than int8 activations (4) is a promise the kernels would not keep
    levels = {opts.accuracy_level, opts.head_accuracy_level} <= {None, 4}
    if not runs_here or not levels or not kquant_tensors(gguf):
        if opts.kquant:
            raise DeviceError(
                "edge's K-quant kernels run on ort:cpu at precision fast (int8 activations, no other "
                "accuracy level), on files with K-quant linears",
                hint="drop the kquant option, or use --backend ort --precision fast on a Q4_K/Q5_K/Q6_K file",
            )
        return None
    try:
        return kernel_library().path
    except BackendUnavailableError as exc:
        if opts.kquant:
            raise
        _say_once(str(exc))
        return None


@cache
def _say_once(why: str) -> None:
    print(f"edge: note: {why}", file=sys.stderr)
