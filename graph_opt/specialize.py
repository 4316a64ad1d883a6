"""Shape specialization for static-shape devices (NPUs): every symbolic dim of the graph's inputs and outputs
fixed (prefill chunk, KV capacity), then folded, so no Shape-derived computation is left at run time."""

from __future__ import annotations

import re
from collections.abc import Mapping

import onnx_ir as ir
from onnxscript import optimizer

from edge.graph_opt._rules import cleanup
from edge.graph_opt.manager import PassContext, graph_pass

__all__ = ["dynamic_dims", "specialize", "specialize_shapes"]

_PLUS = re.compile(r"^(\w+?)_plus_(\w+)$")


def dynamic_dims(model: ir.Model) -> list[str]:
    """Names of the symbolic dims left on the graph's inputs and outputs."""
    names: set[str] = set()
    for value in (*model.graph.inputs, *model.graph.outputs):
        if value.shape is None:
            names.add(f"<rank of {value.name}>")
            continue
        names.update(str(d) for d in value.shape if not isinstance(d, int))
    return sorted(names)


def _resolve(name: str, dims: Mapping[str, int]) -> int | None:
    if name in dims:
        return int(dims[name])
    m = _PLUS.match(name)  # e.g. past0_plus_q: the mask's past slots ++ new tokens
    if m:
        a, b = _resolve(m.group(1), dims), _resolve(m.group(2), dims)
        return None if a is None or b is None else a + b
    return None


def specialize_shapes(model: ir.Model, dims: Mapping[str, int]) -> int:
    """Fix the named symbolic dims of graph inputs and outputs (derived 'a_plus_b' dims follow); then fold.
    The number of dims fixed; a dim left symbolic is an error naming it."""
    fixed = 0
    for value in (*model.graph.inputs, *model.graph.outputs):
        if value.shape is None:
            continue
        new = []
        for d in value.shape:
            if isinstance(d, int):
                new.append(d)
                continue
            size = _resolve(str(d), dims)
            if size is None:
                raise ValueError(f"{value.name}: no size given for dim {d!r} (given: {dict(dims)})")
            new.append(size)
            fixed += 1
        value.shape = ir.Shape(new)
    optimizer.fold_constants(model, onnx_shape_inference=False)
    cleanup(model)
    return fixed


@graph_pass("specialize")
def specialize(model: ir.Model, ctx: PassContext) -> int:
    """Symbolic input/output dims (q, r, past<k>, past<k>_plus_q) -> the sizes in ctx.options['shapes']; the
    Shape/Sub/Concat nodes that computed split sizes from them fold away."""
    dims = ctx.options.get("shapes")
    if not dims:
        return 0
    return specialize_shapes(model, dims)
