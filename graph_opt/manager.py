"""The pass manager: named graph passes over an `onnx_ir` model, each logged with what it changed.

A pass is a function `(model, ctx) -> int` (the number of rewrites it made) registered with `@graph_pass`: a
name, the targets it applies to, and its docstring's first line saying what it matches. `run_passes` runs a
list of them and returns one `PassRecord` per pass (node counts and weight bytes before/after), which
`edge convert --explain` prints and the artifact manifest records.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from edge.graph_opt._rules import cleanup
from edge.graph_opt.spill import WeightSpill

__all__ = [
    "PASSES",
    "TARGETS",
    "GraphPass",
    "PassContext",
    "PassRecord",
    "graph_pass",
    "model_stats",
    "op_histogram",
    "run_passes",
]

log = logging.getLogger("edge.graph_opt")

TARGETS = ("ort", "openvino", "coreml")


@dataclass(frozen=True)
class PassContext:
    """What a pass may depend on: the target and pass-specific options (e.g. the quantization spec)."""

    target: str = "ort"
    options: dict[str, Any] = field(default_factory=dict)
    # where passes that rewrite weights put them as they go (graph_opt/spill.py); None: in memory
    spill: WeightSpill | None = None

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}; expected one of {', '.join(TARGETS)}")


PassFn = Callable[[ir.Model, PassContext], int]


@dataclass(frozen=True)
class GraphPass:
    name: str
    fn: PassFn
    targets: tuple[str, ...]

    @property
    def doc(self) -> str:
        """What the pass matches: the first paragraph of its docstring, on one line."""
        return " ".join((self.fn.__doc__ or "").strip().split("\n\n")[0].split())

    def applies_to(self, target: str) -> bool:
        return target in self.targets


PASSES: dict[str, GraphPass] = {}


def graph_pass(name: str, targets: Sequence[str] = TARGETS) -> Callable[[PassFn], PassFn]:
    """Register a pass under `name` for `targets`."""

    def register(fn: PassFn) -> PassFn:
        if name in PASSES:
            raise ValueError(f"graph pass {name!r} is registered twice")
        PASSES[name] = GraphPass(name, fn, tuple(targets))
        return fn

    return register


@dataclass(frozen=True)
class ModelStats:
    nodes: int
    weight_bytes: int
    ops: dict[str, int]


def op_histogram(model: ir.Model) -> dict[str, int]:
    """Node count per op type (domain-qualified for non-default domains)."""
    c: Counter[str] = Counter()
    for node in model.graph.all_nodes():
        c[f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type] += 1
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def model_stats(model: ir.Model) -> ModelStats:
    weight_bytes = 0
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is not None:
            weight_bytes += int(tensor.nbytes)
    ops = op_histogram(model)
    return ModelStats(sum(ops.values()), weight_bytes, ops)


@dataclass(frozen=True)
class PassRecord:
    """What one pass did to a model."""

    name: str
    doc: str
    applied: bool  # False: the pass does not apply to this target
    rewrites: int
    nodes_before: int
    nodes_after: int
    weight_bytes_before: int
    weight_bytes_after: int
    seconds: float
    ops_removed: dict[str, int]
    ops_added: dict[str, int]

    def line(self) -> str:
        if not self.applied:
            return f"{self.name:<14} skipped (not for this target)"
        mb = 1 << 20
        delta = ", ".join(
            [f"-{n} {op}" for op, n in self.ops_removed.items()]
            + [f"+{n} {op}" for op, n in self.ops_added.items()]
        )
        return (
            f"{self.name:<14} {self.rewrites:>4} rewrites  nodes {self.nodes_before} -> {self.nodes_after}  "
            f"weights {self.weight_bytes_before / mb:.1f} -> {self.weight_bytes_after / mb:.1f} MiB  "
            f"{self.seconds:.2f}s" + (f"  [{delta}]" if delta else "")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "applied": self.applied,
            "rewrites": self.rewrites,
            "nodes": [self.nodes_before, self.nodes_after],
            "weight_bytes": [self.weight_bytes_before, self.weight_bytes_after],
            "ops_removed": self.ops_removed,
            "ops_added": self.ops_added,
        }


def _diff(before: dict[str, int], after: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    removed = {op: n - after.get(op, 0) for op, n in before.items() if n > after.get(op, 0)}
    added = {op: n - before.get(op, 0) for op, n in after.items() if n > before.get(op, 0)}
    return removed, added


def _keep_output_types(model: ir.Model, declared: dict[str | None, tuple[Any, Any]]) -> None:
    """A rewrite may hand a graph output to a new value: the graph's declared type and shape stay."""
    for value in model.graph.outputs:
        if value.name in declared:
            typ, shape = declared[value.name]
            if value.type is None:
                value.type = typ
            if value.shape is None:
                value.shape = shape


def run_passes(
    model: ir.Model, passes: Sequence[GraphPass | str], ctx: PassContext | None = None
) -> list[PassRecord]:
    """Run `passes` in order on `model` (in place); one record per pass, also logged."""
    from edge.graph_opt import load_passes

    load_passes()  # a pass named here may live in a module nothing imported yet
    ctx = ctx or PassContext()
    records = []
    for p in passes:
        gp = PASSES[p] if isinstance(p, str) else p
        before = model_stats(model)
        if not gp.applies_to(ctx.target):
            rec = PassRecord(
                gp.name, gp.doc, False, 0, before.nodes, before.nodes, before.weight_bytes,
                before.weight_bytes, 0.0, {}, {},
            )  # fmt: skip
        else:
            t0 = time.perf_counter()
            declared = {v.name: (v.type, v.shape) for v in model.graph.outputs}
            n = gp.fn(model, ctx)
            cleanup(model)
            _keep_output_types(model, declared)
            seconds = time.perf_counter() - t0
            after = model_stats(model)
            removed, added = _diff(before.ops, after.ops)
            rec = PassRecord(
                gp.name, gp.doc, True, n, before.nodes, after.nodes, before.weight_bytes,
                after.weight_bytes, seconds, removed, added,
            )  # fmt: skip
        log.info("%s", rec.line())
        records.append(rec)
    return records
