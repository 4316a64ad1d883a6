"""Rotary embedding fusion: the NeoX-form RoPE the builder emits -> one rotary op per Q and per K.

    x * cos + (x @ R) * sin      MatMul, Mul, Mul, Add (4 nodes); R the [hd, hd] rotate-half permutation;
                                  x [1, q, heads.., hd] with the sequence on axis 1; cos/sin full-width tables
                                  Concat(c, c) [q, hd] of this step's positions (c = cos(pos * inv_freq)),
                                  possibly times the attention scale, unsqueezed to broadcast over the heads
      ort       -> com.microsoft.RotaryEmbedding(x3, position_ids=[0], cos_cache=c, sin_cache=s)
    where x3 = x viewed as [1, q, heads * hd] (the projection output itself when x is its Reshape).

Not for OpenVINO: 2026.4 imports ONNX RotaryEmbedding (opset 23) as its RoPE op and computes it right on the
first compile, but a model holding it gives wrong results (errors ~1e4, different each load) once it is
loaded back from the compile cache (CACHE_DIR), measured on smollm2; OpenVINO fuses the builder's
elementwise form into its RoPE kernel by itself.

NOTE: the caches are the step's own rows (computed in the graph from `positions`), so the op's position ids are
0..q-1: exact for any absolute position, no table of max_position rows and no bound on the context.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from edge.graph_opt._rules import apply_rules, const_array, ints, scalar, source_reshape
from edge.graph_opt.manager import PassContext, graph_pass

__all__ = ["rotary"]


def _is_rotate_half(arr: np.ndarray | None) -> bool:
    if arr is None or arr.ndim != 2 or arr.shape[0] != arr.shape[1] or arr.shape[0] % 2:
        return False
    hd = arr.shape[0]
    half = hd // 2
    want = np.zeros((hd, hd), arr.dtype)
    want[np.arange(half) + half, np.arange(half)] = -1
    want[np.arange(half), np.arange(half) + half] = 1
    return bool(np.array_equal(arr, want))


@dataclass(frozen=True)
class _Table:
    half: ir.Value  # [q, hd/2]: cos or sin of this step's angles
    scale: float  # multiplier folded into the table (the attention scale for queries)
    rank: int  # rank of the broadcast table (x's rank - 1)


def _trace_table(value: ir.Value) -> _Table | None:
    """cos/sin as the builder makes them: Unsqueeze(axes 1..)? of Mul(Concat(c, c), scale)? -> (c, scale)."""
    rank, scale = 2, 1.0
    node = value.producer()
    if node is not None and node.op_type == "Unsqueeze":
        axes = ints(node.inputs[1])
        if axes is None or axes != list(range(1, len(axes) + 1)):
            return None
        rank += len(axes)
        value = node.inputs[0]  # type: ignore[assignment]
        node = value.producer()
    if node is not None and node.op_type == "Mul":
        factor = scalar(node.inputs[1])
        if factor is None:
            return None
        scale = factor
        value = node.inputs[0]  # type: ignore[assignment]
        node = value.producer()
    if node is None or node.op_type != "Concat" or len(node.inputs) != 2:
        return None
    if node.inputs[0] is not node.inputs[1] or node.attributes["axis"].as_int() not in (-1, 1):
        return None
    return _Table(node.inputs[0], scale, rank)  # type: ignore[arg-type]


def _head_shape(x: ir.Value) -> tuple[ir.Value | None, list[int]] | None:
    """(the 3-D projection output x is a view of, when x is that Reshape itself; x's dims after [1, q])."""
    found = source_reshape(x)
    if found is None:
        return None
    node, direct = found
    shape = ints(node.inputs[1])
    if shape is None or len(shape) < 3 or shape[:2] not in ([1, -1], [0, 0]) or min(shape[2:]) < 1:
        return None
    return (node.inputs[0] if direct else None), shape[2:]


class _Rope(pattern.RewriteRuleClassBase):
    def __init__(self) -> None:
        super().__init__("Rope")

    def pattern(self, op, x, rot, cos, sin):  # type: ignore[no-untyped-def]
        return op.Add(op.Mul(x, cos), op.Mul(op.MatMul(x, rot), sin))

    def check(self, context, x, rot, cos, sin, **_):  # type: ignore[no-untyped-def]
        result = pattern.MatchResult()
        if not _is_rotate_half(const_array(rot)):
            return result.fail("the matmul is not rotate-half", rot)
        tc, ts = _trace_table(cos), _trace_table(sin)
        if tc is None or ts is None:
            return result.fail("cos/sin are not per-step tables Concat(c, c)", [cos, sin])
        if tc.scale != ts.scale or tc.rank != ts.rank:
            return result.fail("cos and sin tables differ in scale or broadcast")
        heads = _head_shape(x)
        if heads is None:
            return result.fail("x is not a [1, q, heads.., hd] view of a projection", x)
        if len(heads[1]) + 1 != tc.rank:
            return result.fail("the tables do not put the sequence on axis 1 of x")
        return result

    def rewrite(self, op, x, rot, cos, sin, **_):  # type: ignore[no-untyped-def]
        tc, ts = _trace_table(cos), _trace_table(sin)
        assert tc is not None and ts is not None
        source, dims = _head_shape(x)  # type: ignore[misc]
        n_heads = math.prod(dims[:-1])
        x3 = source if source is not None else op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))

        def cache(t: _Table) -> ir.Value:
            return t.half if t.scale == 1.0 else op.Mul(t.half, op.Constant(value_float=t.scale))

        y3 = op.RotaryEmbedding(
            x3,
            op.Constant(value_ints=[0]),
            cache(tc),
            cache(ts),
            interleaved=0,
            num_heads=n_heads,
            _domain="com.microsoft",
        )
        return op.Reshape(y3, op.Constant(value_ints=[0, 0, *dims]))


@graph_pass("rotary", targets=("ort",))
def rotary(model: ir.Model, ctx: PassContext) -> int:
    """x*cos + (x@R)*sin (4 nodes, R = rotate-half) on a [1, q, heads.., hd] view -> one com.microsoft
    RotaryEmbedding on the [1, q, heads*hd] projection output."""
    return apply_rules(model, [_Rope.rule()], commute=True)
