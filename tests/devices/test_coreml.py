"""Core ML export (devices/coreml.py) on tiny models of every architecture: each partition graph of a coreml
artifact becomes an .mlpackage whose saved spec has the graph's inputs, outputs and ops, and whose compressed
weights, decompressed from the saved package, equal the ONNX DequantizeLinear weights (as ONNX Runtime computes
them) bit for bit. Prediction needs the Core ML runtime: macOS only. The slow test exports smollm2-135m."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import gguf
import numpy as np
import onnx
import pytest
from onnx import helper

from edge.devices.coreml import (
    SUPPORTED_OPS,
    check_available,
    export_artifact,
    export_mlpackage,
    inspect_mlpackage,
    mil_name,
    mlpackage_weights,
    predict,
)
from edge.errors import BackendUnavailableError, ModelFormatError
from edge.graph_opt import QuantSpec
from edge.models.artifact import open_artifact, record_mlpackages
from edge.models.convert import ConvertOptions, convert
from tests.graph_opt.graphs import ARCHS, feeds_for, run_ort, tiny_config, tiny_gguf
from tests.tiny_models import TinySpec, write_tiny_model

MACOS_ONLY = pytest.mark.skipif(sys.platform != "darwin", reason="Core ML runs only on macOS")
STATIC = {"static": True, "prefill_chunk": 8, "capacity": 32}

pytestmark = pytest.mark.usefixtures("edge_cache")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    for arch in ARCHS:
        tiny_gguf(root, arch)
    # Q4_1 source weights kept as stored: uint4 codes with zero points and the block-bias term (ReduceSum)
    write_tiny_model(root / "llama-q4_1.gguf", TinySpec(weight_type=gguf.GGMLQuantizationType.Q4_1, seed=3))
    return root


def _coreml_artifact(src: Path, out: Path, quant: QuantSpec, **shapes: object) -> Path:
    convert(src, out, ConvertOptions(target="coreml", quant=quant, **shapes))  # type: ignore[arg-type]
    record_mlpackages(out, export_artifact(out, prefill_chunk=8, capacity=32))
    return out


def _graph_io(model: onnx.ModelProto, dims: dict[str, int] | None = None) -> tuple[dict, dict]:
    """The graph's inputs and outputs as Core ML features: int64 goes as INT32, symbolic dims as given."""

    def shape(v: onnx.ValueInfoProto) -> tuple[int, ...]:
        return tuple(
            d.dim_value if d.HasField("dim_value") else _dim(d.dim_param, dims or {})
            for d in v.type.tensor_type.shape.dim
        )

    kind = {onnx.TensorProto.FLOAT: "FLOAT32", onnx.TensorProto.INT64: "INT32"}
    inputs = {v.name: (shape(v), kind[v.type.tensor_type.elem_type]) for v in model.graph.input}
    outputs = {v.name: (shape(v), "FLOAT32") for v in model.graph.output}
    return inputs, outputs


def _dim(name: str, dims: dict[str, int]) -> int:
    return sum(dims[p] for p in name.split("_plus_"))


def _onnx_weights(path: Path) -> dict[str, np.ndarray]:
    """Each DequantizeLinear of the graph evaluated alone by ONNX Runtime: the reference weights."""
    import onnxruntime as ort

    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    out: dict[str, np.ndarray] = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear":
            continue
        dq = helper.make_node("DequantizeLinear", list(node.input), ["w"], name="dq")
        dq.attribute.extend(node.attribute)
        graph = helper.make_graph(
            [dq],
            "dq",
            [],
            [helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, None)],
            initializer=[inits[name] for name in node.input if name],
        )
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
        sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        out[mil_name(node.input[0])] = sess.run(None, {})[0]
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_static_export_per_arch(models: Path, tmp_path: Path, arch: str) -> None:
    out = _coreml_artifact(tiny_gguf(models, arch), tmp_path / "art", QuantSpec("int4", 32, True), **STATIC)
    art = open_artifact(out)
    assert art.partitions[0].mlpackages == {
        "prefill": "part0.prefill.mlpackage",
        "decode": "part0.decode.mlpackage",
    }
    ops = []
    for variant, package in art.partitions[0].mlpackages.items():
        graph = onnx.load(str(art.graph(0, variant)), load_external_data=False)
        info = inspect_mlpackage(out / package)
        ops.append(info.ops)
        inputs, outputs = _graph_io(graph)
        assert list(info.inputs.items()) == list(inputs.items())
        assert list(info.outputs.items()) == list(outputs.items())
        q = 8 if variant == "prefill" else 1
        assert info.inputs["hidden"][0] == (1, q, 64) and info.outputs["logits"][0] == (1, q, 320)
        onnx_ops = Counter(n.op_type for n in graph.graph.node)
        assert set(onnx_ops) <= SUPPORTED_OPS
        # one compressed constant per DequantizeLinear, nothing decompressed into a plain const
        assert info.ops["constexpr_blockwise_shift_scale"] == onnx_ops["DequantizeLinear"] > 0
        assert info.ops["matmul"] + info.ops["linear"] == onnx_ops["MatMul"]
        assert info.spec_version >= 9  # iOS18
    assert ops[0] == ops[1] and ops[0].total() > 100  # the two shape variants: one program, other shapes


@pytest.mark.parametrize(
    ("name", "quant", "static"),
    [
        ("llama", QuantSpec("int4", 32, True), True),  # int4 codes, no zero point
        ("gemma3", QuantSpec("int4", 32, False), True),  # uint4 codes + zero points
        ("qwen2", QuantSpec("int8"), False),  # int8 per channel, a dynamic graph exported at fixed dims
        ("llama-q4_1", QuantSpec("keep"), True),  # Q4_1 kept: uint4 + zero points + block bias
    ],
)
def test_weights_bit_exact(models: Path, tmp_path: Path, name: str, quant: QuantSpec, static: bool) -> None:
    src = models / f"{name}.gguf"
    shapes = STATIC if static else {}
    out = _coreml_artifact(src, tmp_path / "art", quant, **shapes)
    art = open_artifact(out)
    graph = art.graph(0, "decode" if static else "dynamic")
    want = _onnx_weights(graph)
    got = mlpackage_weights(out / art.partitions[0].mlpackages["decode"])
    assert want and sorted(got) == sorted(want)
    for key, ref in want.items():
        assert got[key].dtype == np.float32 and got[key].shape == ref.shape, key
        assert np.array_equal(got[key].view(np.uint32), ref.view(np.uint32)), key


def test_dynamic_export_needs_dims(models: Path, tmp_path: Path) -> None:
    out = tmp_path / "art"
    convert(models / "llama.gguf", out, ConvertOptions(target="coreml"))
    graph = out / "part0.dynamic.onnx"
    with pytest.raises(ModelFormatError, match="symbolic") as err:
        export_mlpackage(graph, tmp_path / "x.mlpackage")
    assert "--static" in str(err.value)
    dims = {"q": 5, "r": 2, "past0": 16}
    package = export_mlpackage(graph, tmp_path / "d.mlpackage", dims=dims)
    inputs, outputs = _graph_io(onnx.load(str(graph), load_external_data=False), dims)
    info = inspect_mlpackage(package)
    assert info.inputs == inputs and info.outputs == outputs
    assert info.inputs["mask_0"][0] == (1, 1, 5, 21) and info.outputs["logits"][0] == (1, 2, 320)


def test_unmapped_op_is_named(tmp_path: Path) -> None:
    x = helper.make_tensor_value_info("hidden", onnx.TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph(
        [helper.make_node("Erf", ["hidden"], ["e"]), helper.make_node("Relu", ["e"], ["out"])], "g", [x], [y]
    )
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), str(path))
    with pytest.raises(ModelFormatError, match="no MIL mapping for Erf, Relu"):
        export_mlpackage(path, tmp_path / "g.mlpackage")
    assert not (tmp_path / "g.mlpackage").exists()


def test_missing_coremltools_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        sys.modules, "coremltools", None
    )  # what `import coremltools` meets when not installed
    with pytest.raises(BackendUnavailableError, match=r'pip install "edge-llm\[coreml\]"'):
        check_available()


def test_cli_convert_writes_packages(models: Path, tmp_path: Path, edge_cache: Path) -> None:
    out = tmp_path / "cli"
    env = {**os.environ, "EDGE_CACHE_DIR": str(edge_cache)}
    env.pop("EDGE_DEBUG", None)
    cmd = [sys.executable, "-m", "edge.cli", "convert", str(models / "qwen2.gguf"), "--target", "coreml"]
    cmd += ["--prefill-chunk", "4", "--capacity", "16", "-o", str(out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    # a dynamic artifact: fixed-shape prefill (--prefill-chunk) and decode packages next to its graph
    assert result["partitions"][0]["mlpackages"] == {
        "prefill": "part0.prefill.mlpackage",
        "decode": "part0.decode.mlpackage",
    }
    assert open_artifact(out).partitions[0].mlpackages == result["partitions"][0]["mlpackages"]
    prefill = inspect_mlpackage(out / "part0.prefill.mlpackage")
    assert prefill.inputs["hidden"][0] == (1, 4, 64) and prefill.inputs["past_key_0"][0] == (1, 16, 2, 16)
    assert inspect_mlpackage(out / "part0.decode.mlpackage").outputs["new_key_1"][0] == (1, 1, 2, 16)


@pytest.mark.skipif(sys.platform == "darwin", reason="checks the refusal off macOS")
def test_predict_refused_off_macos(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailableError, match="Core ML runs only on macOS"):
        predict(tmp_path / "x.mlpackage", {})


@MACOS_ONLY
@pytest.mark.parametrize(("precision", "tol"), [("fp32", 1e-3), ("fp16", 3e-2)])
def test_predict_matches_onnx_runtime(models: Path, tmp_path: Path, precision: str, tol: float) -> None:
    src = tiny_gguf(models, "llama")
    out = tmp_path / "art"
    convert(src, out, ConvertOptions(target="coreml", quant=QuantSpec("int8"), **STATIC))  # type: ignore[arg-type]
    graph = out / "part0.prefill.onnx"
    package = export_mlpackage(graph, tmp_path / "p.mlpackage", compute_precision=precision)
    model = onnx.load(str(graph))
    feeds = feeds_for(model, tiny_config(src), q=8, past=32)
    want = run_ort(model, feeds)
    got = predict(package, feeds)
    for name, ref in want.items():
        scale = float(np.abs(ref).max())
        np.testing.assert_allclose(got[name].reshape(ref.shape), ref, atol=tol * scale, rtol=tol)
    assert (got["logits"].reshape(want["logits"].shape).argmax(-1) == want["logits"].argmax(-1)).all()


@pytest.mark.slow
def test_smollm2_export(tmp_path: Path) -> None:
    """The issue's done-when: smollm2-135m (INT4 symmetric per-block, static shapes) -> valid .mlpackages."""
    out = tmp_path / "smollm2"
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}  # edge_cache: the shared models
    cmd = [sys.executable, "-m", "edge.cli", "convert", "smollm2-135m", "--target", "coreml", "--static"]
    cmd += ["--quant", "int4", "--sym", "-o", str(out), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    art = open_artifact(out)
    assert art.partitions[0].mlpackages == {
        "prefill": "part0.prefill.mlpackage",
        "decode": "part0.decode.mlpackage",
    }
    for variant, package in art.partitions[0].mlpackages.items():
        info = inspect_mlpackage(out / package)
        graph = onnx.load(str(art.graph(0, variant)), load_external_data=False)
        inputs, outputs = _graph_io(graph)
        assert info.inputs == inputs and info.outputs == outputs
        assert (
            len(info.inputs) == 2 + 1 + 2 * 30 + 1
        )  # hidden, positions, mask_0, past K/V of 30 layers, rows
        q = 64 if variant == "prefill" else 1
        assert info.outputs["logits"][0] == (1, q, 49152)
        n_dq = sum(n.op_type == "DequantizeLinear" for n in graph.graph.node)
        assert (
            info.ops["constexpr_blockwise_shift_scale"] == n_dq == 30 * 4 + 1
        )  # fused qkv, o, gate-up, down; head
        size = sum(f.stat().st_size for f in (out / package).rglob("*") if f.is_file())
        assert 60 << 20 < size < 110 << 20  # ~4.5 bits per weight, not float
