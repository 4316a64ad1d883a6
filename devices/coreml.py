"""Core ML backend: an edge partition graph (ONNX, lowered for `--target coreml`) -> an `.mlpackage`.

coremltools has no ONNX frontend any more, so this is a small translator into a MIL program, covering exactly
the op subset graph_opt/lower.py leaves for coreml (see `SUPPORTED_OPS`); anything else is an error naming the
op. Linears arrive as DequantizeLinear(int4/uint4/int8/uint8 codes, blocked scales[, zero points]) -> MatMul;
each DequantizeLinear becomes one iOS18 `constexpr_blockwise_shift_scale` with the same codes, scales and
offsets: the same formula, (codes - offset) * scale, so the mapping is lossless (no re-quantization through
coremltools.optimize). Its scales stay float32: the fp16 compute pass is told to leave these ops alone, and
casts their dequantized output instead, so the stored weights match the ONNX ones bit for bit.

Compute is fp16 by default (the Neural Engine runs nothing else), fp32 on request. NOTE: not yet checked on a
Mac: whether fp16 holds RMSNorm's sum of squares for models with large activations.

Shapes are fixed: Core ML runs flexible (RangeDim) models on the CPU/GPU only, never the Neural Engine, and
edge's ring KV cache already has a fixed capacity. A dynamic graph is exported at sizes given by the caller.
Building and saving work everywhere coremltools installs; prediction needs the Core ML framework (macOS).
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from edge.errors import BackendUnavailableError, ModelFormatError

__all__ = [
    "SUPPORTED_OPS",
    "MLPackageInfo",
    "check_available",
    "export_artifact",
    "export_mlpackage",
    "inspect_mlpackage",
    "mil_name",
    "mlpackage_weights",
    "predict",
]

SUPPORTED_OPS = frozenset(
    {
        "Add", "Cast", "Concat", "Cos", "DequantizeLinear", "Div", "Gather", "MatMul", "Mul", "Pow",
        "ReduceMean", "ReduceSum", "Reshape", "Sigmoid", "Sin", "Softmax", "Split", "Sqrt", "Sub", "Tanh",
        "Transpose", "Unsqueeze",
    }
)  # fmt: skip

_INSTALL_HINT = 'pip install "edge-llm[coreml]"'


def _ct() -> Any:
    """coremltools, imported on first use; its import-time warnings about the missing macOS runtime are noise
    on Linux (prediction is refused there with a clear error of our own)."""
    log = logging.getLogger("coremltools")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        import coremltools as ct
    except ImportError as exc:
        raise BackendUnavailableError(
            f"the Core ML backend needs coremltools ({exc})", hint=_INSTALL_HINT
        ) from None
    finally:
        log.setLevel(level)
    return ct


def check_available() -> None:
    """Raise BackendUnavailableError now, before hours of converting, when coremltools is not installed."""
    _ct()


def mil_name(onnx_name: str) -> str:
    """The MIL name of an ONNX value: identifier characters only (what Core ML keeps in the spec)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", onnx_name)
    return name if name[:1].isalpha() or name[:1] == "_" else f"v_{name}"


# ---------------------------------------------------------------------------------------------------------
# ONNX -> MIL


_DTYPES = {  # ONNX element type -> (MIL dtype name, numpy dtype of a constant)
    ir.DataType.FLOAT: ("fp32", np.float32),
    ir.DataType.FLOAT16: ("fp16", np.float16),
    ir.DataType.INT64: ("int32", np.int32),  # Core ML has no int64 tensors: positions and indices go as int32
    ir.DataType.INT32: ("int32", np.int32),
    ir.DataType.BOOL: ("bool", np.bool_),
}


def _const(value: ir.Value) -> np.ndarray | None:
    t = value.const_value
    if t is None:
        return None
    arr = t.numpy()
    if arr.dtype == np.int64:
        arr = arr.astype(np.int32)
    return arr


class _Translator:
    """One pass over the graph's nodes (topologically sorted by construction), each ONNX value bound to a MIL
    var or, while it is a constant, to a numpy array (MIL folds ops on constants itself)."""

    def __init__(self, mb: Any, types: Any) -> None:
        self.mb, self.types = mb, types
        self.env: dict[str, Any] = {}
        self.names: set[str] = set()

    def name(self, onnx_name: str) -> str:
        base = mil_name(onnx_name)
        name, i = base, 1
        while name in self.names:
            name, i = f"{base}_{i}", i + 1
        self.names.add(name)
        return name

    def get(self, value: ir.Value | None) -> Any:
        if value is None:
            return None
        if value.name not in self.env:
            arr = _const(value)
            if arr is None:
                raise ModelFormatError(f"Core ML export: value {value.name!r} has no producer")
            self.env[value.name] = arr
        return self.env[value.name]

    def static(self, node: ir.Node, i: int, what: str) -> np.ndarray:
        """An input MIL needs at build time (axes, shapes, sizes): it must be a constant."""
        v = node.inputs[i] if i < len(node.inputs) else None
        arr = None if v is None else (_const(v) if v.name not in self.env else self.env[v.name])
        if not isinstance(arr, np.ndarray):
            raise ModelFormatError(
                f"Core ML export: {node.op_type} {node.name!r} needs a constant {what}",
                hint="export a static graph (edge convert --static) or pass fixed dims",
            )
        return arr

    def node(self, node: ir.Node) -> None:
        mb, op = self.mb, node.op_type
        a = [self.get(v) for v in node.inputs]
        attrs = node.attributes
        name = self.name(node.outputs[0].name)
        binary = {"Add": mb.add, "Sub": mb.sub, "Mul": mb.mul, "Div": mb.real_div, "Pow": mb.pow}
        unary = {"Cos": mb.cos, "Sin": mb.sin, "Sqrt": mb.sqrt, "Sigmoid": mb.sigmoid, "Tanh": mb.tanh}
        if op in binary:
            out = binary[op](x=a[0], y=a[1], name=name)
        elif op in unary:
            out = unary[op](x=a[0], name=name)
        elif op == "MatMul":
            out = mb.matmul(x=a[0], y=a[1], name=name)
        elif op == "Cast":
            to = ir.DataType(attrs["to"].as_int())
            if to not in _DTYPES:
                raise ModelFormatError(f"Core ML export: Cast {node.name!r} to {to.name} is not mapped")
            mil, np_type = _DTYPES[to]
            out = (
                a[0].astype(np_type)
                if isinstance(a[0], np.ndarray)
                else mb.cast(x=a[0], dtype=mil, name=name)
            )
        elif op == "Unsqueeze":
            out = mb.expand_dims(x=a[0], axes=self.static(node, 1, "axes").tolist(), name=name)
        elif op == "Concat":
            out = mb.concat(values=a, axis=attrs["axis"].as_int(), interleave=False, name=name)
        elif op in ("ReduceMean", "ReduceSum"):
            keep = bool(attrs["keepdims"].as_int()) if "keepdims" in attrs else True
            axes = self.static(node, 1, "axes").tolist()
            reduce = mb.reduce_mean if op == "ReduceMean" else mb.reduce_sum
            out = reduce(x=a[0], axes=axes, keep_dims=keep, name=name)
        elif op == "Reshape":
            out = mb.reshape(x=a[0], shape=self._reshape_to(node, a[0]), name=name)
        elif op == "Transpose":
            rank = len(a[0].shape)
            perm = attrs["perm"].as_ints() if "perm" in attrs else list(range(rank))[::-1]
            out = mb.transpose(x=a[0], perm=list(perm), name=name)
        elif op == "Softmax":
            out = mb.softmax(x=a[0], axis=attrs["axis"].as_int() if "axis" in attrs else -1, name=name)
        elif op == "Gather":
            axis = attrs["axis"].as_int() if "axis" in attrs else 0
            out = mb.gather(x=a[0], indices=a[1], axis=axis, name=name)
        elif op == "Split":
            axis = attrs["axis"].as_int() if "axis" in attrs else 0
            sizes = self.static(node, 1, "split sizes").tolist()
            out = mb.split(x=a[0], split_sizes=sizes, axis=axis, name=name)
        elif op == "DequantizeLinear":
            out = self._dequantize(node, name)
        else:  # unreachable: the graph is checked against SUPPORTED_OPS first
            raise ModelFormatError(f"Core ML export: no MIL mapping for {op}")
        outs = out if isinstance(out, (list, tuple)) else [out]
        for value, var in zip(node.outputs, outs, strict=True):
            self.env[value.name] = var

    def _reshape_to(self, node: ir.Node, x: Any) -> list[int]:
        """ONNX's 0 (copy that input dim) resolved here: the shapes are static."""
        shape = self.static(node, 1, "shape").tolist()
        allow_zero = "allowzero" in node.attributes and node.attributes["allowzero"].as_int() == 1
        return [int(x.shape[i]) if d == 0 and not allow_zero else int(d) for i, d in enumerate(shape)]

    def _dequantize(self, node: ir.Node, name: str) -> Any:
        """DequantizeLinear on constant codes -> constexpr_blockwise_shift_scale with the same numbers."""
        types = self.types
        q_value = node.inputs[0]
        codes = _const(q_value)
        scale = self.static(node, 1, "scale")
        zero = self.static(node, 2, "zero point") if len(node.inputs) > 2 and node.inputs[2] else None
        if codes is None:
            raise ModelFormatError(f"Core ML export: DequantizeLinear {node.name!r} on a non-constant input")
        qtype = q_value.const_value.dtype  # type: ignore[union-attr]
        sub_byte = {
            ir.DataType.INT4: types.np_int4_dtype,
            ir.DataType.UINT4: types.np_uint4_dtype,
            ir.DataType.INT8: np.dtype(np.int8),
            ir.DataType.UINT8: np.dtype(np.uint8),
        }
        if qtype not in sub_byte:
            raise ModelFormatError(f"Core ML export: DequantizeLinear {node.name!r} on {qtype.name} codes")
        blocks = _block_shape(node, codes.shape, scale.shape)
        scale = _expand_blocks(scale, codes.shape, blocks)
        data = np.asarray(codes).astype(np.int16).astype(sub_byte[qtype])
        kwargs: dict[str, Any] = {"data": data, "scale": scale}
        if zero is not None:
            offset = _expand_blocks(zero, codes.shape, blocks)  # the same shape as the scales in ONNX too
            kwargs["offset"] = offset.astype(np.int16).astype(sub_byte[qtype])
        # named after the codes' initializer, so a weight can be found in the spec by its ONNX name
        return self.mb.constexpr_blockwise_shift_scale(**kwargs, name=self.name(q_value.name))


def _block_shape(node: ir.Node, data_shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> list[int]:
    """The block size along each dim of the codes, from DequantizeLinear's axis / block_size attributes."""
    rank = len(data_shape)
    attrs = node.attributes
    axis = attrs["axis"].as_int() if "axis" in attrs else 1
    axis = axis + rank if axis < 0 else axis
    block = attrs["block_size"].as_int() if "block_size" in attrs else 0
    if len(scale_shape) == 0:  # per tensor
        return list(data_shape)
    if block == 0:  # per axis: one scale per index of `axis`
        return [1 if i == axis else d for i, d in enumerate(data_shape)]
    return [block if i == axis else 1 for i in range(rank)]


def _expand_blocks(arr: np.ndarray, data_shape: tuple[int, ...], blocks: list[int]) -> np.ndarray:
    """Per-block parameters in MIL's form: the same rank as the codes and a block that divides each dim (MIL
    infers the block from data / scale shape). A last partial block (ONNX allows it) is met by splitting every
    block into gcd(block, dim)-sized ones that repeat its parameter: lossless."""
    arr = np.asarray(arr).reshape([math.ceil(d / b) for d, b in zip(data_shape, blocks, strict=True)])
    for i, (d, b) in enumerate(zip(data_shape, blocks, strict=True)):
        if d % b:
            g = math.gcd(b, d)
            arr = np.take(arr, (np.arange(d // g) * g) // b, axis=i)
    return np.ascontiguousarray(arr)


def _load_graph(onnx_path: Path, dims: Mapping[str, int] | None) -> ir.Model:
    model = ir.load(str(onnx_path))
    symbolic = sorted(
        {
            str(d)
            for v in (*model.graph.inputs, *model.graph.outputs)
            for d in (v.shape or [])
            if not isinstance(d, int)
        }
    )
    if symbolic:
        if not dims:
            raise ModelFormatError(
                f"{onnx_path.name}: dims {', '.join(symbolic)} are symbolic; Core ML wants fixed shapes",
                hint="convert with --static, or give the dims to export",
            )
        from edge.graph_opt import specialize_shapes

        specialize_shapes(model, dims)
    unknown = sorted({n.op_type for n in model.graph if n.domain not in ("", "ai.onnx")} | {
        n.op_type for n in model.graph if n.op_type not in SUPPORTED_OPS
    })  # fmt: skip
    if unknown:
        raise ModelFormatError(
            f"{onnx_path.name}: Core ML export has no MIL mapping for {', '.join(unknown)}",
            hint="convert with --target coreml (standard ONNX ops only)",
        )
    return model


def _program(model: ir.Model, ct: Any) -> Any:
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function, Program, types

    placeholders = {}
    for v in model.graph.inputs:
        if v.dtype not in _DTYPES:
            raise ModelFormatError(f"Core ML export: input {v.name!r} of type {v.dtype} is not mapped")
        mil_dtype = {"fp32": types.fp32, "fp16": types.fp16, "int32": types.int32, "bool": types.bool}
        placeholders[v.name] = mb.placeholder(
            tuple(int(d) for d in v.shape), mil_dtype[_DTYPES[v.dtype][0]], name=v.name
        )
    t = _Translator(mb, types)
    t.names.update(placeholders)
    with Function(placeholders, ct.target.iOS18) as fn:
        t.env.update(fn.inputs)
        for node in model.graph:
            t.node(node)
        outputs, seen = [], set()
        for v in model.graph.outputs:
            var = t.env.get(v.name)
            if var is None or isinstance(var, np.ndarray):
                raise ModelFormatError(f"Core ML export: output {v.name!r} is a constant or missing")
            if var.name != v.name or var.name in seen or v.name in placeholders:
                var = mb.identity(x=var, name=v.name)  # Core ML names the output after its var
            seen.add(var.name)
            outputs.append(var)
        fn.set_outputs(outputs)
    prog = Program()
    prog.add_function("main", fn)
    return prog


def export_mlpackage(
    onnx_path: str | Path,
    out_path: str | Path,
    *,
    dims: Mapping[str, int] | None = None,
    compute_precision: str = "fp16",
) -> Path:
    """Translate one coreml-lowered partition graph into `out_path` (an .mlpackage directory, replaced if
    there). `dims` fixes a dynamic graph's symbolic dims (q, r, past0, ...). Compute is fp16 (what the Neural
    Engine runs) or fp32; the compressed weights keep their float32 scales either way."""
    ct = _ct()
    src, out = Path(onnx_path), Path(out_path)
    if out.suffix != ".mlpackage":
        raise ValueError(f"{out}: a Core ML program is saved as a .mlpackage directory")
    if compute_precision not in ("fp16", "fp32"):
        raise ValueError(f"compute_precision must be fp16 or fp32, not {compute_precision!r}")
    graph = _load_graph(src, dims)
    prog = _program(graph, ct)
    precision = (
        ct.transform.FP16ComputePrecision(
            op_selector=lambda op: op.op_type != "constexpr_blockwise_shift_scale"
        )
        if compute_precision == "fp16"
        else ct.precision.FLOAT32
    )
    # a range-propagation pass of coremltools overflows harmlessly on integer casts: not the user's concern
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "overflow encountered in cast", RuntimeWarning)
        mlmodel = ct.convert(
            prog,
            convert_to="mlprogram",
            minimum_deployment_target=ct.target.iOS18,
            compute_precision=precision,
            skip_model_load=True,
        )
    mlmodel.short_description = f"edge partition {src.name}"
    mlmodel.user_defined_metadata["edge.source_graph"] = src.name
    if out.exists():
        shutil.rmtree(out)
    mlmodel.save(str(out))
    try:
        _check_saved(out, graph)
    except ModelFormatError:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return out


def _check_saved(package: Path, graph: ir.Model) -> None:
    """The saved spec against the graph it came from: the same inputs and outputs (names, order, shapes), one
    compressed weight per DequantizeLinear and one matmul (or linear, when coremltools fused it) per MatMul."""
    info = inspect_mlpackage(package)
    want = {
        v.name: (tuple(int(d) for d in v.shape), "INT32" if _DTYPES[v.dtype][0] == "int32" else "FLOAT32")
        for v in graph.graph.inputs
    }
    problems = []
    if list(info.inputs.items()) != list(want.items()):
        problems.append(f"inputs {info.inputs} != {want}")
    outputs = [(v.name, tuple(int(d) for d in v.shape)) for v in graph.graph.outputs]
    if [(k, shape) for k, (shape, _) in info.outputs.items()] != outputs:
        problems.append(f"outputs {info.outputs} != {outputs}")
    ops = Counter(n.op_type for n in graph.graph)
    if info.ops["constexpr_blockwise_shift_scale"] != ops["DequantizeLinear"]:
        problems.append(
            f"{info.ops['constexpr_blockwise_shift_scale']} compressed weights, {ops['DequantizeLinear']} in ONNX"
        )
    if info.ops["matmul"] + info.ops["linear"] != ops["MatMul"]:
        problems.append(f"{info.ops['matmul'] + info.ops['linear']} matmuls, {ops['MatMul']} in ONNX")
    if problems:
        raise ModelFormatError(
            f"{package}: the Core ML program does not match its graph: {'; '.join(problems)}"
        )


def export_artifact(
    artifact_dir: str | Path,
    *,
    prefill_chunk: int = 64,
    capacity: int = 1024,
    log: Callable[[str], None] | None = None,
) -> list[dict[str, str]]:
    """Export every partition graph of a coreml artifact next to it: `<graph stem>.mlpackage` per shape variant
    of a static artifact; a dynamic one is exported as a prefill (prefill_chunk tokens) and a decode (1 token)
    package over `capacity` KV slots, the fixed shapes Core ML wants. Returns, per partition, variant ->
    package name."""
    from edge.models.artifact import open_artifact
    from edge.models.convert import static_dims

    art = open_artifact(artifact_dir)
    if art.target != "coreml":
        raise ModelFormatError(
            f"{art.path}: converted for {art.target}, not coreml", hint="convert --target coreml"
        )
    say = log or (lambda _msg: None)
    packages: list[dict[str, str]] = []
    for index, part in enumerate(art.partitions):
        done: dict[str, str] = {}
        for variant, graph in part.graphs.items():
            jobs = (
                [(f"{Path(graph).stem}.mlpackage", variant, None)]
                if art.shapes.static
                else [
                    (f"part{index}.{v}.mlpackage", v, static_dims(art.config, q, capacity))
                    for v, q in (("prefill", prefill_chunk), ("decode", 1))
                ]
            )
            for name, v, dims in jobs:
                export_mlpackage(art.path / graph, art.path / name, dims=dims)
                say(f"  core ml: {name}")
                done[v] = name
        packages.append(done)
    return packages


# ---------------------------------------------------------------------------------------------------------
# Validation without the Core ML runtime, and prediction with it


@dataclass(frozen=True)
class MLPackageInfo:
    inputs: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, Core ML array type)
    outputs: dict[str, tuple[tuple[int, ...], str]]
    ops: Counter[str]  # MIL op type -> count in the main function
    spec_version: int


def inspect_mlpackage(path: str | Path) -> MLPackageInfo:
    """Load a package's spec back (no Core ML runtime needed): its features and the ops of its program."""
    ct = _ct()
    spec = ct.utils.load_spec(str(path))
    if spec.WhichOneof("Type") != "mlProgram":
        raise ModelFormatError(f"{path}: not an ML program")
    array_types = ct.proto.FeatureTypes_pb2.ArrayFeatureType.ArrayDataType

    def features(fs: Any) -> dict[str, tuple[tuple[int, ...], str]]:
        return {
            f.name: (tuple(int(d) for d in f.type.multiArrayType.shape), array_types.Name(f.type.multiArrayType.dataType))
            for f in fs
        }  # fmt: skip

    ops: Counter[str] = Counter()

    def count(block: Any) -> None:
        for op in block.operations:
            ops[op.type] += 1
            for b in op.blocks:
                count(b)

    fn = spec.mlProgram.functions["main"]
    count(fn.block_specializations[fn.opset])
    return MLPackageInfo(
        features(spec.description.input), features(spec.description.output), ops, spec.specificationVersion
    )


def mlpackage_weights(path: str | Path) -> dict[str, np.ndarray]:
    """Every compressed weight of a saved package, decompressed by coremltools' own constexpr semantics from
    the spec and its weight blob: MIL name -> float array."""
    ct = _ct()
    from coremltools.converters.mil.frontend.milproto.load import load as load_milproto

    spec = ct.utils.load_spec(str(path))
    weights_dir = Path(path) / "Data" / "com.apple.CoreML" / "weights"
    prog = load_milproto(spec, spec.specificationVersion, str(weights_dir))
    return {
        op.name: np.asarray(op.materialized_val_inference())
        for op in prog.functions["main"].operations
        if op.op_type == "constexpr_blockwise_shift_scale"
    }


def predict(path: str | Path, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a package once with the Core ML runtime (macOS only); int64 feeds go as Core ML's int32."""
    if sys.platform != "darwin":
        raise BackendUnavailableError(
            "Core ML runs only on macOS", hint="export works here; predict on a Mac"
        )
    ct = _ct()
    model = ct.models.MLModel(str(path))
    arrays = {k: v.astype(np.int32) if v.dtype == np.int64 else v for k, v in feeds.items()}
    return {k: np.asarray(v) for k, v in model.predict(arrays).items()}
