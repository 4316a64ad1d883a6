"""The ONNX node that multiplies by GGUF K-quant blocks as the file stores them (devices/kquant runs it).

    edge.kquant.MatMulKQuant(x [.., k] float, w [n, row_bytes] uint8) -> y [.., n] float
        attributes: ggml_type (GGML's type id), k, n

`w` holds the tensor's rows unchanged (GGUF's bytes; rows may be taken, permuted or stacked, never re-encoded),
so the graph reads each weight byte once a token, as llama.cpp does; the runtime's kernel quantizes x to 8-bit
blocks of 256 and takes integer dot products with the blocks (precision "fast" only: x is rounded).
"""

from __future__ import annotations

from gguf.constants import GGMLQuantizationType

__all__ = ["DOMAIN", "OP_TYPE", "ROW_BYTES_PER_256", "row_bytes", "takes"]

DOMAIN = "edge.kquant"
OP_TYPE = "MatMulKQuant"
_T = GGMLQuantizationType
# bytes per 256 weights of the types the kernels read (the kernels' own table is devices/kquant/csrc)
ROW_BYTES_PER_256 = {int(_T.Q4_K): 144, int(_T.Q5_K): 176, int(_T.Q6_K): 210}


def takes(ggml_type: int, k: int) -> bool:
    """Whether the kernels read a tensor of this type with rows of k inputs."""
    return int(ggml_type) in ROW_BYTES_PER_256 and k > 0 and k % 256 == 0


def row_bytes(ggml_type: int, k: int) -> int:
    return k // 256 * ROW_BYTES_PER_256[int(ggml_type)]
