"""`BlockWeight`: the one representation of a block-quantized linear weight (GGUF blocks import into it,
edge's quantizers produce it, every ONNX form is emitted from it), and MatMulNBits' code packing.

A float weight is a plain numpy array W [n, k] (float32, or float16 kept as stored).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

__all__ = ["BlockWeight", "float_zero_point_form", "pack_codes", "stack_rows", "take_rows", "unpack_codes"]

_F32 = np.float32


@dataclass(frozen=True, eq=False)
class BlockWeight:
    """W[r, j] = (codes[r, j] - zero_points[r, j // bs]) * scales[r, j // bs] (+ bias[r, j // bs]).

    `bias` is the block-bias term of min-offset formats (GGUF Q4_1 / K-quants: -dmin * m per block; edge's
    asymmetric INT4 / INT8: the block's offset). `block_size` may exceed k (one block per row: per-channel);
    the codes are then padded to whole blocks when packed. zero_points None means the symmetric default
    2^(bits - 1)."""

    bits: int  # 4 or 8
    block_size: int
    k: int
    n: int
    codes: np.ndarray  # uint8 [n, k]
    scales: np.ndarray  # float32 [n, k_blocks]
    zero_points: np.ndarray | None  # uint8 [n, k_blocks]
    bias: np.ndarray | None = None  # float32 [n, k_blocks]

    @property
    def k_blocks(self) -> int:
        return -(-self.k // self.block_size)

    @property
    def symmetric(self) -> bool:
        return self.zero_points is None and self.bias is None

    def integer_zero_points(self) -> np.ndarray:
        if self.zero_points is not None:
            return self.zero_points
        return np.full((self.n, self.k_blocks), 1 << (self.bits - 1), np.uint8)

    def dequantize(self) -> np.ndarray:
        """W float32 [n, k]; for GGUF blocks bit-identical to gguf-py's dequantization ((code - zp) is the exact
        integer the format stores, scale and bias the same float32 products)."""
        pad = self.k_blocks * self.block_size - self.k
        codes = np.pad(self.codes, ((0, 0), (0, pad))) if pad else self.codes
        q = codes.reshape(self.n, self.k_blocks, self.block_size).astype(np.int16)
        q -= self.integer_zero_points()[..., None]
        w = q.astype(_F32) * self.scales[..., None]
        if self.bias is not None:
            w += self.bias[..., None]
        return w.reshape(self.n, -1)[:, : self.k]

    def split_blocks(self, size: int) -> BlockWeight:
        """The same weight in blocks of `size` (a divisor of the block size, k whole blocks): each block's
        scale, zero point and bias repeated, so every weight dequantizes to the same float."""
        if size < 1 or self.block_size % size or self.k % self.block_size:
            raise ValueError(
                f"cannot split {self.block_size}-element blocks of k={self.k} into blocks of {size}"
            )
        r = self.block_size // size

        def rep(a: np.ndarray | None) -> np.ndarray | None:
            return None if a is None else np.ascontiguousarray(np.repeat(a, r, axis=1))

        return replace(
            self,
            block_size=size,
            scales=rep(self.scales),
            zero_points=rep(self.zero_points),
            bias=rep(self.bias),
        )

    def float_zero_points(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The block bias folded into float zero points: (codes, scales, zero points) with
        (code - zp) * scale == W up to float rounding; scale-0 blocks (every weight equals its bias) exactly,
        as codes 1, zero point 0, scale := bias."""
        assert self.bias is not None
        zero = self.scales == 0
        codes = self.codes
        if zero.any():
            pad = self.k_blocks * self.block_size - self.k
            blocks = np.pad(codes, ((0, 0), (0, pad))).reshape(self.n, self.k_blocks, self.block_size)
            blocks[zero] = 1
            codes = blocks.reshape(self.n, -1)[:, : self.k]
        z = np.where(zero, 0, self.integer_zero_points())
        return (codes, *float_zero_point_form(self.scales, z, self.bias))

    @property
    def nbytes(self) -> int:
        """Bytes as stored: packed codes plus scales, zero points and bias."""
        size = self.n * self.k_blocks * self.block_size * self.bits // 8 + self.scales.nbytes
        if self.zero_points is not None:
            size += self.n * (-(-self.k_blocks * self.bits // 8))
        return size + (self.bias.nbytes if self.bias is not None else 0)


def float_zero_point_form(
    scales: np.ndarray, zero_points: np.ndarray, bias: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(scales, float zero points) [n, k_blocks] with (code - zp) * scale == (code - z) * s + bias, i.e.
    zp = z - bias / s. A block with scale 0 gets scale := bias, zp := z: exact when its codes are z + 1 (see
    `BlockWeight.float_zero_points`)."""
    z = zero_points.astype(_F32)
    zero = scales == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        fzp = np.where(zero, z, z - bias / np.where(zero, _F32(1), scales)).astype(_F32)
    return np.where(zero, bias, scales).astype(_F32), fzp


def take_rows(w: BlockWeight | np.ndarray, rows: np.ndarray) -> BlockWeight | np.ndarray:
    """Output rows `rows` of a weight, in that order (exact for quantized rows: blocks run along k)."""
    if isinstance(w, np.ndarray):
        return np.ascontiguousarray(w[rows])
    return replace(
        w,
        n=len(rows),
        codes=np.ascontiguousarray(w.codes[rows]),
        scales=np.ascontiguousarray(w.scales[rows]),
        zero_points=None if w.zero_points is None else np.ascontiguousarray(w.zero_points[rows]),
        bias=None if w.bias is None else np.ascontiguousarray(w.bias[rows]),
    )


def stack_rows(ws: Sequence[BlockWeight | np.ndarray]) -> BlockWeight | np.ndarray | None:
    """The weights stacked along the output dim (one matmul for QKV or gate+up), when they share one storage
    form; else None."""
    first = ws[0]
    if isinstance(first, np.ndarray):
        if all(isinstance(w, np.ndarray) and w.dtype == first.dtype for w in ws):
            return np.concatenate(ws)  # type: ignore[arg-type]
        return None
    if not all(
        isinstance(w, BlockWeight) and (w.bits, w.block_size, w.k) == (first.bits, first.block_size, first.k)
        for w in ws
    ):
        return None
    bw = [w for w in ws if isinstance(w, BlockWeight)]
    zps = (
        None
        if all(w.zero_points is None for w in bw)
        else np.concatenate([w.integer_zero_points() for w in bw])
    )
    bias = None
    if any(w.bias is not None for w in bw):
        bias = np.concatenate([w.bias if w.bias is not None else np.zeros_like(w.scales) for w in bw])
    return replace(
        first,
        n=sum(w.n for w in bw),
        codes=np.concatenate([w.codes for w in bw]),
        scales=np.concatenate([w.scales for w in bw]),
        zero_points=zps,
        bias=bias,
    )


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [r, c] -> [r, ceil(c * bits / 8)] packed low-bits-first (MatMulNBits' layout)."""
    if bits == 8:
        return np.ascontiguousarray(codes, dtype=np.uint8)
    per = 8 // bits
    r, c = codes.shape
    pad = (-c) % per
    if pad:
        codes = np.concatenate([codes, np.zeros((r, pad), np.uint8)], axis=1)
    g = codes.reshape(r, -1, per).astype(np.uint8)
    out = np.zeros(g.shape[:2], np.uint8)
    for i in range(per):
        out |= g[..., i] << np.uint8(bits * i)
    return out


def unpack_codes(packed: np.ndarray, bits: int, c: int) -> np.ndarray:
    packed = packed.reshape(packed.shape[0], -1)
    if bits == 8:
        return packed[:, :c]
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).reshape(1, 1, per)
    q = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return q.reshape(packed.shape[0], -1)[:, :c]
