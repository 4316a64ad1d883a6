"""graph_opt: passes over ONNX decoder graphs (fold, fuse, quantize, lower per target, partition, specialize).

Each pass is registered by name in `PASSES` (see graph_opt.manager); `optimize` runs a target's pipeline.
"""

from edge.graph_opt.attention import attention
from edge.graph_opt.fold import fold
from edge.graph_opt.forms import FORMS
from edge.graph_opt.gelu import gelu
from edge.graph_opt.linear import BlockWeight, Linear, emit_linear, is_linear_node, linear_protos, linears_in
from edge.graph_opt.lower import (
    center_codes,
    fine_qkv_blocks,
    float_zero_points,
    int8_nibbles,
    lower,
    lowering_for,
)
from edge.graph_opt.manager import (
    PASSES,
    TARGETS,
    GraphPass,
    PassContext,
    PassRecord,
    graph_pass,
    model_stats,
    op_histogram,
    run_passes,
)
from edge.graph_opt.partition import LayerRange, parse_ranges, plan_partitions
from edge.graph_opt.pipeline import (
    FAST_FUSIONS,
    FUSIONS,
    LOWERINGS,
    PIPELINES,
    OptimizeResult,
    optimize,
    pipeline,
    target_proto,
)
from edge.graph_opt.quantize import (
    QuantReport,
    QuantSpec,
    collect_hessians,
    gptq,
    layer_of,
    measure_sensitivity,
    plan_precision,
    plan_quantization,
    quantize,
    quantize_int4,
    quantize_int8,
    quantize_weight,
)
from edge.graph_opt.rmsnorm import rmsnorm, skip_rmsnorm
from edge.graph_opt.rotary import rotary
from edge.graph_opt.specialize import dynamic_dims, specialize, specialize_shapes

__all__ = [
    "FAST_FUSIONS",
    "FORMS",
    "FUSIONS",
    "LOWERINGS",
    "PASSES",
    "PIPELINES",
    "TARGETS",
    "BlockWeight",
    "GraphPass",
    "LayerRange",
    "Linear",
    "OptimizeResult",
    "PassContext",
    "PassRecord",
    "QuantReport",
    "QuantSpec",
    "attention",
    "center_codes",
    "collect_hessians",
    "dynamic_dims",
    "emit_linear",
    "fine_qkv_blocks",
    "float_zero_points",
    "fold",
    "gelu",
    "gptq",
    "graph_pass",
    "int8_nibbles",
    "is_linear_node",
    "layer_of",
    "linear_protos",
    "linears_in",
    "lower",
    "lowering_for",
    "measure_sensitivity",
    "model_stats",
    "op_histogram",
    "optimize",
    "parse_ranges",
    "pipeline",
    "plan_partitions",
    "plan_precision",
    "plan_quantization",
    "quantize",
    "quantize_int4",
    "quantize_int8",
    "quantize_weight",
    "rmsnorm",
    "rotary",
    "run_passes",
    "skip_rmsnorm",
    "specialize",
    "specialize_shapes",
    "target_proto",
]
