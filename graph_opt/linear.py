"""Linear layers in an ONNX graph, whatever form they were emitted in, as one record a pass can re-emit.

A linear computes y = x @ W^T for a weight W [n, k] held as an initializer. Forms recognized (the three
lowerings models/weights.py emits, plus plain float MatMuls):

    nbits   com.microsoft.MatMulNBits(x, B, scales[, zero_points])       codes packed along k
    qdq     MatMul(x, DequantizeLinear(q [k, n], scales [k/bs, n][, zp], axis 0, block_size))
    float   MatMul(x, W^T [k, n])  or  MatMul(x, Cast(W^T float16))
  each optionally followed by the block-bias term of GGUF's min-offset formats (Q4_1, K-quants):
            Add(main, MatMul(ReduceSum(Reshape(x, [.., k/bs, bs]), -1), bias^T))

`BlockWeight` is the quantized form (codes, per-block scales, integer zero points, per-block bias);
`emit_linear` writes a linear back as MatMulNBits ("nbits") or DequantizeLinear + MatMul ("qdq").
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from edge.graph_opt._rules import const_array, ints

__all__ = ["BlockWeight", "Linear", "emit_linear", "find_linears", "pack_codes", "unpack_codes"]

_F32 = np.float32


@dataclass(frozen=True, eq=False)
class BlockWeight:
    """W[r, j] = (codes[r, j] - zero_points[r, j // bs]) * scales[r, j // bs] (+ bias[r, j // bs]).

    `block_size` may exceed k (one block per row: per-channel); the codes are then padded to whole blocks when
    packed. zero_points None means the symmetric default 2^(bits - 1)."""

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
        """W float32 [n, k]."""
        pad = self.k_blocks * self.block_size - self.k
        codes = np.pad(self.codes, ((0, 0), (0, pad))) if pad else self.codes
        q = codes.reshape(self.n, self.k_blocks, self.block_size).astype(np.int16)
        q -= self.integer_zero_points()[..., None]
        w = q.astype(_F32) * self.scales[..., None]
        if self.bias is not None:
            w += self.bias[..., None]
        return w.reshape(self.n, -1)[:, : self.k]

    @property
    def nbytes(self) -> int:
        """Bytes as stored: packed codes plus scales, zero points and bias."""
        size = self.n * self.k_blocks * self.block_size * self.bits // 8 + self.scales.nbytes
        if self.zero_points is not None:
            size += self.n * (-(-self.k_blocks * self.bits // 8))
        return size + (self.bias.nbytes if self.bias is not None else 0)


@dataclass
class Linear:
    """One linear layer found in a graph: the nodes computing y from x and its weight."""

    name: str  # the weight's name (initializer prefix)
    x: ir.Value
    y: ir.Value
    nodes: list[ir.Node]
    weight: BlockWeight | np.ndarray  # quantized, or float W [n, k] (float32 / float16)
    accuracy_level: int = 0
    form: str = "float"  # how the graph holds it now: nbits | qdq | float

    @property
    def n(self) -> int:
        return self.weight.n if isinstance(self.weight, BlockWeight) else int(self.weight.shape[0])

    @property
    def k(self) -> int:
        return self.weight.k if isinstance(self.weight, BlockWeight) else int(self.weight.shape[1])

    def float_weight(self) -> np.ndarray:
        w = self.weight
        return w.dequantize() if isinstance(w, BlockWeight) else w.astype(_F32)

    def describe(self) -> str:
        w = self.weight
        if isinstance(w, BlockWeight):
            kind = "sym" if w.symmetric else ("asym" if w.bias is None else "asym+bias")
            return f"int{w.bits} g{w.block_size} {kind}"
        return str(w.dtype)


# ---------------------------------------------------------------------------------------------------------
# Packing (MatMulNBits' layout: low bits first along k, blocks padded)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 [r, c] -> [r, ceil(c * bits / 8)] packed low-bits-first."""
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


# ---------------------------------------------------------------------------------------------------------
# Recognition


def _consumers(value: ir.Value) -> list[ir.Node]:
    return [use.node for use in value.uses()]


def _single_consumer(value: ir.Value, op_type: str) -> ir.Node | None:
    users = _consumers(value)
    if len(users) == 1 and users[0].op_type == op_type and not value.is_graph_output():
        return users[0]
    return None


def _bias_term(x: ir.Value, main: ir.Value) -> tuple[list[ir.Node], ir.Value, np.ndarray, int] | None:
    """The block-bias Add after a main matmul: (its nodes, y, bias [n, k_blocks], block size)."""
    add = _single_consumer(main, "Add")
    if add is None:
        return None
    other = add.inputs[1] if add.inputs[0] is main else add.inputs[0]
    node = other.producer() if other is not None else None
    nodes: list[ir.Node] = []
    if node is not None and node.op_type == "Reshape" and node.inputs[1] is not None:
        shape_node = node.inputs[1].producer()
        if shape_node is None or shape_node.op_type != "Shape" or shape_node.inputs[0] is not main:
            return None
        nodes += [node, shape_node]
        node = node.inputs[0].producer()  # type: ignore[union-attr]
    if node is None or node.op_type != "MatMul":
        return None
    bias_t = const_array(node.inputs[1])
    sums = node.inputs[0].producer()  # type: ignore[union-attr]
    if bias_t is None or bias_t.ndim != 2 or sums is None or sums.op_type != "ReduceSum":
        return None
    reshape = sums.inputs[0].producer()  # type: ignore[union-attr]
    if reshape is None or reshape.op_type != "Reshape" or reshape.inputs[0] is not x:
        return None
    block_shape = ints(reshape.inputs[1])
    if block_shape is None or len(block_shape) < 2 or block_shape[-2] != bias_t.shape[0]:
        return None
    for v in (reshape.outputs[0], sums.outputs[0], node.outputs[0]):
        if len(v.uses()) != 1 or v.is_graph_output():
            return None
    nodes += [reshape, sums, node, add]
    return nodes, add.outputs[0], np.ascontiguousarray(bias_t.T.astype(_F32)), block_shape[-1]


def _from_matmul_nbits(node: ir.Node) -> Linear | None:
    a = {k: v.value for k, v in node.attributes.items()}
    k, n, bits, bs = a.get("K"), a.get("N"), a.get("bits", 4), a.get("block_size")
    packed = const_array(node.inputs[1])
    scales = const_array(node.inputs[2]) if len(node.inputs) > 2 else None
    if None in (k, n, bs) or packed is None or scales is None or len(node.inputs) > 4:
        return None
    kb = -(-k // bs)
    codes = unpack_codes(packed.reshape(n, -1), bits, kb * bs)[:, :k]
    scales = scales.reshape(n, kb).astype(_F32)
    zp_arr = const_array(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    zero_points = bias = None
    if zp_arr is not None:
        if zp_arr.dtype == np.uint8:
            zero_points = unpack_codes(zp_arr.reshape(n, -1), bits, kb)
        else:  # float zero points: W = (code - zp) * s = (code - round(zp)) * s + (round(zp) - zp) * s
            zf = zp_arr.reshape(n, kb).astype(_F32)
            zi = np.clip(np.round(zf), 0, (1 << bits) - 1)
            zero_points = zi.astype(np.uint8)
            bias = ((zi - zf) * scales).astype(_F32)
    weight = BlockWeight(bits, bs, k, n, codes, scales, zero_points, bias)
    x, main = node.inputs[0], node.outputs[0]
    nodes, y = [node], main
    term = _bias_term(x, main)  # type: ignore[arg-type]
    if term is not None and term[3] == bs and term[2].shape == (n, kb):
        extra, y, b, _ = term
        nodes += extra
        weight = replace(weight, bias=b if weight.bias is None else weight.bias + b)
    name = node.inputs[1].name or node.name or "linear"  # type: ignore[union-attr]
    level = int(a.get("accuracy_level", 0))  # type: ignore[arg-type]
    return Linear(name.removesuffix(".B"), x, y, nodes, weight, level, "nbits")  # type: ignore[arg-type]


def _from_dq_matmul(mm: ir.Node, dq: ir.Node) -> Linear | None:
    q = const_array(dq.inputs[0])
    scales = const_array(dq.inputs[1])
    if q is None or scales is None or q.ndim != 2 or scales.ndim != 2:
        return None
    axis = dq.attributes.get("axis")
    bs_attr = dq.attributes.get("block_size")
    if axis is None or axis.as_int() != 0 or bs_attr is None:
        return None
    bs, (k, n) = bs_attr.as_int(), q.shape
    kb = scales.shape[0]
    zp = const_array(dq.inputs[2]) if len(dq.inputs) > 2 and dq.inputs[2] is not None else None
    signed = q.dtype == np.int8 or (dq.inputs[0].dtype in (ir.DataType.INT4, ir.DataType.INT8))  # type: ignore[union-attr]
    bits = 4 if dq.inputs[0].dtype in (ir.DataType.INT4, ir.DataType.UINT4) else 8  # type: ignore[union-attr]
    mid = 1 << (bits - 1)
    codes = (q.astype(np.int16) + (mid if signed else 0)).T.astype(np.uint8)
    zero_points = None
    if zp is not None:
        zero_points = (zp.astype(np.int16) + (mid if signed else 0)).T.astype(np.uint8)
    elif not signed:
        zero_points = np.zeros((n, kb), np.uint8)
    weight = BlockWeight(bits, bs, k, n, codes, scales.T.astype(_F32).copy(), zero_points)
    x, main = mm.inputs[0], mm.outputs[0]
    nodes, y = [dq, mm], main
    term = _bias_term(x, main)  # type: ignore[arg-type]
    if term is not None and term[3] == bs and term[2].shape == (n, kb):
        extra, y, b, _ = term
        nodes += extra
        weight = replace(weight, bias=b)
    name = (dq.inputs[0].name or "linear").removesuffix(".q")  # type: ignore[union-attr]
    return Linear(name, x, y, nodes, weight, 0, "qdq")  # type: ignore[arg-type]


def _from_float_matmul(mm: ir.Node, min_dim: int) -> Linear | None:
    w_value = mm.inputs[1]
    cast = w_value.producer() if w_value is not None else None
    nodes = [mm]
    if cast is not None and cast.op_type == "Cast":
        if len(cast.outputs[0].uses()) != 1:
            return None
        nodes.insert(0, cast)
        w_value = cast.inputs[0]
    wt = const_array(w_value)
    if wt is None or wt.ndim != 2 or wt.dtype.kind != "f" or min(wt.shape) < min_dim:
        return None
    name = (w_value.name or "linear").removesuffix(".w_t")  # type: ignore[union-attr]
    return Linear(name, mm.inputs[0], mm.outputs[0], nodes, np.ascontiguousarray(wt.T))  # type: ignore[arg-type]


def find_linears(model: ir.Model, *, min_dim: int = 16) -> list[Linear]:
    """Every linear layer of the graph, in graph order. Float matmuls count when both dims of the constant
    weight are >= min_dim (the RoPE rotate-half matrix, [hd, hd] of 0/+-1, is excluded by name of its form:
    it is not a weight any quantizer should touch)."""
    found: list[Linear] = []
    claimed: set[int] = set()
    nodes = list(model.graph)
    for node in nodes:
        if node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            lin = _from_matmul_nbits(node)
        elif node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
            w = node.inputs[1]
            producer = w.producer() if w is not None else None
            if producer is not None and producer.op_type == "DequantizeLinear":
                lin = _from_dq_matmul(node, producer)
            else:
                lin = None
        else:
            continue
        if lin is not None:
            found.append(lin)
            claimed.update(id(n) for n in lin.nodes)
    for node in nodes:
        if id(node) in claimed or node.op_type != "MatMul" or node.domain not in ("", "ai.onnx"):
            continue
        lin = _from_float_matmul(node, min_dim)
        if lin is None or _is_signed_permutation(lin.weight):  # type: ignore[arg-type]
            continue
        found.append(lin)
    order = {id(n): i for i, n in enumerate(nodes)}
    return sorted(found, key=lambda lin: order[id(lin.nodes[-1])])


def _is_signed_permutation(w: np.ndarray) -> bool:
    return w.shape[0] == w.shape[1] and bool(np.all(np.isin(w, (-1.0, 0.0, 1.0))))


# ---------------------------------------------------------------------------------------------------------
# Emission


def _init(model: ir.Model, name: str, array: np.ndarray, dtype: ir.DataType | None = None) -> ir.Value:
    graph = model.graph
    base, i = name, 1
    while name in graph.initializers:
        name, i = f"{base}.{i}", i + 1
    tensor = ir.tensor(np.ascontiguousarray(array), dtype=dtype, name=name)
    value = ir.Value(
        name=name, const_value=tensor, shape=ir.Shape(array.shape), type=ir.TensorType(tensor.dtype)
    )
    graph.register_initializer(value)
    return value


def _per_channel_as_blocks(w: BlockWeight) -> BlockWeight:
    """One scale per row as MatMulNBits blocks: the largest power-of-two block (16..256) dividing k, the row's
    scale and zero point repeated per block (the same weights, ~1/bs more scale bytes); without one, a single
    padded block."""
    bs = next((b for b in (256, 128, 64, 32, 16) if w.k % b == 0), None)
    if bs is None:
        return replace(w, block_size=max(16, 1 << (w.k - 1).bit_length()))
    kb = w.k // bs
    zps = None if w.zero_points is None else np.repeat(w.zero_points, kb, axis=1)
    bias = None if w.bias is None else np.repeat(w.bias, kb, axis=1)
    return replace(w, block_size=bs, scales=np.repeat(w.scales, kb, axis=1), zero_points=zps, bias=bias)


def float_zero_point_form(
    scales: np.ndarray, zero_points: np.ndarray, bias: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(scales, float zero points) [n, k_blocks] with (code - zp) * scale == (code - z) * s + bias, i.e.
    zp = z - bias / s. A block with scale 0 (every weight equals its bias) gets scale := bias, zp := z: exact
    when its codes are z + 1 (the caller's part; models/weights.py normalizes them so at import)."""
    z = zero_points.astype(_F32)
    zero = scales == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        fzp = np.where(zero, z, z - bias / np.where(zero, _F32(1), scales)).astype(_F32)
    return np.where(zero, bias, scales).astype(_F32), fzp


def _float_zero_points(w: BlockWeight, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`float_zero_point_form` of a weight with a block bias, as (codes, scales, zero points); its scale-0
    blocks get zero point 0 and codes 1."""
    assert w.bias is not None
    zero = w.scales == 0
    z = np.where(zero, 0, w.integer_zero_points())
    if zero.any():
        blocks = codes.reshape(w.n, w.k_blocks, w.block_size).copy()
        blocks[zero] = 1
        codes = blocks.reshape(w.n, -1)
    return (codes, *float_zero_point_form(w.scales, z, w.bias))


def _emit_nodes(
    model: ir.Model, lin: Linear, weight: BlockWeight | np.ndarray, lowering: str, accuracy_level: int
) -> tuple[list[ir.Node], ir.Value]:
    """New nodes computing lin.x @ weight^T; the last value is the result."""
    x, p = lin.x, lin.name
    nodes: list[ir.Node] = []
    if isinstance(weight, np.ndarray):
        w_t = _init(model, f"{p}.w_t", np.ascontiguousarray(weight.T))
        if weight.dtype == np.float16:
            cast = ir.Node("", "Cast", [w_t], [ir.Attr("to", ir.AttributeType.INT, ir.DataType.FLOAT.value)])
            nodes.append(cast)
            w_t = cast.outputs[0]
        nodes.append(ir.Node("", "MatMul", [x, w_t]))
        return nodes, nodes[-1].outputs[0]
    w = weight
    if (
        lowering in ("nbits", "nibbles", "nbits_fzp")
        and w.k_blocks == 1
        and (w.block_size < 16 or w.block_size & (w.block_size - 1))
    ):
        w = _per_channel_as_blocks(w)  # MatMulNBits wants a power-of-two block
    kb, bs = w.k_blocks, w.block_size
    codes = np.pad(w.codes, ((0, 0), (0, kb * bs - w.k))) if kb * bs != w.k else w.codes
    if lowering == "nibbles":
        if w.bits != 8:
            raise ValueError(f"{p}: the nibbles lowering takes 8-bit weights, not {w.bits}-bit")
        # code = 16 hi + lo and zp = 16 zh + zl, so (code - zp) s = (hi - zh) 16 s + (lo - zl) s exactly
        zp = w.integer_zero_points()
        halves = []
        for tag, part, zpart, scale in (
            ("hi", codes >> 4, zp >> 4, w.scales * _F32(16)),
            ("lo", codes & 15, zp & 15, w.scales),
        ):
            halves.append(
                ir.Node(
                    "com.microsoft",
                    "MatMulNBits",
                    [
                        x,
                        _init(model, f"{p}.B_{tag}", pack_codes(part, 4).reshape(w.n, kb, bs // 2)),
                        _init(model, f"{p}.scales_{tag}", scale.astype(_F32)),
                        _init(model, f"{p}.zero_points_{tag}", pack_codes(zpart, 4)),
                    ],
                    [
                        ir.Attr(k, ir.AttributeType.INT, v)
                        for k, v in {"K": w.k, "N": w.n, "bits": 4, "block_size": bs}.items()
                    ],
                )
            )
        nodes += [*halves, ir.Node("", "Add", [halves[0].outputs[0], halves[1].outputs[0]])]
    elif lowering in ("nbits", "nbits_fzp"):
        scales, zps = (
            w.scales.astype(_F32),
            None if w.zero_points is None else pack_codes(w.zero_points, w.bits),
        )
        if lowering == "nbits_fzp" and w.bias is not None:
            codes, scales, zps = _float_zero_points(w, codes)
            w = replace(w, bias=None)  # folded into the zero points
        inputs = [
            x,
            _init(model, f"{p}.B", pack_codes(codes, w.bits).reshape(w.n, kb, bs * w.bits // 8)),
            _init(model, f"{p}.scales", scales),
        ]
        if zps is not None:
            inputs.append(_init(model, f"{p}.zero_points", zps))
        attrs = {"K": w.k, "N": w.n, "bits": w.bits, "block_size": bs}
        if accuracy_level:
            attrs["accuracy_level"] = accuracy_level
        nodes.append(
            ir.Node(
                "com.microsoft",
                "MatMulNBits",
                inputs,
                [ir.Attr(k, ir.AttributeType.INT, v) for k, v in attrs.items()],
            )
        )
    elif lowering == "qdq":
        mid = 1 << (w.bits - 1)
        if w.zero_points is None:  # symmetric: signed codes, no zero point input
            q = (w.codes.astype(np.int16) - mid).T.astype(np.int8)
            qtype = ir.DataType.INT4 if w.bits == 4 else ir.DataType.INT8
            dq_inputs = [
                _init(model, f"{p}.q", q, qtype),
                _init(model, f"{p}.scales", w.scales.T.astype(_F32)),
            ]
        else:
            qtype = ir.DataType.UINT4 if w.bits == 4 else ir.DataType.UINT8
            dq_inputs = [
                _init(model, f"{p}.q", w.codes.T, qtype),
                _init(model, f"{p}.scales", w.scales.T.astype(_F32)),
                _init(model, f"{p}.zero_points", w.zero_points.T, qtype),
            ]
        dq = ir.Node(
            "",
            "DequantizeLinear",
            dq_inputs,
            [ir.AttrInt64("axis", 0), ir.AttrInt64("block_size", bs)],
        )
        nodes += [dq, ir.Node("", "MatMul", [x, dq.outputs[0]])]
    else:
        raise ValueError(f"unknown lowering {lowering!r}; expected nbits, nibbles or qdq")
    main = nodes[-1].outputs[0]
    if w.bias is None:
        return nodes, main
    # the block-bias term (see models/weights.py): sum of x over each block times that block's bias
    rank = len(x.shape) if x.shape is not None else 3  # decoder activations are [batch, seq, k]
    shape = _init(model, f"{p}.block_shape", np.array([0] * (rank - 1) + [kb, bs], np.int64))
    axis = _init(model, f"{p}.last_axis", np.array([-1], np.int64))
    bias_t = _init(model, f"{p}.bias_t", np.ascontiguousarray(w.bias.T.astype(_F32)))
    blocks = x if kb * bs == w.k else None
    if blocks is None:
        raise ValueError(f"{p}: a block bias needs k ({w.k}) a multiple of the block ({bs})")
    reshape = ir.Node("", "Reshape", [x, shape])
    sums = ir.Node("", "ReduceSum", [reshape.outputs[0], axis], [ir.AttrInt64("keepdims", 0)])
    bias_mm = ir.Node("", "MatMul", [sums.outputs[0], bias_t])
    add = ir.Node("", "Add", [main, bias_mm.outputs[0]])
    nodes += [reshape, sums, bias_mm, add]
    return nodes, add.outputs[0]


def emit_linear(
    model: ir.Model,
    lin: Linear,
    weight: BlockWeight | np.ndarray | None = None,
    *,
    lowering: str = "nbits",
    accuracy_level: int | None = None,
) -> Linear:
    """Replace a linear's nodes with `weight` (default: its own) lowered as `lowering`; the new record."""
    weight = lin.weight if weight is None else weight
    level = lin.accuracy_level if accuracy_level is None else accuracy_level
    nodes, y = _emit_nodes(model, lin, weight, lowering, level)
    graph = model.graph
    anchor = lin.nodes[-1]
    graph.insert_after(anchor, nodes)
    ir.convenience.replace_all_uses_with(lin.y, y, replace_graph_outputs=True)
    if lin.y.is_graph_output() or lin.y.name:
        name = lin.y.name
        lin.y.name = None
        y.name = name
    graph.remove(lin.nodes, safe=True)  # safe: also drops them as users of their inputs (the old weights)
    form = "float" if isinstance(weight, np.ndarray) else lowering
    return Linear(lin.name, lin.x, y, nodes, weight, level, form)
