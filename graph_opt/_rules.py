"""Shared helpers for the pattern-rewrite passes (onnxscript's rewriter over onnx_ir)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.rewriter import pattern

# Node metadata tagging the nodes of a linear layer (set by graph_opt.forms.Emitter): the linear's name, its
# form, and the node's part: "weight" (the form's nodes), "blocksum" (Reshape + ReduceSum of x; after CSE one
# pair may serve several linears reading the same x) or "bias" (the block-bias MatMul and Add).
NAME_KEY, FORM_KEY, ROLE_KEY = "edge.linear", "edge.linear.form", "edge.linear.role"


def apply_rules(model: ir.Model, rules: Sequence[pattern.RewriteRule], *, commute: bool = False) -> int:
    """Apply rules until none matches (commute: also every operand order of commutative ops); the number of
    rewrites. No rule may rewrite a node of a linear layer (see `_spare_linears`)."""
    total = 0
    rule_set = pattern.RewriteRuleSet(list(rules), commute=commute)
    for rule in rule_set.rules:
        _spare_linears(rule)
    while True:
        n = rule_set.apply_to_model(model)
        total += n
        if not n:
            return total


def _spare_linears(rule: pattern.RewriteRule) -> None:
    """Make `rule` refuse any match that takes in a node tagged as part of a linear layer (graph_opt.linear):
    a fusion once took a linear's block-bias Add for a residual add, and the linear lost its bias."""
    # NOTE: onnxscript has no public hook for this; its rules keep the check in `_condition_function`
    # (onnxscript 0.3 .. 0.7). Fail loudly if that changes rather than fuse linears silently.
    check = getattr(rule, "_condition_function", None)
    if check is None:
        raise RuntimeError("onnxscript's RewriteRule has no _condition_function: update _spare_linears")
    if getattr(check, "spares_linears", False):
        return

    def guarded(context, **bindings):  # type: ignore[no-untyped-def]
        tagged = [n for n in context.nodes if is_linear_node(n)]
        if tagged:
            return pattern.MatchResult().fail(f"{tagged[0].op_type} belongs to a linear layer", tagged[0])
        return check(context, **bindings)

    guarded.spares_linears = True  # type: ignore[attr-defined]
    rule._condition_function = guarded


def const_array(value: ir.Value | None) -> np.ndarray | None:
    """The value as a numpy array when it is an initializer or a Constant node's output, else None."""
    if value is None:
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx"):
            attr = producer.attributes.get("value")
            tensor = attr.as_tensor() if attr is not None else None
    return None if tensor is None else tensor.numpy()


def scalar(value: ir.Value | None) -> float | None:
    """A constant holding one number, as a float; else None."""
    arr = const_array(value)
    if arr is None or arr.size != 1:
        return None
    return float(arr.reshape(-1)[0])


def ints(value: ir.Value | None) -> list[int] | None:
    arr = const_array(value)
    if arr is None or arr.dtype.kind not in "iu":
        return None
    return [int(v) for v in arr.reshape(-1)]


def attr_ints(node: ir.Node, name: str) -> list[int] | None:
    attr = node.attributes.get(name)
    return None if attr is None else list(attr.as_ints())


def ensure_opset(model: ir.Model, domain: str, version: int) -> None:
    """Raise the model's opset for `domain` to at least `version`."""
    current = model.opset_imports.get(domain)
    if current is None or current < version:
        model.opset_imports[domain] = version
        model.graph.opset_imports[domain] = version


def initializer(model: ir.Model, name: str, array: np.ndarray) -> ir.Value:
    """Register (or reuse, by name) an initializer holding `array`."""
    graph = model.graph
    if name in graph.initializers:
        return graph.initializers[name]
    value = ir.Value(name=name, const_value=ir.tensor(np.ascontiguousarray(array), name=name))
    value.shape = ir.Shape(array.shape)
    value.type = ir.TensorType(ir.DataType.from_numpy(array.dtype))
    graph.register_initializer(value)
    return value


def cleanup(model: ir.Model) -> None:
    """Dead nodes, unused initializers and duplicate subexpressions removed, nodes in topological order."""
    common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    common.DeduplicateInitializersPass(size_limit=1 << 16)(model)
    common.CommonSubexpressionEliminationPass()(model)
    common.RemoveUnusedNodesPass()(model)
    _remove_unused_initializers(model)
    common.RemoveUnusedOpsetsPass()(model)
    common.TopologicalSortPass()(model)


def is_linear_node(node: ir.Node) -> bool:
    """Whether the node was emitted as part of a linear layer (what the fusion passes must not rewrite)."""
    return NAME_KEY in node.metadata_props


def _remove_unused_initializers(model: ir.Model) -> None:
    graph = model.graph
    inputs = {id(v) for v in graph.inputs}
    for name, value in list(graph.initializers.items()):
        if not value.uses() and not value.is_graph_output() and id(value) not in inputs:
            del graph.initializers[name]


_SHAPE_KEEPING = {"SimplifiedLayerNormalization", "RMSNormalization", "Mul", "Div", "Add"}


def source_reshape(value: ir.Value) -> tuple[ir.Node, bool] | None:
    """The Reshape that gave `value` its shape, looking through shape-keeping ops (norms, and the elementwise
    ops of a decomposed norm or RoPE: their first non-constant input); (node, whether it is value's producer)."""
    node, direct = value.producer(), True
    while node is not None and node.op_type in _SHAPE_KEEPING:
        ins = [v for v in node.inputs if v is not None and const_array(v) is None]
        if not ins:
            return None
        node, direct = ins[0].producer(), False
    if node is None or node.op_type != "Reshape":
        return None
    return node, direct
