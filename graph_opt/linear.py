"""Linear layers: y = x @ W^T for a weight W [n, k] held in the graph, emitted by one emitter and looked up by
the annotation it leaves.

`emit` (and `emit_linear`, which replaces a linear in place) writes a weight in one of graph_opt.forms'
FORMS, every node tagged with node metadata: `edge.linear` (the linear's name), `edge.linear.form` and
`edge.linear.role`. The builder (models/transformer.py) emits every linear through `linear_protos`, so the
graph it hands on (in memory, or saved to the graph cache and loaded back) carries its list of linears;
`linears_in` reads that list back, and the fusion passes leave tagged nodes alone (graph_opt._rules). No
pattern search: a graph not built by edge has no linears to graph_opt (edge loads no foreign ONNX into its
passes; such a caller would tag its linears with `emit_linear` first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from edge.errors import ModelFormatError
from edge.graph_opt._rules import FORM_KEY, NAME_KEY, ROLE_KEY, is_linear_node
from edge.graph_opt.forms import (
    FORMS,
    Emitter,
    emit_bias_term,
    emit_float,
    per_channel_as_blocks,
    read_bias_term,
    read_float,
    unknown_form,
)
from edge.graph_opt.spill import WeightSpill
from edge.graph_opt.weight import BlockWeight, pack_codes, unpack_codes

__all__ = [
    "BlockWeight",
    "Linear",
    "LinearHeader",
    "emit_linear",
    "is_linear_node",
    "iter_linears",
    "linear_names",
    "linear_protos",
    "linears_in",
    "pack_codes",
    "resolve_lowering",
    "unpack_codes",
]

_F32 = np.float32
# "nbits_split" (MatMulNBits + a separate block-bias term) is the name models' BuildOptions and the graph cache
# keys have always used for what FORMS calls "nbits"
_ALIASES = {"nbits_split": "nbits"}


def resolve_lowering(lowering: str) -> str:
    form = _ALIASES.get(lowering, lowering)
    if form not in FORMS:
        raise ValueError(f"unknown lowering {lowering!r}; expected one of {', '.join(FORMS)}")
    return form


@dataclass
class Linear:
    """One linear layer of a graph: the nodes computing y from x (`nodes`, its own; `shared`, the block-sum of
    x it may share with other linears reading x) and its weight."""

    name: str  # the linear's name (its weight's, e.g. blk.0.attn_output.weight; initializers start with it)
    x: ir.Value
    y: ir.Value
    nodes: list[ir.Node]
    weight: BlockWeight | np.ndarray  # quantized, or float W [n, k] (float32 / float16)
    accuracy_level: int = 0
    form: str = "float"  # how the graph holds it now: float or one of FORMS
    shared: list[ir.Node] | None = None

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
# Emission


def emit(
    graph: ir.Graph,
    x: ir.Value,
    name: str,
    weight: BlockWeight | np.ndarray,
    *,
    lowering: str = "nbits",
    accuracy_level: int = 0,
    rank: int | None = None,
) -> tuple[list[ir.Node], ir.Value]:
    """New tagged nodes computing x @ weight^T (initializers registered in `graph`, nodes not inserted); the
    result value. rank: x's rank (default: from its shape, else 3: decoder activations [batch, seq, k])."""
    rank = rank or (len(x.shape) if x.shape is not None else 3)
    if isinstance(weight, np.ndarray):
        if weight.ndim != 2:
            raise ValueError(f"{name}: a linear weight must be 2-D, got shape {weight.shape}")
        e = Emitter(graph, x, name, "float", rank)
        return e.nodes, emit_float(e, weight)
    form_name = resolve_lowering(lowering)
    form = FORMS[form_name]
    w = per_channel_as_blocks(weight) if form.nbits_blocks else weight
    e = Emitter(graph, x, name, form_name, rank)
    y = form.emit(e, w, accuracy_level)
    if w.bias is not None and not form.folds_bias:
        y = emit_bias_term(e, w, y)
    return e.nodes, y


def linear_protos(
    weight: BlockWeight | np.ndarray,
    x: str,
    y: str,
    name: str,
    *,
    lowering: str = "nbits",
    accuracy_level: int = 0,
    rank: int = 3,
) -> tuple[list, list]:
    """`emit` for a graph under construction as onnx protos: (NodeProtos, TensorProtos) computing y = x @ W^T
    from the value named x; nodes and values are named after the linear (`name`.<part>)."""
    graph = ir.Graph([], [], nodes=[], name=name)
    nodes, out = emit(
        graph, ir.Value(name=x), name, weight, lowering=lowering, accuracy_level=accuracy_level, rank=rank
    )
    out.name = y
    for i, node in enumerate(nodes):
        node.name = f"{name}.{node.op_type}_{i}"
        for j, v in enumerate(node.outputs):
            v.name = v.name or f"{name}.{node.op_type.lower()}_{i}_{j}"
    return (
        [ir.serde.serialize_node(n) for n in nodes],
        [ir.serde.serialize_tensor(v.const_value) for v in graph.initializers.values()],  # type: ignore[arg-type]
    )


def emit_linear(
    model: ir.Model,
    lin: Linear,
    weight: BlockWeight | np.ndarray | None = None,
    *,
    lowering: str = "nbits",
    accuracy_level: int | None = None,
) -> Linear:
    """Replace a linear's nodes with `weight` (default: its own) in form `lowering`; the new record."""
    weight = lin.weight if weight is None else weight
    level = lin.accuracy_level if accuracy_level is None else accuracy_level
    graph = model.graph
    nodes, y = emit(graph, lin.x, lin.name, weight, lowering=lowering, accuracy_level=level)
    graph.insert_after(lin.nodes[-1], nodes)
    ir.convenience.replace_all_uses_with(lin.y, y, replace_graph_outputs=True)
    if lin.y.is_graph_output() or lin.y.name:
        name = lin.y.name
        lin.y.name = None
        y.name = name
    graph.remove(lin.nodes, safe=True)  # safe: also drops them as users of their inputs (the old weights)
    for node in reversed(lin.shared or []):  # the block-sum, unless another linear still reads it
        if not any(v.uses() for v in node.outputs):
            graph.remove(node, safe=True)
    form = "float" if isinstance(weight, np.ndarray) else resolve_lowering(lowering)
    return Linear(lin.name, lin.x, y, nodes, weight, level, form)


# ---------------------------------------------------------------------------------------------------------
# Lookup


def _groups(model: ir.Model) -> list[tuple[str, list[ir.Node]]]:
    groups: dict[str, list[ir.Node]] = {}
    for node in model.graph:
        name = node.metadata_props.get(NAME_KEY)
        if name is not None:
            groups.setdefault(name, []).append(node)
    order = {id(n): i for i, n in enumerate(model.graph)}
    return sorted(groups.items(), key=lambda item: order[id(item[1][-1])])


def linears_in(model: ir.Model) -> list[Linear]:
    """The graph's linear layers, from their tags, in graph order (of their outputs)."""
    return [_read(name, nodes) for name, nodes in _groups(model)]


def linear_names(model: ir.Model) -> list[str]:
    """The names of `linears_in`, in its order, without reading a weight."""
    return [name for name, _ in _groups(model)]


@dataclass(frozen=True)
class LinearHeader:
    """What a linear's nodes say without decoding its weight (for a pass to pass over it unread)."""

    name: str
    form: str | None  # as Linear.form; None: the nodes disagree (reading it raises)
    bits: int | None  # form nbits: MatMulNBits' bits and accuracy_level (as Linear.weight.bits and
    accuracy_level: int | None  # Linear.accuracy_level will be); other forms: None
    may_have_bias: bool  # False: Linear.weight.bias will be None (no block-bias term, no float zero points)


def _header(name: str, nodes: Sequence[ir.Node]) -> LinearHeader:
    weight = [n for n in nodes if n.metadata_props.get(ROLE_KEY) == "weight"]
    bias = [n for n in nodes if n.metadata_props.get(ROLE_KEY) == "bias"]
    forms = {n.metadata_props.get(FORM_KEY) for n in weight + bias}
    form = next(iter(forms)) if len(forms) == 1 else None
    bits = level = None
    float_zp = True  # unknown forms: assume the worst
    if form == "nbits" and len(weight) == 1:
        a = weight[0].attributes
        bits = int(a["bits"].value) if "bits" in a else 4
        level = int(a["accuracy_level"].value) if "accuracy_level" in a else 0
        zp = weight[0].inputs[3] if len(weight[0].inputs) > 3 else None
        float_zp = zp is not None and zp.dtype != ir.DataType.UINT8
    return LinearHeader(name, form, bits, level, bool(bias) or float_zp)


def iter_linears(
    model: ir.Model,
    spill: WeightSpill | None = None,
    where: Callable[[LinearHeader], bool] | None = None,
) -> Iterator[Linear]:
    """`linears_in`, each read when it is reached: a pass that replaces linears one by one holds one linear's
    decoded weight, not the model's. With `spill`, the graph is settled after each (graph_opt/spill.py).
    `where`: a condition every linear the pass may change meets, checked on its header; the others are not
    read (decoding a 7B's linears costs ~35 s a pass)."""
    for name, nodes in _groups(model):
        if where is not None and not where(_header(name, nodes)):
            continue
        yield _read(name, nodes)
        if spill is not None:
            spill.settle(model)


def _read(name: str, nodes: Sequence[ir.Node]) -> Linear:
    parts: dict[str, list[ir.Node]] = {"weight": [], "blocksum": [], "bias": []}
    for node in nodes:
        parts.setdefault(node.metadata_props.get(ROLE_KEY, "?"), []).append(node)
    # NOTE: "blocksum" nodes may be an earlier emission's, kept while another linear reads them (after CSE)
    forms = {n.metadata_props.get(FORM_KEY) for n in parts["weight"] + parts["bias"]}
    form = next(iter(forms)) if len(forms) == 1 else None
    if form is None or (form != "float" and form not in FORMS):
        raise unknown_form(name, ", ".join(sorted(str(f) for f in forms)))
    try:
        if set(parts) != {"weight", "blocksum", "bias"} or not parts["weight"]:
            raise ValueError(f"parts {sorted(parts)}")
        read = read_float(parts["weight"]) if form == "float" else FORMS[form].read(parts["weight"])
        own, shared, y, weight = list(parts["weight"]), None, read.y, read.weight
        if parts["bias"]:
            bias, block, shared = read_bias_term(parts["bias"], read.x)
            if not isinstance(weight, BlockWeight) or block % weight.block_size or weight.k % block:
                raise ValueError("a block-bias term on a weight with other blocks")
            bias = np.repeat(bias, block // weight.block_size, axis=1)  # emitted over whole coarser blocks
            weight = replace(weight, bias=bias if weight.bias is None else weight.bias + bias)
            own += parts["bias"]
            y = parts["bias"][-1].outputs[0]
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise ModelFormatError(
            f"linear {name!r} ({form}) is not as its emitter left it: {e}",
            hint="a pass rewrote part of it; passes must re-emit a linear with graph_opt.emit_linear",
        ) from e
    return Linear(name, read.x, y, own, weight, read.accuracy_level, form, shared)
