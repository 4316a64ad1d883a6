"""Constant folding, dead-node removal and common-subexpression elimination."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import optimizer

from edge.graph_opt._rules import cleanup
from edge.graph_opt.manager import PassContext, graph_pass

__all__ = ["fold"]


@graph_pass("fold")
def fold(model: ir.Model, ctx: PassContext) -> int:
    """Subgraphs of constants (and of static shapes) -> their values; nodes nothing reads -> removed; identical
    subexpressions -> one."""
    before = model.graph.num_nodes()
    optimizer.fold_constants(model, onnx_shape_inference=False)
    cleanup(model)
    return max(0, before - model.graph.num_nodes())
