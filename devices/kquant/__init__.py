"""edge's own K-quant kernels (C, built on first use with the machine's compiler) and the ONNX Runtime op
that runs them (graph_opt.kquant_op)."""

from edge.devices.kquant.binding import ISAS, best_isa, isa_runs, matmul
from edge.devices.kquant.build import KernelBuild, kernel_library
from edge.devices.kquant.choose import kquant_library, kquant_tensors

__all__ = [
    "ISAS",
    "KernelBuild",
    "best_isa",
    "isa_runs",
    "kernel_library",
    "kquant_library",
    "kquant_tensors",
    "matmul",
]
