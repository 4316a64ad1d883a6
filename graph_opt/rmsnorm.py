"""RMSNorm fusion: the decomposed norm -> one op, and the residual Add before it folded in (ORT).

x * (1 / sqrt(mean(x^2) + eps)) * w     Pow, ReduceMean, Add, Sqrt, Div|Reciprocal, Mul, Mul (7 nodes)
  ort       -> SimplifiedLayerNormalization(x, w)          (ORT registers it in the ONNX domain)
  openvino  -> RMSNormalization(x, w)                       (ONNX opset 23; OpenVINO's own RMS kernel)
Add(a, b) -> SimplifiedLayerNormalization(a + b, w), the sum also used later (the residual stream)
  ort       -> SkipSimplifiedLayerNormalization(a, b, w) -> (normed, a + b)   (com.microsoft)
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from edge.graph_opt._rules import apply_rules, const_array, ensure_opset, scalar
from edge.graph_opt.manager import PassContext, graph_pass

__all__ = ["rmsnorm", "skip_rmsnorm"]


class _RmsNorm(pattern.RewriteRuleClassBase):
    def __init__(self, target: str, reciprocal: bool) -> None:
        super().__init__(f"RmsNorm_{target}_{'recip' if reciprocal else 'div'}")
        self.target, self.reciprocal = target, reciprocal

    def pattern(self, op, x, w, eps):  # type: ignore[no-untyped-def]
        ms = op.ReduceMean(op.Pow(x, 2.0), [-1], keepdims=1)
        root = op.Sqrt(op.Add(ms, eps))
        inv = op.Reciprocal(root) if self.reciprocal else op.Div(1.0, root)
        return op.Mul(w, op.Mul(x, inv))

    def check(self, context, x, w, eps, **_):  # type: ignore[no-untyped-def]
        result = pattern.MatchResult()
        arr = const_array(w)
        if arr is None or arr.ndim != 1:
            return result.fail("the scale is not a constant vector", w)
        if scalar(eps) is None:
            return result.fail("epsilon is not a constant scalar", eps)
        return result

    def rewrite(self, op, x, w, eps, **_):  # type: ignore[no-untyped-def]
        epsilon = float(scalar(eps))  # type: ignore[arg-type]
        if self.target == "ort":
            return op.SimplifiedLayerNormalization(x, w, axis=-1, epsilon=epsilon, stash_type=1)
        return op.RMSNormalization(x, w, axis=-1, epsilon=epsilon, stash_type=1)


class _SkipRmsNorm(pattern.RewriteRuleClassBase):
    def __init__(self) -> None:
        super().__init__("SkipRmsNorm")

    def pattern(self, op, a, b, w):  # type: ignore[no-untyped-def]
        total = op.Add(a, b, _outputs=["total"])
        normed = op.SimplifiedLayerNormalization(total, w, _outputs=["normed"])
        return normed, total

    def check(self, context, a, b, w, normed, **_):  # type: ignore[no-untyped-def]
        result = pattern.MatchResult()
        # NOTE: the kernel needs input and skip of one shape [B, S, D]: a broadcast bias add is not a residual.
        if const_array(a) is not None or const_array(b) is not None:
            return result.fail("a constant operand: a bias add, not a residual add")
        # NOTE: a min-offset linear (Q4_1 / Q4_K, asymmetric INT4) ends in the Add of its block-bias term, e.g.
        # right before gemma3's post-attention norm: apply_rules refuses matches that take a linear's node.
        node = normed.producer()
        axis = node.attributes.get("axis")
        if axis is not None and axis.as_int() != -1:
            return result.fail("normalization not over the last axis")
        return result

    def rewrite(self, op, a, b, w, normed, **_):  # type: ignore[no-untyped-def]
        eps = normed.producer().attributes.get("epsilon")
        y, _mean, _inv, total = op.SkipSimplifiedLayerNormalization(
            a, b, w, epsilon=eps.as_float() if eps is not None else 1e-5, _outputs=4, _domain="com.microsoft"
        )
        return y, total


@graph_pass("rmsnorm", targets=("ort", "openvino"))
def rmsnorm(model: ir.Model, ctx: PassContext) -> int:
    """x * rsqrt(mean(x^2) + eps) * w as 7 elementwise nodes -> one RMSNorm op (ORT SimplifiedLayerNormalization,
    OpenVINO: ONNX RMSNormalization)."""
    if ctx.target == "openvino":
        ensure_opset(model, "", 23)
    return apply_rules(model, [_RmsNorm.rule(ctx.target, r) for r in (False, True)], commute=True)


@graph_pass("skip_rmsnorm", targets=("ort",))
def skip_rmsnorm(model: ir.Model, ctx: PassContext) -> int:
    """Add(residual, branch) feeding an RMSNorm -> SkipSimplifiedLayerNormalization returning the norm and the
    sum (ORT contrib op): one kernel instead of two per norm."""
    return apply_rules(model, [_SkipRmsNorm.rule()], commute=True)
