"""Each fusion pass on tiny random models of all three families: the pattern is there before and gone after
(the fused op in its place), fewer nodes, and the same outputs on random inputs (max abs error < 1e-4, fp32)
on ONNX Runtime and, for the OpenVINO forms, on OpenVINO too."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from edge import graph_opt
from edge.graph_opt import PassContext, run_passes
from edge.models.arch import ArchConfig
from tests.graph_opt.graphs import (
    ARCHS,
    feeds_for,
    max_abs_diff,
    ops,
    run_openvino,
    run_ort,
    tiny_config,
    tiny_gguf,
    tiny_graph,
    to_ir,
)

TOL = 1e-4

# pass -> (prerequisite passes, ops of the pattern that must disappear, the fused op)
CASES = {
    ("rmsnorm", "ort"): ([], ["Pow", "ReduceMean", "Sqrt", "Div"], "SimplifiedLayerNormalization"),
    ("rmsnorm", "openvino"): ([], ["Pow", "ReduceMean", "Sqrt", "Div"], "RMSNormalization"),
    ("skip_rmsnorm", "ort"): (["rmsnorm"], [], "SkipSimplifiedLayerNormalization"),
    ("rotary", "ort"): ([], [], "RotaryEmbedding"),
    ("attention", "ort"): ([], ["Softmax"], "Attention"),
    ("attention", "openvino"): (["rmsnorm"], ["Softmax"], "Attention"),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[ArchConfig, onnx.ModelProto]]:
    root = tmp_path_factory.mktemp("tiny_graphs")
    built: dict[str, tuple[ArchConfig, onnx.ModelProto]] = {}

    def get(arch: str) -> tuple[ArchConfig, onnx.ModelProto]:
        if arch not in built:
            path = tiny_gguf(root, arch)
            built[arch] = (tiny_config(path), tiny_graph(path))
        return built[arch]

    return get


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(("name", "target"), list(CASES))
def test_fusion_pass(
    tiny: Callable[[str], tuple[ArchConfig, onnx.ModelProto]],
    tmp_path: Path,
    arch: str,
    name: str,
    target: str,
) -> None:
    cfg, proto = tiny(arch)
    feeds = feeds_for(proto, cfg, q=3, past=5)
    want = run_ort(proto, feeds)
    prereq, gone, fused = CASES[(name, target)]
    model = to_ir(proto)
    run_passes(model, ["fold", *prereq], PassContext(target))
    before = ops(model)
    [rec] = run_passes(model, [name], PassContext(target))
    after = ops(model)
    print(f"{arch} {name}/{target}: {rec.line()}")

    assert rec.applied and rec.rewrites > 0
    assert after.get(fused, 0) - before.get(fused, 0) == rec.rewrites  # one fused op per match
    assert rec.nodes_after < rec.nodes_before
    for op in gone:
        assert before.get(op, 0) > 0 and after.get(op, 0) == 0, op
    if name == "rotary":  # each match took one rotate-half MatMul (and 2 Mul + 1 Add)
        assert before["MatMul"] - after["MatMul"] == rec.rewrites == 2 * cfg.n_layer
    if name == "attention":  # only grouped queries' two reorders are left: rows in, context out
        grouped = cfg.n_head > cfg.n_head_kv
        assert after.get("Transpose", 0) == (2 * rec.rewrites if grouped else 0) < before["Transpose"]
        assert (after.get("Tile", 0) > 0) == grouped  # the mask's, shared by the layers of a mask input
    got = run_ort(model, feeds)
    assert set(got) == set(want)
    assert max_abs_diff(want, got) < TOL
    if target == "openvino":
        assert max_abs_diff(want, run_openvino(model, feeds, tmp_path)) < TOL


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("target", ["ort", "openvino", "coreml"])
def test_pipeline_keeps_outputs(
    tiny: Callable[[str], tuple[ArchConfig, onnx.ModelProto]], tmp_path: Path, arch: str, target: str
) -> None:
    """The whole pipeline of each target (quantization 'keep'): fewer nodes, same outputs, at q=1 and q=4."""
    cfg, proto = tiny(arch)
    model = to_ir(proto)
    result = graph_opt.optimize(model, target)
    first, last = result.records[0], result.records[-1]
    # ort: ~half the nodes; openvino takes only the RMSNorm fusion (it fuses the rest itself); coreml none
    assert last.nodes_after < first.nodes_before * {"ort": 0.5, "openvino": 0.85, "coreml": 1.0}[target]
    for q, past in ((1, 7), (4, 3)):
        feeds = feeds_for(proto, cfg, q=q, past=past, seed=q)
        want = run_ort(proto, feeds)
        assert max_abs_diff(want, run_ort(model, feeds)) < TOL
        if target == "openvino":
            assert max_abs_diff(want, run_openvino(model, feeds, tmp_path)) < TOL
    if target == "coreml":
        assert all(n.domain != "com.microsoft" for n in model.graph.all_nodes())


def test_fold_removes_constant_work(tiny: Callable[[str], tuple[ArchConfig, onnx.ModelProto]]) -> None:
    cfg, proto = tiny("gemma3")
    model = to_ir(proto)
    [rec] = run_passes(model, ["fold"])
    assert rec.rewrites > 0 and rec.nodes_after < rec.nodes_before
    feeds = feeds_for(proto, cfg)
    assert max_abs_diff(run_ort(proto, feeds), run_ort(model, feeds)) == 0.0


def test_pass_registry_and_records() -> None:
    assert {
        "fold",
        "rmsnorm",
        "skip_rmsnorm",
        "rotary",
        "attention",
        "quantize",
        "lower",
        "specialize",
    } <= set(graph_opt.PASSES)
    for p in graph_opt.PASSES.values():
        assert p.doc, f"{p.name} has no docstring saying what it matches"
    assert graph_opt.pipeline("coreml") == ["fold", "quantize", "lower", "specialize", "fold"]
    assert "skip_rmsnorm" not in graph_opt.pipeline("openvino")
    assert "rotary" not in graph_opt.pipeline("ort", fuse=False)
    # a fusion that rounds differently runs only where precision "fast" allows it
    assert "gelu" not in graph_opt.pipeline("ort")
    assert "gelu" in graph_opt.pipeline("ort", precision="fast")
    assert "gelu" not in graph_opt.pipeline("ort", fuse=False, precision="fast")
    with pytest.raises(ValueError, match="unknown target"):
        graph_opt.pipeline("tpu")


def test_skipped_pass_is_recorded(tiny: Callable[[str], tuple[ArchConfig, onnx.ModelProto]]) -> None:
    _, proto = tiny("llama")
    model = to_ir(proto)
    [rec] = run_passes(model, ["skip_rmsnorm"], PassContext("coreml"))
    assert not rec.applied and rec.nodes_before == rec.nodes_after
    assert "skipped" in rec.line()


def test_rotary_leaves_other_matmuls(tiny: Callable[[str], tuple[ArchConfig, onnx.ModelProto]]) -> None:
    """Only the rotate-half matmuls are taken: a MatMul by another constant stays (weights are linears)."""
    _, proto = tiny("llama")
    model = to_ir(proto)
    n_mm = ops(model)["MatMul"]
    [rec] = run_passes(model, ["rotary"], PassContext("ort"))
    assert ops(model)["MatMul"] == n_mm - rec.rewrites
    assert rec.rewrites == 2 * 2  # Q and K of each of the 2 layers


def test_gelu_fusion(tiny: Callable[[str], tuple[ArchConfig, onnx.ModelProto]]) -> None:
    """gemma3's tanh GELU -> one FastGelu per layer, same outputs; a silu model has nothing to fuse."""
    cfg, proto = tiny("gemma3")
    feeds = feeds_for(proto, cfg, q=3, past=5)
    model = to_ir(proto)
    run_passes(model, ["fold"], PassContext("ort"))
    before = ops(model)
    [rec] = run_passes(model, ["gelu"], PassContext("ort"))
    after = ops(model)
    assert rec.rewrites == after["FastGelu"] == cfg.n_layer
    assert before["Tanh"] == cfg.n_layer and "Tanh" not in after
    assert before["Mul"] - after["Mul"] == 6 * cfg.n_layer
    assert max_abs_diff(run_ort(proto, feeds), run_ort(model, feeds)) < TOL
    llama = to_ir(tiny("llama")[1])
    [rec] = run_passes(llama, ["gelu"], PassContext("ort"))
    assert rec.rewrites == 0
