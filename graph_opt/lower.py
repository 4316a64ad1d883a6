"""Lowering per target: the weight form each runtime runs best, and only the ops it has.

ort       linears as com.microsoft.MatMulNBits (+ the block-bias term for min-offset formats); the
          fusion passes before this one emit ORT contrib ops (SkipSimplifiedLayerNormalization,
          RotaryEmbedding)
openvino  the same MatMulNBits form (OpenVINO keeps it compressed: FullyConnected on u4/u8 weights);
          fusions emit standard ONNX opset-23 ops (RMSNormalization, RotaryEmbedding, Attention)
coreml    standard ONNX only: linears as DequantizeLinear (int4/uint4/int8/uint8, blocked) -> MatMul,
          no com.microsoft op anywhere (the op subset coremltools' MIL converter maps)
"""

from __future__ import annotations

import onnx_ir as ir

from edge.errors import ModelFormatError
from graph_opt.linear import BlockWeight, emit_linear, find_linears
from graph_opt.manager import PassContext, graph_pass

__all__ = ["lower", "lowering_for"]


def lowering_for(target: str) -> str:
    return "qdq" if target == "coreml" else "nbits"


@graph_pass("lower")
def lower(model: ir.Model, ctx: PassContext) -> int:
    """Every linear -> the target's weight form (ort/openvino: MatMulNBits, coreml: DequantizeLinear + MatMul),
    MatMulNBits accuracy levels from ctx.options: 'head_accuracy_level' for the lm_head, else
    'int8_accuracy_level' for 8-bit weights, else 'accuracy_level' (None: as the graph has it); coreml: any
    com.microsoft op left is an error."""
    form = lowering_for(ctx.target)
    level = ctx.options.get("accuracy_level")
    int8_level = ctx.options.get("int8_accuracy_level")
    head_level = ctx.options.get("head_accuracy_level")
    linears = find_linears(model)
    changed = 0
    for i, lin in enumerate(linears):
        w = lin.weight
        if not isinstance(w, BlockWeight):
            continue
        want = 0
        if form == "nbits":
            is_head = i == len(linears) - 1 and _is_head(lin.name)
            chosen = next(
                (
                    c
                    for c in ((head_level if is_head else None), (int8_level if w.bits == 8 else None), level)
                    if c is not None
                ),
                None,
            )
            want = lin.accuracy_level if chosen is None else int(chosen)
        if lin.form != form or want != lin.accuracy_level:
            emit_linear(model, lin, lowering=form, accuracy_level=want)
            changed += 1
    if ctx.target == "coreml":
        contrib = sorted({n.op_type for n in model.graph.all_nodes() if n.domain == "com.microsoft"})
        if contrib:
            raise ModelFormatError(
                f"the coreml target takes standard ONNX ops only; left: {', '.join(contrib)}",
                hint="a fusion pass for another target ran on this graph",
            )
        model.opset_imports.pop("com.microsoft", None)
        model.graph.opset_imports.pop("com.microsoft", None)
    return changed


def _is_head(name: str) -> bool:
    return name.startswith(("output.", "token_embd.")) or name in ("output", "token_embd")
