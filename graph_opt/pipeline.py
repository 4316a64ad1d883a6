"""The pass list per target, and `optimize`: run it on a decoder graph (or a partition of one)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir

from edge.graph_opt.manager import PassContext, PassRecord, run_passes
from edge.graph_opt.quantize import QuantReport, QuantSpec
from edge.graph_opt.spill import WeightSpill

__all__ = [
    "FAST_FUSIONS",
    "FUSIONS",
    "LOWERINGS",
    "PIPELINES",
    "OptimizeResult",
    "optimize",
    "pipeline",
    "target_model",
    "target_passes",
    "target_proto",
]

FUSIONS = {
    "ort": ["rmsnorm", "skip_rmsnorm", "rotary", "attention"],
    # NOTE: OpenVINO fuses the builder's elementwise RoPE and split attention itself; the attention pass made
    # its decode 7-10% slower on smollm2 (1 thread, 160 and 900 past tokens; prefill 3-5% faster) and the
    # rotary pass's op breaks its compile cache (see graph_opt/rotary.py): both stay off for it.
    "openvino": ["rmsnorm"],
    "coreml": [],
}
# Passes that make a graph's weights run well on a target, whatever else is done to it (every graph built for
# the target gets them, fused or not)
LOWERINGS: dict[str, list[str]] = {"ort": ["int8_nibbles"], "openvino": ["float_zero_points"], "coreml": []}
# With int8 activations (precision "fast") a runtime's int8 kernels want integer zero points: the block-bias
# term of min-offset formats stays a separate small matmul instead of becoming float zero points (OpenVINO's
# dynamic quantization skips weights with float zero points), and 4-bit Q/K/V projections take 16-element blocks
# (finer int8 steps for their inputs; see lower.fine_qkv_blocks)
FAST_LOWERINGS: dict[str, list[str]] = {
    "ort": ["center_codes", "fine_qkv_blocks", "int8_nibbles"],
    "openvino": ["center_codes", "fine_qkv_blocks"],
    "coreml": [],
}
# Fusions whose fused kernel rounds differently from the nodes it replaces (~1 ulp): only where precision "fast"
# already lets a backend round differently, so a graph at "exact" computes what it always did
FAST_FUSIONS: dict[str, list[str]] = {"ort": ["gelu"], "openvino": [], "coreml": []}
PIPELINES = {
    t: ["fold", *f, "quantize", "lower", *LOWERINGS[t], "specialize", "fold"] for t, f in FUSIONS.items()
}


def pipeline(target: str, *, fuse: bool = True, precision: str = "exact") -> list[str]:
    """Pass names for a target, in order (fuse=False: without the fusion passes, for comparisons; precision
    "fast": the target's FAST_LOWERINGS instead of its LOWERINGS, and its FAST_FUSIONS)."""
    if target not in PIPELINES:
        raise ValueError(f"unknown target {target!r}; expected one of {', '.join(PIPELINES)}")
    names = [p for p in PIPELINES[target] if fuse or p not in FUSIONS[target]]
    if precision == "fast":
        at = names.index("lower") + 1
        names = [p for p in names if p not in LOWERINGS[target]]
        names[at:at] = FAST_LOWERINGS[target]
        if fuse:
            at = names.index("quantize")
            names[at:at] = FAST_FUSIONS[target]
    return names


@dataclass(frozen=True)
class OptimizeResult:
    records: list[PassRecord]
    quant: QuantReport


def optimize(
    model: ir.Model,
    target: str,
    *,
    quant: QuantSpec | None = None,
    fuse: bool = True,
    calibration: Sequence[Mapping[str, np.ndarray]] | None = None,
    quant_report: QuantReport | None = None,
    shapes: Mapping[str, int] | None = None,
    accuracy_level: int | None = None,
    int8_accuracy_level: int | None = None,
    head_accuracy_level: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    precision: str = "exact",
    on_pass: Callable[[], None] | None = None,
    spill: WeightSpill | None = None,
) -> OptimizeResult:
    """Run the target's pipeline on `model` in place. quant_report: quantized weights decided elsewhere (on the
    whole model, see graph_opt.plan_quantization), applied here by linear name (e.g. to each partition).
    `on_pass()` after each pass (a build's progress); `spill`: where rewritten weights go as they are made
    (graph_opt/spill.py)."""
    report = quant_report or QuantReport(quant or QuantSpec())
    options = {
        "quant": report.spec,
        "quant_report": report,
        "calibration": calibration,
        "shapes": dict(shapes) if shapes else None,
        "accuracy_level": accuracy_level,
        "int8_accuracy_level": int8_accuracy_level,
        "head_accuracy_level": head_accuracy_level,
        "progress": progress,
    }
    ctx = PassContext(target, options, spill)
    records = []
    for name in pipeline(target, fuse=fuse, precision=precision):
        records += run_passes(model, [name], ctx)  # names: it loads them
        if spill is not None:
            spill.settle(model)
        if on_pass is not None:
            on_pass()
    return OptimizeResult(records, report)


def target_passes(target: str, *, fuse: bool = True, precision: str = "exact") -> list[str]:
    """What makes a built graph ready for a target: folding and its fusion passes (fuse=False: none), then its
    LOWERINGS (precision "fast": with FAST_FUSIONS, and FAST_LOWERINGS); the weights' quantization as it is."""
    fast = precision == "fast"
    fusions = FUSIONS[target] + (FAST_FUSIONS[target] if fast else [])
    return (["fold", *fusions] if fuse else []) + (FAST_LOWERINGS if fast else LOWERINGS)[target]


def target_model(
    model: ir.Model,
    target: str,
    *,
    fuse: bool = True,
    precision: str = "exact",
    on_pass: Callable[[], None] | None = None,
    spill: WeightSpill | None = None,
) -> None:
    """`target_passes` run on `model` in place; `on_pass()` after each (a build's progress). With `spill`, the
    weights the passes rewrite go to its file as they are made (graph_opt/spill.py)."""
    ctx = PassContext(target, spill=spill)
    for name in target_passes(target, fuse=fuse, precision=precision):
        run_passes(model, [name], ctx)
        if spill is not None:
            spill.settle(model)
        if on_pass is not None:
            on_pass()


def target_proto(
    model: onnx.ModelProto, target: str, *, fuse: bool = True, precision: str = "exact"
) -> onnx.ModelProto:
    """`target_model` on a proto (a copy: the graph is held twice while the passes run)."""
    if not target_passes(target, fuse=fuse, precision=precision):
        return model
    m = ir.serde.deserialize_model(model)
    target_model(m, target, fuse=fuse, precision=precision)
    return ir.serde.serialize_model(m)
