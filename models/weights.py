"""Lossless import of GGUF weights into graph_opt's one weight representation.

A GGUF linear weight of GGUF shape (K, N) holds N rows of K inputs, quantized in blocks along K. Every
supported block format decodes, per block of `block_size` elements, to a `graph_opt.BlockWeight`:

    w = (code - zero_point) * scale [+ bias]

with `code` an unsigned `bits`-bit integer, `zero_point` an integer, `scale` and `bias` float32. The codes
are the file's own quantized values (shifted by a constant where that makes the zero point the
MatMulNBits default), so no value is re-quantized: `BlockWeight.dequantize()` reproduces
`gguf.quants.dequantize` bit for bit, because `(code - zero_point)` is the exact integer the format stores
and scale / bias are the same float32 products gguf-py forms (d * sc, dmin * m).

| GGUF type | bits | block | zero point       | bias            |
|-----------|------|-------|------------------|-----------------|
| Q4_0      | 4    | 32    | 8 (default)      | -               |
| Q4_1      | 4    | 32    | 0                | m               |
| Q4_K      | 4    | 32    | 0                | -dmin * m_j     |
| Q3_K      | 4    | 16    | 8 (default)      | -               |
| Q2_K      | 4    | 16    | 8 (default)      | -dmin * m_j     |
| Q5_0      | 8    | 32    | 128 (default)    | -               |
| Q5_1      | 8    | 32    | 128 (default)    | m               |
| Q5_K      | 8    | 32    | 128 (default)    | -dmin * m_j     |
| Q6_K      | 8    | 16    | 128 (default)    | -               |
| Q8_0      | 8    | 32    | 128 (default)    | -               |
| F32/F16/BF16 | a float array W [n, k] (F16 kept as float16, BF16 widened to float32 exactly)      |

How a BlockWeight becomes ONNX (MatMulNBits, its block-bias term, DequantizeLinear) is graph_opt.forms'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from edge.errors import ModelFormatError
from edge.graph_opt.weight import BlockWeight

if TYPE_CHECKING:
    from edge.models.gguf_file import GGUFFile

__all__ = [
    "FLOAT_TYPES",
    "NBITS_TYPES",
    "dequantize_raw",
    "dequantize_rows",
    "dequantize_tensor",
    "import_linear",
    "linear_from_raw",
    "supported_types",
]

_T = GGMLQuantizationType
_F32 = np.float32


# ---------------------------------------------------------------------------------------------------------
# Public functions


def import_linear(gguf: GGUFFile, name: str) -> BlockWeight | np.ndarray:
    """The linear weight `name` (GGUF shape (K, N)) from its raw blocks, without re-quantizing: a BlockWeight
    [n = N, k = K], or a float array [N, K] (F32 and F16: a read-only view of the file's memory map)."""
    info = gguf.tensors[name]
    return linear_from_raw(gguf.tensor_bytes(name), info.shape, info.ggml_type, name=name)


def linear_from_raw(
    raw: np.ndarray, shape: Sequence[int], ggml_type: int, *, name: str = "<tensor>"
) -> BlockWeight | np.ndarray:
    """Like `import_linear`, from raw bytes (uint8) and the GGUF shape (ne0 = K first)."""
    qtype = _qtype(ggml_type, name)
    if len(shape) != 2:
        raise ModelFormatError(f"tensor {name!r}: a linear weight must be 2-D, got GGUF shape {tuple(shape)}")
    k, n = int(shape[0]), int(shape[1])
    rows = _as_rows(raw, n, k, qtype, name)
    if qtype in _FLOAT_DECODERS:
        return _FLOAT_DECODERS[qtype](rows).reshape(n, k)
    fmt = _FORMATS[qtype]
    codes, scales, bias = _decode_rows(fmt, rows, qtype, k)
    zp = None if fmt.zero_point == 1 << (fmt.bits - 1) else np.full(scales.shape, fmt.zero_point, np.uint8)
    return BlockWeight(fmt.bits, fmt.block_size, k, n, codes, scales, zp, bias)


def dequantize_rows(gguf: GGUFFile, name: str, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Rows `ids` of a 2-D tensor (e.g. token_embd: one row per token id) as float32 [len(ids), K],
    decoded from only those rows' blocks; equal to the same rows of gguf-py's whole-tensor dequantize."""
    info = gguf.tensors[name]
    return dequantize_raw(gguf.tensor_bytes(name), info.shape, info.ggml_type, ids=ids, name=name)


def dequantize_tensor(gguf: GGUFFile, name: str, *, chunk_rows: int = 8192) -> np.ndarray:
    """The whole tensor as float32, numpy shape = reversed GGUF shape (decoded in row chunks, so the
    temporaries stay small even for a 262k-row embedding table)."""
    info = gguf.tensors[name]
    return dequantize_raw(
        gguf.tensor_bytes(name), info.shape, info.ggml_type, name=name, chunk_rows=chunk_rows
    )


def dequantize_raw(
    raw: np.ndarray,
    shape: Sequence[int],
    ggml_type: int,
    *,
    ids: Sequence[int] | np.ndarray | None = None,
    name: str = "<tensor>",
    chunk_rows: int = 8192,
) -> np.ndarray:
    """`dequantize_rows` / `dequantize_tensor` on raw bytes and a GGUF shape (any rank; rows = ne0)."""
    qtype = _qtype(ggml_type, name)
    if not shape:
        raise ModelFormatError(f"tensor {name!r} has no dimensions")
    k = int(shape[0])
    n_rows = int(np.prod(shape[1:], dtype=np.int64))
    rows = _as_rows(raw, n_rows, k, qtype, name)
    if ids is not None:
        idx = np.asarray(ids, dtype=np.int64).reshape(-1)
        if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
            bad = idx[(idx < 0) | (idx >= n_rows)][0]
            raise IndexError(f"tensor {name!r}: row {int(bad)} out of range [0, {n_rows})")
        return _dequantize_rows(rows[idx], qtype, k)
    out = np.empty((n_rows, k), _F32)
    for start in range(0, n_rows, max(1, chunk_rows)):
        stop = min(n_rows, start + max(1, chunk_rows))
        out[start:stop] = _dequantize_rows(rows[start:stop], qtype, k)
    return out.reshape(tuple(reversed([int(d) for d in shape])))


def supported_types() -> list[str]:
    return [t.name for t in (*FLOAT_TYPES, *NBITS_TYPES)]


# ---------------------------------------------------------------------------------------------------------
# Block formats. Each decoder takes blocks uint8 [n_blocks, type_size] and returns codes uint8
# [n_blocks, block elements], scales float32 [n_blocks, sub-blocks], bias float32 or None, mirroring the
# element order and float32 arithmetic of gguf.quants (the reference) exactly.


@dataclass(frozen=True)
class _Format:
    bits: int
    block_size: int  # elements per scale (the ONNX block), not the GGUF super-block
    zero_point: int
    decode_blocks: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray | None]]


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of each block, as float32 [n_blocks, 1]."""
    return np.ascontiguousarray(b[:, at : at + 2]).view(np.float16).astype(_F32)


def _nibbles_split(qs: np.ndarray) -> np.ndarray:
    """Q4_0/Q4_1/Q5_x order: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _qh_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1: bit j of the little-endian u32 is the 5th bit of element j; [n, 32] of 0/1."""
    return np.unpackbits(qh, axis=1, bitorder="little")


def _k_scale_min(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K: eight 6-bit (scale, min) pairs packed in 12 bytes (gguf Q4_K.get_scale_min)."""
    s = s.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def _q4_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return _nibbles_split(b[:, 2:18]), _f16(b, 0), None


def _q4_1(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return _nibbles_split(b[:, 4:20]), _f16(b, 0), _f16(b, 2)


def _q5_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    q = _nibbles_split(b[:, 6:22]) | (_qh_bits(b[:, 2:6]) << 4)
    return q + np.uint8(112), _f16(b, 0), None  # q - 16 == (q + 112) - 128


def _q5_1(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    q = _nibbles_split(b[:, 8:24]) | (_qh_bits(b[:, 4:8]) << 4)
    return q + np.uint8(128), _f16(b, 0), _f16(b, 2)


def _q8_0(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    return b[:, 2:34] ^ np.uint8(0x80), _f16(b, 0), None  # int8 x == (x ^ 0x80 as uint8) - 128


def _q2_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    n = b.shape[0]
    sc, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = _f16(b, 80), _f16(b, 82)
    q = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    scales = d * (sc & 0x0F).astype(_F32)
    bias = -(dmin * (sc >> 4).astype(_F32))
    return q.reshape(n, 256) + np.uint8(8), scales, bias


def _q3_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    n = b.shape[0]
    hmask, qs, s = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    d = _f16(b, 108)
    low = (s[:, :8].reshape(n, 1, 8) >> np.array([0, 4], np.uint8).reshape(1, 2, 1)).reshape(n, 16)
    high = (s[:, 8:].reshape(n, 1, 4) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 4, 1)).reshape(n, 16)
    sc = (low & 0x0F) | ((high & 0x03) << 4)
    scales = d * (sc.astype(np.int8) - np.int8(32)).astype(_F32)
    ql = (qs.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & np.uint8(3)
    qh = (hmask.reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & np.uint8(1)
    # value = ql - 4 * (1 - hbit) = (ql | hbit << 2) - 4 = (that + 4) - 8
    return (ql.reshape(n, 256) | (qh.reshape(n, 256) << 2)) + np.uint8(4), scales, None


def _q4_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    q = b[:, 16:144].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    return (q & np.uint8(0x0F)).reshape(n, 256), d * sc.astype(_F32), -(dmin * mn.astype(_F32))


def _q5_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    n = b.shape[0]
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = _k_scale_min(b[:, 4:16])
    ql = (b[:, 48:176].reshape(n, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    qh = (b[:, 16:48].reshape(n, 1, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 0x01
    q = ql.reshape(n, 256) | (qh.reshape(n, 256) << 4)
    return q + np.uint8(128), d * sc.astype(_F32), -(dmin * mn.astype(_F32))


def _q6_k(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    n = b.shape[0]
    ql = (b[:, 0:128].reshape(n, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 0x0F
    qh = (b[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 0x03
    q = ql.reshape(n, 256) | (qh.reshape(n, 256) << 4)
    scales = _f16(b, 208) * b[:, 192:208].view(np.int8).astype(_F32)
    return q + np.uint8(96), scales, None  # q - 32 == (q + 96) - 128


_FORMATS: dict[GGMLQuantizationType, _Format] = {
    _T.Q4_0: _Format(4, 32, 8, _q4_0),
    _T.Q4_1: _Format(4, 32, 0, _q4_1),
    _T.Q4_K: _Format(4, 32, 0, _q4_k),
    _T.Q3_K: _Format(4, 16, 8, _q3_k),
    _T.Q2_K: _Format(4, 16, 8, _q2_k),
    _T.Q5_0: _Format(8, 32, 128, _q5_0),
    _T.Q5_1: _Format(8, 32, 128, _q5_1),
    _T.Q5_K: _Format(8, 32, 128, _q5_k),
    _T.Q6_K: _Format(8, 16, 128, _q6_k),
    _T.Q8_0: _Format(8, 32, 128, _q8_0),
}


def _bf16(rows: np.ndarray) -> np.ndarray:
    return (np.ascontiguousarray(rows).view(np.uint16).astype(np.uint32) << 16).view(_F32)


_FLOAT_DECODERS: dict[GGMLQuantizationType, Callable[[np.ndarray], np.ndarray]] = {
    _T.F32: lambda rows: np.ascontiguousarray(rows).view(_F32),
    _T.F16: lambda rows: np.ascontiguousarray(rows).view(np.float16),
    _T.BF16: _bf16,
}

FLOAT_TYPES: tuple[GGMLQuantizationType, ...] = tuple(_FLOAT_DECODERS)
NBITS_TYPES: tuple[GGMLQuantizationType, ...] = tuple(_FORMATS)


# ---------------------------------------------------------------------------------------------------------
# Helpers


def _qtype(ggml_type: int, name: str) -> GGMLQuantizationType:
    try:
        qtype = GGMLQuantizationType(ggml_type)
    except ValueError:
        qtype = None
    if qtype is None or (qtype not in _FORMATS and qtype not in _FLOAT_DECODERS):
        type_name = qtype.name if qtype is not None else f"unknown type {ggml_type}"
        raise ModelFormatError(
            f"tensor {name!r} has GGUF type {type_name}, which edge cannot import into an ONNX graph",
            hint=f"supported: {', '.join(supported_types())}; re-quantize the model to one of them",
        )
    return qtype


def _as_rows(raw: np.ndarray, n_rows: int, k: int, qtype: GGMLQuantizationType, name: str) -> np.ndarray:
    """raw bytes -> uint8 [n_rows, row_bytes], checking K against the block size and the byte count."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    if k <= 0 or k % block:
        raise ModelFormatError(
            f"tensor {name!r}: ne0 = {k} is not a positive multiple of {qtype.name}'s {block}"
        )
    row_bytes = k // block * type_size
    flat = np.asarray(raw).view(np.uint8).reshape(-1)
    if flat.size != n_rows * row_bytes:
        raise ModelFormatError(
            f"tensor {name!r}: {flat.size} bytes, but {n_rows} rows of {k} {qtype.name} values take "
            f"{n_rows * row_bytes}"
        )
    return flat.reshape(n_rows, row_bytes)


def _dequantize_rows(rows: np.ndarray, qtype: GGMLQuantizationType, k: int) -> np.ndarray:
    if qtype in _FLOAT_DECODERS:
        return _FLOAT_DECODERS[qtype](rows).reshape(rows.shape[0], k).astype(_F32)
    fmt = _FORMATS[qtype]
    codes, scales, bias = _decode_rows(fmt, rows, qtype, k)
    r = rows.shape[0]
    q = codes.reshape(r, k // fmt.block_size, fmt.block_size).astype(np.int16) - np.int16(fmt.zero_point)
    w = q.astype(_F32) * scales[..., None]
    if bias is not None:
        w += bias[..., None]
    return w.reshape(r, k)


def _decode_rows(
    fmt: _Format, rows: np.ndarray, qtype: GGMLQuantizationType, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """rows uint8 [r, row bytes] -> codes uint8 [r, k], scales and bias (or None) float32 [r, k / block]."""
    r, nb = rows.shape[0], k // fmt.block_size
    type_size = GGML_QUANT_SIZES[qtype][1]
    codes, scales, bias = fmt.decode_blocks(np.ascontiguousarray(rows).reshape(-1, type_size))
    return codes.reshape(r, k), scales.reshape(r, nb), None if bias is None else bias.reshape(r, nb)
