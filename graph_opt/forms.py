"""The ONNX forms a linear layer's weight takes, each one entry of `FORMS`: how to emit it and how to read it
back from the graph.

    nbits      com.microsoft.MatMulNBits(x, B, scales[, zero_points]), integer zero points; a block bias
               (GGUF's min-offset formats) as the separate block-bias term below. Runs everywhere.
    nbits_fzp  MatMulNBits with the block bias folded into float zero points (zp = z - bias / s): OpenVINO
               decompresses them in its FullyConnected; ORT runs 4-bit ones on a slow path, refuses 8-bit.
    nibbles    an 8-bit weight as two 4-bit MatMulNBits (high and low nibble of each code) and an Add: ORT's
               fast fp32 kernels are 4-bit only; (code - zp) s = (hi - zh) 16 s + (lo - zl) s exactly.
    qdq        standard ONNX: DequantizeLinear(q [k, n], scales, zp, axis 0, block_size) -> MatMul.
  the block-bias term (every form but nbits_fzp, when the weight has a block bias):
               Add(main, MatMul(ReduceSum(Reshape(x, [.., k/bs, bs]), -1), bias^T))
  float weights (not a form of BlockWeight): MatMul(x, W^T), a float16 W^T behind a Cast.

Adding a form (e.g. the block-bias term as an 8-bit MatMulNBits) is one `Form` here: its emit and its read.
Every node a form emits is annotated by `Emitter` (see graph_opt.linear), so reading is a lookup of the
linear's own nodes, never a pattern search.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import onnx_ir as ir

from edge.errors import ModelFormatError
from edge.graph_opt._rules import FORM_KEY, NAME_KEY, ROLE_KEY, const_array, ints
from edge.graph_opt.weight import BlockWeight, pack_codes, unpack_codes

__all__ = [
    "FORMS",
    "Emitter",
    "Form",
    "Read",
    "emit_bias_term",
    "emit_float",
    "per_channel_as_blocks",
    "read_bias_term",
    "read_float",
]

_F32 = np.float32
_NIBBLE_KEY = "edge.linear.nibble"  # which half of a nibbles form a MatMulNBits computes: hi | lo


class Emitter:
    """Makes one linear's nodes and initializers in `graph`, each node annotated with the linear's name, form
    and role; the nodes are collected in `nodes` (the caller inserts them)."""

    def __init__(self, graph: ir.Graph, x: ir.Value, name: str, form: str, rank: int) -> None:
        self.graph, self.x, self.name, self.form, self.rank = graph, x, name, form, rank
        self.nodes: list[ir.Node] = []

    def init(self, suffix: str, array: np.ndarray, dtype: ir.DataType | None = None) -> ir.Value:
        name, i = f"{self.name}.{suffix}", 1
        while name in self.graph.initializers:  # re-emitting: the old weights are still registered
            name, i = f"{self.name}.{suffix}.{i}", i + 1
        tensor = ir.tensor(np.ascontiguousarray(array), dtype=dtype, name=name)
        value = ir.Value(
            name=name, const_value=tensor, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype)
        )
        self.graph.register_initializer(value)
        return value

    def op(
        self, op_type: str, inputs: Sequence[ir.Value], role: str = "weight", domain: str = "", **attrs: Any
    ) -> ir.Value:
        node = ir.node(op_type, list(inputs), attributes=attrs, domain=domain)
        node.metadata_props.update({NAME_KEY: self.name, ROLE_KEY: role, FORM_KEY: self.form})
        self.nodes.append(node)
        return node.outputs[0]


@dataclass(frozen=True)
class Read:
    """A form's nodes read back: the weight (without a separate block-bias term), accuracy level, x, output."""

    weight: BlockWeight | np.ndarray
    accuracy_level: int
    x: ir.Value
    y: ir.Value


@dataclass(frozen=True)
class Form:
    emit: Callable[[Emitter, BlockWeight, int], ir.Value]  # (emitter, weight, accuracy level) -> x @ W'^T
    read: Callable[[Sequence[ir.Node]], Read]  # the form's "weight" nodes, in graph order
    folds_bias: bool = False  # the block bias is inside the form (else the block-bias term follows)
    nbits_blocks: bool = False  # MatMulNBits wants power-of-two blocks >= 16 (per-channel weights re-blocked)


# ---------------------------------------------------------------------------------------------------------
# nbits / nbits_fzp


def _matmul_nbits(
    e: Emitter,
    b: np.ndarray,
    scales: np.ndarray,
    zps: np.ndarray | None,
    w: BlockWeight,
    bits: int,
    level: int,
) -> ir.Value:
    inputs = [e.x, e.init("B", b), e.init("scales", scales.astype(_F32))]
    if zps is not None:
        inputs.append(e.init("zero_points", zps))
    attrs = {"K": w.k, "N": w.n, "bits": bits, "block_size": w.block_size}
    if level:  # omitted when 0, as ORT's own quantizer does: not every consumer knows it
        attrs["accuracy_level"] = level
    return e.op("MatMulNBits", inputs, domain="com.microsoft", **attrs)


def _packed(codes: np.ndarray, w: BlockWeight, bits: int) -> np.ndarray:
    """Codes [n, k] -> MatMulNBits' B [n, k_blocks, block bytes], the last block zero-padded."""
    pad = w.k_blocks * w.block_size - w.k
    codes = np.pad(codes, ((0, 0), (0, pad))) if pad else codes
    return pack_codes(codes, bits).reshape(w.n, w.k_blocks, w.block_size * bits // 8)


def _emit_nbits(e: Emitter, w: BlockWeight, level: int) -> ir.Value:
    zps = None if w.zero_points is None else pack_codes(w.zero_points, w.bits)
    return _matmul_nbits(e, _packed(w.codes, w, w.bits), w.scales, zps, w, w.bits, level)


def _emit_nbits_fzp(e: Emitter, w: BlockWeight, level: int) -> ir.Value:
    if w.bias is None:
        return _emit_nbits(e, w, level)
    codes, scales, zps = w.float_zero_points()
    return _matmul_nbits(e, _packed(codes, w, w.bits), scales, zps, w, w.bits, level)


def _read_nbits(nodes: Sequence[ir.Node]) -> Read:
    (node,) = nodes
    a = {k: v.value for k, v in node.attributes.items()}
    k, n, bits, bs = int(a["K"]), int(a["N"]), int(a.get("bits", 4)), int(a["block_size"])
    packed, scales = const_array(node.inputs[1]), const_array(node.inputs[2])
    if packed is None or scales is None:
        raise ValueError("MatMulNBits weights are not constants")
    kb = -(-k // bs)
    codes = unpack_codes(packed.reshape(n, -1), bits, kb * bs)[:, :k]
    scales = scales.reshape(n, kb).astype(_F32)
    zp = const_array(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    zero_points = bias = None
    if zp is not None and zp.dtype == np.uint8:
        zero_points = unpack_codes(zp.reshape(n, -1), bits, kb)
    elif zp is not None:  # float: (code - zf) s = (code - round(zf)) s + (round(zf) - zf) s
        zf = zp.reshape(n, kb).astype(_F32)
        zi = np.clip(np.round(zf), 0, (1 << bits) - 1)
        zero_points, bias = zi.astype(np.uint8), ((zi - zf) * scales).astype(_F32)
    weight = BlockWeight(bits, bs, k, n, codes, scales, zero_points, bias)
    return Read(weight, int(a.get("accuracy_level", 0)), node.inputs[0], node.outputs[0])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# nibbles


def _emit_nibbles(e: Emitter, w: BlockWeight, level: int) -> ir.Value:
    if w.bits != 8:
        raise ValueError(f"{e.name}: the nibbles form takes 8-bit weights, not {w.bits}-bit")
    zp = w.integer_zero_points()
    halves = []
    for half, part, zpart, scale in (
        ("hi", w.codes >> 4, zp >> 4, w.scales * _F32(16)),
        ("lo", w.codes & 15, zp & 15, w.scales),
    ):
        halves.append(_matmul_nbits(e, _packed(part, w, 4), scale, pack_codes(zpart, 4), w, 4, level))
        halves[-1].producer().metadata_props[_NIBBLE_KEY] = half  # type: ignore[union-attr]
    return e.op("Add", halves)


def _read_nibbles(nodes: Sequence[ir.Node]) -> Read:
    # NOTE: by tag, not position: a topological sort may put either half first
    by_half = {n.metadata_props.get(_NIBBLE_KEY): n for n in nodes}
    hi_node, lo_node, add = by_half["hi"], by_half["lo"], by_half[None]
    hi, lo = _read_nbits([hi_node]).weight, _read_nbits([lo_node]).weight
    assert isinstance(hi, BlockWeight) and isinstance(lo, BlockWeight)
    codes = (hi.codes << 4) | lo.codes
    zps = (hi.integer_zero_points() << 4) | lo.integer_zero_points()
    weight = BlockWeight(8, lo.block_size, lo.k, lo.n, codes, lo.scales, zps)
    level = int(lo_node.attributes["accuracy_level"].value) if "accuracy_level" in lo_node.attributes else 0
    return Read(weight, level, lo_node.inputs[0], add.outputs[0])  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# qdq


def _emit_qdq(e: Emitter, w: BlockWeight, level: int) -> ir.Value:
    # [k, n] with blocks along axis 0: the orientation MatMul wants and ORT's DQ -> MatMul fusion recognizes
    if w.zero_points is None:  # symmetric: signed codes, no zero point input
        q = (w.codes.astype(np.int16) - (1 << (w.bits - 1))).T.astype(np.int8)
        qtype = ir.DataType.INT4 if w.bits == 4 else ir.DataType.INT8
        inputs = [e.init("q", q, qtype), e.init("scales", w.scales.T.astype(_F32))]
    else:
        qtype = ir.DataType.UINT4 if w.bits == 4 else ir.DataType.UINT8
        inputs = [
            e.init("q", w.codes.T, qtype),
            e.init("scales", w.scales.T.astype(_F32)),
            e.init("zero_points", w.zero_points.T, qtype),
        ]
    wt = e.op("DequantizeLinear", inputs, axis=0, block_size=w.block_size)
    return e.op("MatMul", [e.x, wt])


def _read_qdq(nodes: Sequence[ir.Node]) -> Read:
    dq, mm = nodes
    q, scales = const_array(dq.inputs[0]), const_array(dq.inputs[1])
    if q is None or scales is None:
        raise ValueError("DequantizeLinear weights are not constants")
    bs, (k, n), kb = int(dq.attributes["block_size"].value), q.shape, scales.shape[0]
    qtype = dq.inputs[0].dtype  # type: ignore[union-attr]
    bits = 4 if qtype in (ir.DataType.INT4, ir.DataType.UINT4) else 8
    signed = qtype in (ir.DataType.INT4, ir.DataType.INT8)
    shift = (1 << (bits - 1)) if signed else 0
    codes = (q.astype(np.int16) + shift).T.astype(np.uint8)
    zp = const_array(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
    zero_points = None
    if zp is not None:
        zero_points = (zp.astype(np.int16) + shift).T.astype(np.uint8)
    elif not signed:
        zero_points = np.zeros((n, kb), np.uint8)
    weight = BlockWeight(bits, bs, k, n, codes, scales.T.astype(_F32).copy(), zero_points)
    return Read(weight, 0, mm.inputs[0], mm.outputs[0])  # type: ignore[arg-type]


FORMS: dict[str, Form] = {
    "nbits": Form(_emit_nbits, _read_nbits, nbits_blocks=True),
    "nbits_fzp": Form(_emit_nbits_fzp, _read_nbits, folds_bias=True, nbits_blocks=True),
    "nibbles": Form(_emit_nibbles, _read_nibbles, nbits_blocks=True),
    "qdq": Form(_emit_qdq, _read_qdq),
}


# ---------------------------------------------------------------------------------------------------------
# The block-bias term and float weights (shared by every form)


def emit_bias_term(e: Emitter, w: BlockWeight, main: ir.Value) -> ir.Value:
    """main + blocksum(x) @ bias^T: each block's bias times the sum of x over that block's inputs, x viewed as
    [.., k_blocks, block] (Reshape's 0 keeps x's leading dims)."""
    assert w.bias is not None
    bias, bs = _coarsest_bias(w)
    kb = w.k // bs
    if kb * bs != w.k:
        raise ValueError(f"{e.name}: a block bias needs k ({w.k}) a multiple of the block ({bs})")
    shape = e.init("block_shape", np.array([0] * (e.rank - 1) + [kb, bs], np.int64))
    axis = e.init("last_axis", np.array([-1], np.int64))
    sums = e.op("ReduceSum", [e.op("Reshape", [e.x, shape], "blocksum"), axis], "blocksum", keepdims=0)
    bias_t = e.init("bias_t", np.ascontiguousarray(bias.T.astype(_F32)))
    return e.op("Add", [main, e.op("MatMul", [sums, bias_t], "bias")], "bias")


def _coarsest_bias(w: BlockWeight) -> tuple[np.ndarray, int]:
    """(bias, block) over the largest span of whole blocks the bias is constant on: a weight split into finer
    blocks (BlockWeight.split_blocks) keeps its bias term at the original block, half the sums and bias bytes."""
    assert w.bias is not None
    bias, bs = w.bias, w.block_size
    while bias.shape[1] % 2 == 0 and w.k % (2 * bs) == 0 and np.array_equal(bias[:, 0::2], bias[:, 1::2]):
        bias, bs = np.ascontiguousarray(bias[:, 0::2]), 2 * bs
    return bias, bs


def read_bias_term(nodes: Sequence[ir.Node], x: ir.Value) -> tuple[np.ndarray, int, list[ir.Node]]:
    """The "bias" nodes (MatMul, Add) of a linear reading x -> (bias [n, k_blocks], block size, the Reshape and
    ReduceSum feeding them: possibly another linear's, after CSE)."""
    mm, _add = nodes
    bias_t, sums = const_array(mm.inputs[1]), mm.inputs[0].producer()  # type: ignore[union-attr]
    reshape = sums.inputs[0].producer() if sums is not None else None  # type: ignore[union-attr]
    shape = ints(reshape.inputs[1]) if reshape is not None else None
    if bias_t is None or reshape is None or shape is None or reshape.inputs[0] is not x:
        raise ValueError("the block-bias term does not read the linear's input")
    return np.ascontiguousarray(bias_t.T.astype(_F32)), shape[-1], [reshape, sums]  # type: ignore[list-item]


def emit_float(e: Emitter, w: np.ndarray) -> ir.Value:
    """x @ W^T with W^T [k, n] stored as is: a float16 W stays float16 behind a Cast (OpenVINO keeps it
    compressed)."""
    w_t = e.init("w_t", np.ascontiguousarray(w.T))
    if w.dtype == np.float16:
        w_t = e.op("Cast", [w_t], to=ir.DataType.FLOAT)
    return e.op("MatMul", [e.x, w_t])


def read_float(nodes: Sequence[ir.Node]) -> Read:
    mm = nodes[-1]
    w_value = mm.inputs[1]
    cast = w_value.producer() if w_value is not None else None
    if cast is not None and cast.op_type == "Cast":
        w_value = cast.inputs[0]
    wt = const_array(w_value)
    if wt is None or wt.ndim != 2:
        raise ValueError("the float weight is not a 2-D constant")
    return Read(np.ascontiguousarray(wt.T), 0, mm.inputs[0], mm.outputs[0])  # type: ignore[arg-type]


def per_channel_as_blocks(w: BlockWeight) -> BlockWeight:
    """One scale per row as MatMulNBits blocks: the largest power-of-two block (16..256) dividing k, the row's
    scale and zero point repeated per block (the same weights, ~1/bs more scale bytes); without one, a single
    padded block."""
    if w.k_blocks != 1 or (w.block_size >= 16 and not w.block_size & (w.block_size - 1)):
        return w
    bs = next((b for b in (256, 128, 64, 32, 16) if w.k % b == 0), None)
    if bs is None:
        return replace(w, block_size=max(16, 1 << (w.k - 1).bit_length()))
    kb = w.k // bs
    zps = None if w.zero_points is None else np.repeat(w.zero_points, kb, axis=1)
    bias = None if w.bias is None else np.repeat(w.bias, kb, axis=1)
    return replace(w, block_size=bs, scales=np.repeat(w.scales, kb, axis=1), zero_points=zps, bias=bias)


def unknown_form(name: str, form: str) -> ModelFormatError:
    return ModelFormatError(
        f"linear {name!r} is tagged with form(s) {form or 'none'}, which edge cannot read",
        hint=f"known forms: float, {', '.join(FORMS)}; rebuild the graph with this version of edge",
    )
