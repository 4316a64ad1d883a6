"""One linear layer: the builder emits every linear through graph_opt's emitter, the graph carries their list
(node tags) through the graph cache, fusions never rewrite a linear's nodes, and a tagged linear that a pass
broke stops with a clear error instead of being guessed at."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnxscript.rewriter import pattern

from edge.errors import ModelFormatError
from edge.graph_opt import (
    BlockWeight,
    is_linear_node,
    linears_in,
    quantize_int4,
    quantize_int8,
    target_proto,
)
from edge.graph_opt._rules import ROLE_KEY, apply_rules, cleanup
from edge.graph_opt.linear import emit_linear
from edge.models.gguf_file import open_gguf
from edge.models.weights import import_linear
from tests.graph_opt.graphs import SPECS, linear_graph, run_ort, tiny_config, tiny_graph, to_ir
from tests.tiny_models import write_tiny_model

T = gguf.GGMLQuantizationType


def _tagged(model: ir.Model) -> Counter[tuple[str, str, str]]:
    return Counter(
        (n.metadata_props["edge.linear"], n.op_type, n.metadata_props[ROLE_KEY])
        for n in model.graph
        if is_linear_node(n)
    )


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_builder_linears_are_the_graph_s_list(tmp_path: Path, arch: str) -> None:
    """Every linear the builder made is in the graph's list by name, with the file's own weight (bit for bit),
    also after the graph went to disk and back (what the graph cache does)."""
    path = write_tiny_model(tmp_path / "m.gguf", replace(SPECS[arch], weight_type=T.Q4_1))
    cfg = tiny_config(path)
    proto = tiny_graph(path)
    onnx.save_model(
        proto, tmp_path / "g.onnx", save_as_external_data=True, location="g.data", size_threshold=0
    )
    loaded = to_ir(onnx.load(str(tmp_path / "g.onnx")))
    found = linears_in(loaded)
    head = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
    per_layer = ["attn_q_fused", "attn_output.weight", "ffn_gate_fused", "ffn_down.weight"]
    assert [lin.name for lin in found] == [f"blk.{i}.{p}" for i in range(cfg.n_layer) for p in per_layer] + [
        head
    ]
    assert {lin.form for lin in found} == {"nbits"}
    g = open_gguf(path)
    for lin in found:
        assert isinstance(lin.weight, BlockWeight) and lin.weight.bias is not None  # Q4_1: a block bias
        if not lin.name.endswith("_fused"):  # fused: rows of several tensors
            want = import_linear(g, lin.name)
            assert isinstance(want, BlockWeight)
            np.testing.assert_array_equal(lin.weight.dequantize(), want.dequantize())


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_fusions_leave_linear_nodes_alone(tmp_path: Path, arch: str) -> None:
    """The ORT pipeline's fusions (RMSNorm, SkipRMSNorm, rotary, attention) rewrite nodes all around the
    linears and none of theirs: gemma3's post-attention norm reads attn_output's block-bias Add directly, the
    Add a fusion once took for a residual add."""
    path = write_tiny_model(tmp_path / "m.gguf", replace(SPECS[arch], weight_type=T.Q4_1))
    proto = tiny_graph(path)
    before = to_ir(proto)
    fused = to_ir(target_proto(proto, "ort", precision="exact"))
    assert _tagged(fused) == _tagged(before)
    kinds = Counter(n.op_type for n in fused.graph)
    assert kinds["SkipSimplifiedLayerNormalization"] > 0 and kinds["RotaryEmbedding"] > 0
    for a, b in zip(linears_in(before), linears_in(fused), strict=True):
        assert a.name == b.name
        np.testing.assert_array_equal(a.float_weight(), b.float_weight())
    if arch == "gemma3":  # the norm right after attn_output stays a plain norm of the linear's output
        out = {lin.name: lin.y for lin in linears_in(fused)}["blk.0.attn_output.weight"]
        assert [u.node.op_type for u in out.uses()] == ["SimplifiedLayerNormalization"]


def test_any_rule_spares_linears() -> None:
    """apply_rules refuses a match that takes in a linear's node, whatever the rule."""

    class AddToSub(pattern.RewriteRuleClassBase):
        def pattern(self, op, a, b):  # type: ignore[no-untyped-def]
            return op.Add(a, b)

        def rewrite(self, op, a, b):  # type: ignore[no-untyped-def]
            return op.Sub(a, op.Neg(b))

    rng = np.random.default_rng(0)
    w = quantize_int4(rng.standard_normal((8, 64)).astype(np.float32), 32)  # asymmetric: a block-bias Add
    model = to_ir(linear_graph({"a": w}))
    x = model.graph.inputs[0]
    plain = ir.node("Add", [x, x])
    model.graph.append(plain)
    model.graph.outputs.append(plain.outputs[0])
    plain.outputs[0].name = "plain"
    tagged = _tagged(model)
    assert tagged[("a", "Add", "bias")] == 1
    assert apply_rules(model, [AddToSub.rule()]) == 1  # the untagged Add only
    assert _tagged(model) == tagged


def test_shared_block_sum() -> None:
    """Two min-offset linears on one input: CSE merges their identical block sums into one pair; each still
    reads back with its bias, and re-emitting one leaves the other exact."""
    rng = np.random.default_rng(1)
    ws = {n: quantize_int4(rng.standard_normal((16, 64)).astype(np.float32), 32) for n in ("q", "k")}
    model = to_ir(linear_graph(ws))
    feeds = {"x": rng.standard_normal((3, 64)).astype(np.float32)}
    want = run_ort(model, feeds)
    cleanup(model)
    assert Counter(n.op_type for n in model.graph)["ReduceSum"] == 1
    found = {lin.name: lin for lin in linears_in(model)}
    for name, w in ws.items():
        np.testing.assert_array_equal(found[name].weight.dequantize(), w.dequantize())  # type: ignore[union-attr]
    emit_linear(model, found["q"], lowering="nbits_fzp")
    got = run_ort(model, feeds)
    np.testing.assert_array_equal(got["y_k"], want["y_k"])
    assert np.abs(got["y_q"] - want["y_q"]).max() < 1e-5 * np.abs(want["y_q"]).max()
    emit_linear(model, linears_in(model)[1], lowering="nbits_fzp")
    cleanup(model)
    assert "ReduceSum" not in {n.op_type for n in model.graph}


def test_a_broken_linear_is_an_error(tmp_path: Path) -> None:
    """A tagged linear missing a part (a pass rewrote it without the emitter) stops with its name."""
    path = write_tiny_model(tmp_path / "m.gguf", replace(SPECS["llama"], weight_type=T.Q4_1))
    model = to_ir(tiny_graph(path))
    bias_mm = next(
        n for n in model.graph if n.metadata_props.get(ROLE_KEY) == "bias" and n.op_type == "MatMul"
    )
    del bias_mm.metadata_props["edge.linear"]
    with pytest.raises(ModelFormatError, match=r"blk\.0\.attn_q_fused"):
        linears_in(model)


def test_quantizing_a_graph_without_linears_is_an_error() -> None:
    """A graph not built by edge (no tags) is not searched for linears; asking to quantize it says so."""
    from onnx import TensorProto, helper, numpy_helper

    from edge.graph_opt import QuantSpec, plan_quantization

    w = np.ones((16, 16), np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "foreign",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])],
        [numpy_helper.from_array(w, "w")],
    )
    model = to_ir(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    assert linears_in(model) == []
    with pytest.raises(ModelFormatError, match="no linear layers tagged"):
        plan_quantization(model, QuantSpec("int8"))


def test_nibbles_read_back_whatever_the_node_order() -> None:
    """An 8-bit weight as two 4-bit halves reads back as the one 8-bit weight, also when a topological sort
    put the low half first."""
    rng = np.random.default_rng(2)
    q = quantize_int8(rng.standard_normal((8, 64)).astype(np.float32))
    model = to_ir(linear_graph({"w": q}, lowering="nibbles"))
    hi, lo = (n for n in model.graph if n.op_type == "MatMulNBits")
    model.graph.remove(lo)
    model.graph.insert_before(hi, lo)
    assert [n.op_type for n in model.graph][:2] == ["MatMulNBits", "MatMulNBits"] and next(
        iter(model.graph)
    ) is lo
    (lin,) = linears_in(model)
    assert lin.form == "nibbles"
    np.testing.assert_array_equal(lin.weight.dequantize(), q.dequantize())  # type: ignore[union-attr]
