"""GELU fusion: the builder's tanh-approximated GELU (gemma3's activation, 9 elementwise nodes) -> one op.

    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))      Mul x6, Add x2, Tanh
  -> FastGelu(x)                                           (com.microsoft: ORT's contrib op, the same formula)

The same formula in one pass over the activations instead of nine: on gemma3-270m (ORT, 2 threads, 512-token
prompt) the decomposed form took ~5% of the prefill (Mul/Add/Tanh over [q, 2048]). On [512, 2048]
(benchmarks/gelu_forms.py, removed at cab3347): nine nodes ~1.0 ms, ONNX Gelu(approximate="tanh") 0.38 ms,
FastGelu 0.20 ms. Its rounding differs from the nodes' (max abs difference 1e-6 there), so it is a fast-precision fusion
(pipeline.FAST_FUSIONS): an exact graph is unchanged.
"""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.rewriter import pattern

from edge.graph_opt._rules import apply_rules, scalar
from edge.graph_opt.manager import PassContext, graph_pass

__all__ = ["gelu"]

# the constants the pattern's must equal (as float32 stores them)
_COEFFS = {"cube": 0.044715, "sqrt_2_pi": math.sqrt(2 / math.pi), "half": 0.5, "one": 1.0}


class _TanhGelu(pattern.RewriteRuleClassBase):
    def __init__(self) -> None:
        super().__init__("TanhGelu")

    def pattern(self, op, x, cube, sqrt_2_pi, half, one):  # type: ignore[no-untyped-def]
        x3 = op.Mul(op.Mul(x, x), x)
        inner = op.Mul(op.Add(x, op.Mul(x3, cube)), sqrt_2_pi)
        return op.Mul(op.Mul(x, half), op.Add(op.Tanh(inner), one))

    def check(self, context, x, **consts):  # type: ignore[no-untyped-def]
        result = pattern.MatchResult()
        for name, want in _COEFFS.items():
            got = scalar(consts[name])
            if got is None or not math.isclose(got, want, rel_tol=1e-6):
                return result.fail(f"{name} is not the constant {want}", consts[name])
        return result

    def rewrite(self, op, x, **_):  # type: ignore[no-untyped-def]
        return op.FastGelu(x, _domain="com.microsoft")


@graph_pass("gelu", targets=("ort",))
def gelu(model: ir.Model, ctx: PassContext) -> int:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) as nine elementwise nodes -> FastGelu (ORT contrib op)."""
    return apply_rules(model, [_TanhGelu.rule()], commute=True)
