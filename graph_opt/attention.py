"""Attention fusion: the builder's split past/new attention -> one ONNX Attention (opset 23) op.

The builder never concatenates the past with the new K/V (scores over past slots and over new tokens are two
matmuls, joined only at the softmax):

    s = Concat(q @ K_past^T, q @ K_new^T) + mask;  p = Softmax(s);  p_past, p_new = Split(p)
    ctx = p_past @ V_past + p_new @ V_new           (~19 nodes per layer: Transposes, Unsqueezes, MatMuls..)

  -> Attention(q3, Concat(K_past, K_new), Concat(V_past, V_new), attn_mask=mask)   (heads: see below)
     with q3 [1, q, h*hd], K/V [1, L+q, kvh*hd] (slot-major buffers viewed flat: no transpose), the additive
     mask as given ([1, 1, q, L+q]), scale 1 (the builder folds the scale into the query's RoPE tables);
     the output [1, q, h*hd] is what the output projection reads (5 nodes per layer).

Exact: the same softmax over the same columns in the same order. The price is the Concat, a copy of the bound
past per layer per step; the decode benchmark decides whether a target takes this pass (see
benchmarks/graph_passes.py).

Grouped queries ride as rows: with grp = h / kvh > 1 query heads per K/V head, the Attention op gets kvh heads
of grp * q query rows each (group-major rows, the mask tiled grp times) instead of h heads of q rows. ORT's CPU
Attention runs one SGEMM per query head against that head's K and one against its V (ComputeAttentionProbs and
ComputeVxAttentionScore in core/providers/cpu/llm/attention.cc), each reading the whole K/V head:
with h heads every K/V head goes through that grp times, with kvh heads once. Same dot products, same order:
bit-identical context whenever a forward has >= 2 query rows (the staged graphs always do: their padding row).
A one-row forward of an unstaged graph now runs MLAS's many-row kernel (grp rows), which rounds within ulps of
its one-row kernel (`python benchmarks/attention_heads.py --rows 1`, removed at bfd5c8d). Timed alone, 30
layers, 2 query rows, 2 threads, AVX2 EPYC (`python benchmarks/attention_heads.py [--heads 14 --kv-heads 2]`,
benchmarks/results/attention-heads-2026-12-02.md):
smollm2-135m's 9 / 3 heads at 512 / 1,024 past slots 11.3 -> 7.7 / 29.5 -> 18.2 ms, qwen2.5-coder-0.5b's
14 / 2 heads 10.8 -> 7.6 / 32.4 -> 17.6 ms. The price is in prefill: ORT parallelizes the op over its heads
only, and kvh heads of grp * 257 rows split worse over the threads than h heads of 257 rows (gemma3-270m has
one K/V head): a 512-token prompt on 2 threads took 5-10% longer (smollm2-135m 454 -> 414 tok/s, gemma3-270m
378 -> 352, qwen2.5-coder-0.5b 137 -> 131; the two graphs in one process, turn about, 4 rounds). An If on the
row count could keep both; tried, OpenVINO computed that If wrongly (max abs error 12 on the tiny llama), and
both branches agree bit for bit only from 2 rows, so it is not taken.

Why not ORT's own ops (checked against ORT 1.32's schemas): GroupQueryAttention keeps its cache in BNSH
[1, kvh, S, hd] and writes new K/V at rows [past, past + q) itself (or returns past ++ new), which is neither our
slot-major [1, S, kvh, hd] ring layout nor the ring's slot order after a wrap; MultiHeadAttention needs as many
K/V heads as query heads (a repeat of the past per step) and a BNSH past.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from edge.graph_opt._rules import apply_rules, const_array, ensure_opset, ints, source_reshape
from edge.graph_opt.manager import PassContext, graph_pass

__all__ = ["attention"]


def _per_slot_source(q5: ir.Value) -> ir.Value:
    """The packed queries a slot_axis graph gathered per slot (Squeeze(Gather(q, slot_rows), 0)), else q5."""
    node = q5.producer()
    if node is not None and node.op_type == "Squeeze":
        inner = node.inputs[0].producer() if node.inputs[0] is not None else None
        index = inner.inputs[1] if inner is not None and inner.op_type == "Gather" else None
        if index is not None and index.name == "slot_rows":
            return inner.inputs[0]  # type: ignore[return-value,union-attr]
    return q5


def _head_dims(q5: ir.Value) -> list[int] | None:
    """[kvh, grp, hd] of the queries, from the Reshape that shaped them (through RoPE and norms, and a
    slot_axis graph's gather per slot)."""
    found = source_reshape(_per_slot_source(q5))
    dims = ints(found[0].inputs[1]) if found is not None else None
    if dims is None or len(dims) != 5 or min(dims[2:]) < 1:
        return None
    return dims[2:]


def _query_3d(op, q5: ir.Value) -> ir.Value:  # type: ignore[no-untyped-def]
    """[1, q, kvh, grp, hd] -> [1, q, h*hd]: the Reshape's own input when q5 is a Reshape of a 3-D tensor."""
    node = q5.producer()
    if node is not None and node.op_type == "Reshape":
        shape = ints(node.inputs[1])
        if shape is not None and shape[:2] == [0, 0]:  # the rotary pass's reshape of a [1, q, h*hd] output
            return node.inputs[0]  # type: ignore[return-value]
    return op.Reshape(q5, op.Constant(value_ints=[0, 0, -1]))


def _mask_4d(mask5: ir.Value) -> ir.Value | None:
    node = mask5.producer()
    if node is None or node.op_type != "Unsqueeze" or ints(node.inputs[1]) != [2]:
        return None
    return node.inputs[0]


def _flat(op, past, new):  # type: ignore[no-untyped-def]
    """Past ++ new slots [1, L, kvh, hd] viewed as [1, L, kvh*hd] (slot-major: no transpose)."""
    return op.Reshape(op.Concat(past, new, axis=1), op.Constant(value_ints=[0, 0, -1]))


def _grouped_attention(op, q3, keys, values, mask4, dims, out_shape=None):  # type: ignore[no-untyped-def]
    """Attention of q3 [1, q, h*hd] over keys / values [1, L, kvh*hd] with mask4 [1, 1, q, L] -> [1, q, h*hd]
    (or `out_shape`), each K/V head's grp query heads as grp * q rows of one head (see the module's
    docstring)."""
    kvh, grp, hd = dims
    if grp == 1:
        ctx = op.Attention(q3, keys, values, mask4, q_num_heads=kvh, kv_num_heads=kvh, scale=1.0)
        return ctx if out_shape is None else op.Reshape(ctx, out_shape)
    # [1, q, kvh, grp, hd] -> [1, grp, q, kvh, hd] -> rows g * q + r of kvh heads
    rows = op.Transpose(op.Reshape(q3, op.Constant(value_ints=[0, 0, kvh, grp, hd])), perm=[0, 3, 1, 2, 4])
    rows = op.Reshape(rows, op.Constant(value_ints=[0, -1, kvh * hd]))
    # row g * q + r is query row r's: the mask repeated grp times along the rows (shared by every layer)
    mask = op.Tile(mask4, op.Constant(value_ints=[1, 1, grp, 1]))
    ctx = op.Attention(rows, keys, values, mask, q_num_heads=kvh, kv_num_heads=kvh, scale=1.0)
    # [1, grp * q, kvh * hd] -> [1, grp, q, kvh, hd] -> [1, q, kvh, grp, hd] = [1, q, h*hd] (head j * grp + g)
    ctx = op.Transpose(op.Reshape(ctx, op.Constant(value_ints=[0, grp, -1, kvh, hd])), perm=[0, 2, 3, 1, 4])
    return op.Reshape(
        ctx, op.Constant(value_ints=[0, -1, kvh * grp * hd]) if out_shape is None else out_shape
    )


def _split_context(op, qs, past_k, new_k, past_v, new_v, mask5, split):  # type: ignore[no-untyped-def]
    """The builder's split attention from the transposed queries [1, kvh, grp, q, hd] to the context."""
    s_past = op.MatMul(qs, op.Unsqueeze(op.Transpose(past_k, perm=[0, 2, 3, 1]), [2]))
    s_new = op.MatMul(qs, op.Unsqueeze(op.Transpose(new_k, perm=[0, 2, 3, 1]), [2]))
    # NOTE: the mask's Unsqueeze and the split sizes are shared by every layer: inputs, not matched nodes
    scores = op.Add(op.Concat(s_past, s_new, axis=-1), mask5)
    p_past, p_new = op.Split(op.Softmax(scores, axis=-1), split, axis=-1, _outputs=2)
    return op.Add(
        op.MatMul(p_past, op.Unsqueeze(op.Transpose(past_v, perm=[0, 2, 1, 3]), [2])),
        op.MatMul(p_new, op.Unsqueeze(op.Transpose(new_v, perm=[0, 2, 1, 3]), [2])),
    )


class _SplitAttention(pattern.RewriteRuleClassBase):
    def __init__(self) -> None:
        super().__init__("SplitAttention")

    def pattern(self, op, q5, past_k, new_k, past_v, new_v, mask5, split, out_shape):  # type: ignore[no-untyped-def]
        qs = op.Transpose(q5, perm=[0, 2, 3, 1, 4])
        ctx = _split_context(op, qs, past_k, new_k, past_v, new_v, mask5, split)
        return op.Reshape(op.Transpose(ctx, perm=[0, 3, 1, 2, 4]), out_shape)

    def check(self, context, q5, mask5, out_shape, **_):  # type: ignore[no-untyped-def]
        result = pattern.MatchResult()
        if _mask_4d(mask5) is None:
            return result.fail("the mask is not Unsqueeze(mask [1, 1, q, L+q], axis 2)", mask5)
        shape = ints(out_shape)
        # [1, q, h*hd]; a slot_axis graph's [slots * m, h*hd]
        packed = shape is not None and len(shape) == 3 and shape[:2] == [1, -1]
        if not packed and (shape is None or len(shape) != 2 or shape[0] != -1):
            return result.fail("the context is not reshaped to [1, q, h*hd] or [slots * m, h*hd]", out_shape)
        if _head_dims(q5) is None:
            return result.fail("queries are not a [1, q, kvh, grp, hd] view with static head dims", q5)
        return result

    def rewrite(self, op, q5, past_k, new_k, past_v, new_v, mask5, out_shape, **_):  # type: ignore[no-untyped-def]
        keys, values = _flat(op, past_k, new_k), _flat(op, past_v, new_v)
        per_slot = len(ints(out_shape) or ()) == 2  # slot_axis: [slots * m, h*hd]
        mask, dims = _mask_4d(mask5), _head_dims(q5)
        return _grouped_attention(
            op, _query_3d(op, q5), keys, values, mask, dims, out_shape if per_slot else None
        )


class _StagedAttention(_SplitAttention):
    """The staged form (models/transformer.py, "Staged attention"): queries padded by a zero row, the new K/V
    scattered into the staging window, the padding row dropped from the context. Fused the same way, the
    padding row kept (ORT's Attention gives bit-identical rows for any query count >= 2, not for 1)."""

    def __init__(self) -> None:
        pattern.RewriteRuleClassBase.__init__(self, "StagedAttention")

    def pattern(
        self, op, q5, pad, past_k, new_k, past_v, new_v, mask5, split, starts, ends, axes, steps, out_shape
    ):  # type: ignore[no-untyped-def]
        qs = op.Concat(op.Transpose(q5, perm=[0, 2, 3, 1, 4]), pad, axis=3)
        ctx = _split_context(op, qs, past_k, new_k, past_v, new_v, mask5, split)
        ctx = op.Slice(ctx, starts, ends, axes, steps)
        return op.Reshape(op.Transpose(ctx, perm=[0, 3, 1, 2, 4]), out_shape)

    def check(self, context, q5, pad, mask5, out_shape, starts, ends, axes, **_):  # type: ignore[no-untyped-def]
        result = super().check(context, q5=q5, mask5=mask5, out_shape=out_shape)
        if not result:
            return result
        arr = const_array(pad)
        if arr is None or arr.ndim != 5 or arr.shape[3] != 1 or np.any(arr != 0):
            return result.fail("the query padding is not a constant zero row", pad)
        if (ints(starts), ints(ends), ints(axes)) != ([0], [-1], [3]):
            return result.fail("the slice does not drop exactly the padding row", axes)
        return result

    def rewrite(self, op, q5, past_k, new_k, past_v, new_v, mask5, out_shape, **_):  # type: ignore[no-untyped-def]
        dims = _head_dims(q5)
        pad = op.Constant(value=ir.tensor(np.zeros((1, 1, int(np.prod(dims))), np.float32)))
        queries = op.Concat(_query_3d(op, q5), pad, axis=1)
        keys, values = _flat(op, past_k, new_k), _flat(op, past_v, new_v)
        out = _grouped_attention(op, queries, keys, values, _mask_4d(mask5), dims)
        one = op.Constant(value_ints=[1])
        return op.Slice(out, op.Constant(value_ints=[0]), op.Constant(value_ints=[-1]), one, one)


@graph_pass("attention", targets=("ort", "openvino"))
def attention(model: ir.Model, ctx: PassContext) -> int:
    """Split past/new attention (two score matmuls, Concat, mask Add, Softmax, Split, two value matmuls and their
    transposes) -> one ONNX Attention (opset 23, GQA heads) over Concat(past, new) K/V."""
    ensure_opset(model, "", 23)
    return apply_rules(model, [_SplitAttention.rule(), _StagedAttention.rule()])
