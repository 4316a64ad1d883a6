"""graph_opt: passes over ONNX decoder graphs (fold, fuse, quantize, lower per target, partition, specialize).

Each pass is registered by name in `PASSES` (see graph_opt.manager); `optimize` runs a target's pipeline.
"""

# NOTE: the passes import onnx_ir, onnxscript and sympy (~0.6 s on a 2-core machine); a run on a graph already
# built needs none of them, so the package's names load on first use (PEP 562) and `edge.graph_opt.weight`
# (what the runtime reads weights with) stays light. The first use imports every module: each registers its
# passes in PASSES, and the names below are bound over the submodules of the same name (`attention`, `fold`, ...)

import importlib
import sys
import types
from typing import Any

_WHERE = {
    "FAST_FUSIONS": "pipeline",
    "FORMS": "forms",
    "FUSIONS": "pipeline",
    "LOWERINGS": "pipeline",
    "PASSES": "manager",
    "PIPELINES": "pipeline",
    "TARGETS": "manager",
    "BlockWeight": "linear",
    "GraphPass": "manager",
    "LayerRange": "partition",
    "Linear": "linear",
    "LinearHeader": "linear",
    "OptimizeResult": "pipeline",
    "PassContext": "manager",
    "PassRecord": "manager",
    "QuantReport": "quantize",
    "QuantSpec": "quantize",
    "WeightSpill": "spill",
    "attention": "attention",
    "center_codes": "lower",
    "collect_hessians": "quantize",
    "dynamic_dims": "specialize",
    "emit_linear": "linear",
    "fine_qkv_blocks": "lower",
    "float_zero_points": "lower",
    "fold": "fold",
    "gelu": "gelu",
    "gptq": "quantize",
    "graph_pass": "manager",
    "int8_nibbles": "lower",
    "is_linear_node": "linear",
    "layer_of": "quantize",
    "linear_protos": "linear",
    "iter_linears": "linear",
    "linear_names": "linear",
    "linears_in": "linear",
    "lower": "lower",
    "lowering_for": "lower",
    "measure_sensitivity": "quantize",
    "model_stats": "manager",
    "op_histogram": "manager",
    "optimize": "pipeline",
    "parse_ranges": "partition",
    "pipeline": "pipeline",
    "plan_partitions": "partition",
    "plan_precision": "quantize",
    "plan_quantization": "quantize",
    "quantize": "quantize",
    "quantize_int4": "quantize",
    "quantize_int8": "quantize",
    "quantize_weight": "quantize",
    "rmsnorm": "rmsnorm",
    "rotary": "rotary",
    "run_passes": "manager",
    "skip_rmsnorm": "rmsnorm",
    "specialize": "specialize",
    "specialize_shapes": "specialize",
    "target_model": "pipeline",
    "target_passes": "pipeline",
    "target_proto": "pipeline",
}

__all__ = list(_WHERE)


def load_passes() -> None:
    """Import every pass module (registering its passes) and bind the package's names; cheap once done."""
    if globals().get("_loaded"):
        return
    for module in sorted(set(_WHERE.values())):
        importlib.import_module(f"{__name__}.{module}")
    for name, module in _WHERE.items():
        globals()[name] = getattr(sys.modules[f"{__name__}.{module}"], name)
    globals()["_loaded"] = True


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    load_passes()
    return globals()[name]


def __dir__() -> list[str]:
    return sorted(__all__)


class _Package(types.ModuleType):
    """The import system binds each submodule as an attribute of its package; where the package exports a
    name from a submodule of that name (the pass `attention` of module `attention`), the export wins, as it did
    when this file imported everything eagerly."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}" and name in _WHERE:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
