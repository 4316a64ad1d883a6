"""Lowering per target: the weight form each runtime runs best, and only the ops it has.

ort       linears as com.microsoft.MatMulNBits (+ the block-bias term for min-offset formats), 8-bit ones
          with fp32 activations as two 4-bit halves (`int8_nibbles`); the fusion passes before this one
          emit ORT contrib ops (SkipSimplifiedLayerNormalization, RotaryEmbedding)
openvino  the same MatMulNBits form (OpenVINO keeps it compressed: FullyConnected on u4/u8 weights), a
          block bias folded into float zero points (`float_zero_points`); fusions emit standard ONNX opset-23
          ops (RMSNormalization, RotaryEmbedding, Attention)
coreml    standard ONNX only: linears as DequantizeLinear (int4/uint4/int8/uint8, blocked) -> MatMul,
          no com.microsoft op anywhere (the op subset coremltools' MIL converter maps)
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import onnx_ir as ir

from edge.errors import ModelFormatError
from edge.graph_opt.linear import BlockWeight, LinearHeader, emit_linear, iter_linears, linear_names
from edge.graph_opt.manager import PassContext, graph_pass

__all__ = ["center_codes", "fine_qkv_blocks", "float_zero_points", "int8_nibbles", "lower", "lowering_for"]

FINE_BLOCK = 16  # fine_qkv_blocks' block: x quantized to int8 per 16 inputs
_QKV = re.compile(r"\.attn_(q|k|v|qkv)(\.weight|_fused)$")  # Q, K, V projections, fused or not


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
    n_linears = len(linear_names(model))
    changed = 0
    for i, lin in enumerate(iter_linears(model, ctx.spill)):
        w = lin.weight
        if not isinstance(w, BlockWeight):
            continue
        want = 0
        if form == "nbits":
            is_head = i == n_linears - 1 and _is_head(lin.name)
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


@graph_pass("int8_nibbles", targets=("ort",))
def int8_nibbles(model: ir.Model, ctx: PassContext) -> int:
    """8-bit MatMulNBits at accuracy level 0 (fp32 activations) -> two 4-bit MatMulNBits, one per nibble of
    each code, and an Add.

    ORT runs 8-bit weights with fp32 activations only on a slow path that dequantizes B on every call (5 ms
    for 896 x 4864 here, 490 ms for qwen2.5-0.5b's 896 x 151936 head), while its 4-bit fp32 kernels are fast
    (0.17 ms): two of them cost 0.33 ms and stay exact (code = 16 hi + lo, zero point = 16 zh + zl, so
    (code - zp) s = (hi - zh) 16 s + (lo - zl) s; the two fp32 products add with ~1e-7 relative error). Linears
    at accuracy level 4 (int8 activations, ORT's fast 8-bit path) are left as they are."""
    changed = 0
    for lin in iter_linears(
        model, ctx.spill, lambda h: h.form == "nbits" and h.bits == 8 and h.accuracy_level == 0
    ):
        w = lin.weight
        if lin.form == "nbits" and isinstance(w, BlockWeight) and w.bits == 8 and lin.accuracy_level == 0:
            emit_linear(model, lin, lowering="nibbles", accuracy_level=0)
            changed += 1
    return changed


@graph_pass("float_zero_points", targets=("openvino",))
def float_zero_points(model: ir.Model, ctx: PassContext) -> int:
    """A MatMulNBits followed by its block-bias term (Reshape, ReduceSum, MatMul, Add: min-offset formats
    such as GGUF Q4_1 / Q4_K and edge's asymmetric INT4 / INT8) -> the MatMulNBits alone, the bias folded
    into float zero points (zp = z - bias / scale). OpenVINO decompresses those inside its FullyConnected;
    ORT runs 4-bit float zero points only on a slow path and refuses 8-bit ones, so this is OpenVINO's."""
    changed = 0
    for lin in iter_linears(model, ctx.spill, lambda h: h.form == "nbits" and h.may_have_bias):
        w = lin.weight
        if lin.form == "nbits" and isinstance(w, BlockWeight) and w.bias is not None:
            emit_linear(model, lin, lowering="nbits_fzp")
            changed += 1
    return changed


@graph_pass("center_codes", targets=("ort", "openvino"))
def center_codes(model: ir.Model, ctx: PassContext) -> int:
    """Min-offset weights (GGUF Q4_1 / Q5_1 / K-quants: codes 0..2^b - 1 plus a per-block min) -> codes
    centred on the default zero point, the shift moved into the block-bias term (exact algebra:
    (q - z) s + b = (q' - mid) s + (b + (c - z) s) with q' = q - c + mid, c the codes' midpoint).

    For int8 activations (precision fast): the runtime quantizes x per block and multiplies it by the codes;
    its rounding error scales with |q - zero point|, so uncentred codes (all >= the zero point) err 6x more
    than llama.cpp on a Q4_1 tiny model (KL 4.4e-4 vs 7.3e-5), centred ones as much as it (llama.cpp applies
    the mins to the sums of the quantized x instead). No explicit zero points are left (none to read)."""
    changed = 0
    for lin in iter_linears(model, ctx.spill, lambda h: h.form == "nbits" and h.may_have_bias):
        w = lin.weight
        if not (lin.form == "nbits" and isinstance(w, BlockWeight)):
            continue
        if w.bias is None:
            continue  # no block bias (Q4_0, Q8_0, Q6_K: centred by design): adding one would cost a matmul
        lo, hi = int(w.codes.min()), int(w.codes.max())
        mid = 1 << (w.bits - 1)
        c = (lo + hi + 1) // 2
        codes = (w.codes.astype(np.int16) + (mid - c)).astype(np.uint8)
        z = w.integer_zero_points().astype(np.float32)
        bias = (w.bias + (np.float32(c) - z) * w.scales).astype(np.float32)
        centred = replace(w, codes=codes, zero_points=None, bias=bias)
        emit_linear(model, lin, centred, lowering="nbits")
        changed += 1
    return changed


@graph_pass("fine_qkv_blocks", targets=("ort", "openvino"))
def fine_qkv_blocks(model: ir.Model, ctx: PassContext) -> int:
    """4-bit Q, K, V projections at accuracy level 4 (int8 activations) -> blocks of 16 (each block's scale and
    bias repeated: the same weights exactly).

    ORT quantizes x to int8 per MatMulNBits block (one scale per 32 inputs for GGUF blocks, as llama.cpp's q8);
    a 16-element block scales the int8 steps to a smaller max. OpenVINO's dynamic quantization takes only
    groups divisible by its DQ group (32): these projections then run on f32 activations there. The attention
    projections are where that rounding costs most fidelity per byte
    (benchmarks/results/fidelity-smollm2-2026-12-01.md, smollm2-135m Q4_1, KL to the exact graph on the decode path: ORT 0.00346 -> 0.00285 at 0.99x decode, OpenVINO 0.00334 -> 0.00239;
    llama.cpp 0.00303. Every layer linear in 16-blocks: 0.00237 for +33%; the Q8_0 head: 0.00316 for +12%).
    The block-bias term stays at the file's blocks (forms.emit_bias_term), so only the scales double. 8-bit
    weights stay as they are (the 16-block head's cost)."""
    changed = 0

    def may_split(h: LinearHeader) -> bool:
        return h.form == "nbits" and h.bits == 4 and h.accuracy_level == 4 and bool(_QKV.search(h.name))

    for lin in iter_linears(model, ctx.spill, may_split):
        w = lin.weight
        if not (
            lin.form == "nbits"
            and isinstance(w, BlockWeight)
            and w.bits == 4
            and lin.accuracy_level == 4
            and w.block_size > FINE_BLOCK
            and w.block_size % FINE_BLOCK == 0
            and w.k % w.block_size == 0
            and _QKV.search(lin.name)
        ):
            continue
        emit_linear(model, lin, w.split_blocks(FINE_BLOCK), lowering="nbits")
        changed += 1
    return changed


def _is_head(name: str) -> bool:
    return name.startswith(("output.", "token_embd.")) or name in ("output", "token_embd")
