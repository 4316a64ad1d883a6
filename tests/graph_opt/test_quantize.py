"""Linear layers found in every emitted form and re-emitted exactly; the INT8 / INT4 quantizers, GPTQ, the
mixed-precision policy, and the quantize / lower passes on tiny models (all three families)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import onnx
import pytest

from edge import graph_opt
from edge.graph_opt import BlockWeight, PassContext, QuantReport, QuantSpec, run_passes
from edge.models.transformer import BuildOptions
from tests.graph_opt.graphs import (
    ARCHS,
    SPECS,
    feeds_for,
    linear_graph,
    max_abs_diff,
    ops,
    run_openvino,
    run_ort,
    tiny_config,
    tiny_graph,
    to_ir,
    to_proto,
    token_feeds,
)
from tests.tiny_models import write_tiny_model

T = gguf.GGMLQuantizationType


def _kl_top1(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    def logp(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    la, lb = logp(a), logp(b)
    return float((np.exp(la) * (la - lb)).sum(-1).mean()), float((a.argmax(-1) == b.argmax(-1)).mean())


# --- recognition and emission ----------------------------------------------------------------------------


@pytest.mark.parametrize("qtype", [T.F32, T.F16, T.Q4_0, T.Q4_1, T.Q5_1, T.Q8_0])
@pytest.mark.parametrize("lowering", ["nbits_split", "qdq"])
def test_linears_round_trip(tmp_path: Path, qtype: T, lowering: str) -> None:
    """Every linear of a graph is found (4 per layer with fused QKV / gate-up, and the head) and re-emitted in
    either form with identical outputs."""
    path = write_tiny_model(tmp_path / "m.gguf", replace(SPECS["llama"], weight_type=qtype))
    cfg = tiny_config(path)
    proto = tiny_graph(path, BuildOptions(lowering=lowering))
    feeds = feeds_for(proto, cfg)
    want = run_ort(proto, feeds)
    found = graph_opt.linears_in(to_ir(proto))
    assert len(found) == 4 * cfg.n_layer + 1
    for form in ("nbits", "qdq"):
        model = to_ir(proto)
        for lin in graph_opt.linears_in(model):
            graph_opt.emit_linear(model, lin, lowering=form)
        assert max_abs_diff(want, run_ort(model, feeds)) < 1e-6, form
        assert {lin.form for lin in graph_opt.linears_in(model)} <= {form, "float"}


# --- quantizers ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_int4_per_group(group: int, symmetric: bool) -> None:
    w = np.random.default_rng(0).standard_normal((64, 320)).astype(np.float32)  # 320: a partial last group
    q = graph_opt.quantize_int4(w, group, symmetric=symmetric)
    assert (q.bits, q.block_size, q.k_blocks) == (4, group, -(-320 // group))
    assert q.symmetric == symmetric and (q.bias is None) == symmetric  # asymmetric: a float offset per group
    assert q.codes.max() <= 15
    err = np.sqrt(((q.dequantize() - w) ** 2).mean()) / w.std()
    print(f"int4 g{group} {'sym' if symmetric else 'asym'}: relative rms error {err:.4f}")
    assert err < 0.11


@pytest.mark.parametrize("span", [15, 13, 12])
def test_int4_finds_a_4bit_grid_again(span: int) -> None:
    """Weights already on a 4-bit g32 grid (scale + min per block, as Q4_1 / Q4_K blocks decode) come back
    exactly, also when a block's codes span only 12..15 of the 16 levels; the integer-zero-point form could
    not (its offset is a whole number of steps)."""
    rng = np.random.default_rng(4)
    codes = rng.integers(0, span + 1, (48, 8, 32))
    codes[:, :, 0], codes[:, :, 1] = 0, span  # each block spans exactly `span` steps
    scale = rng.uniform(0.01, 0.1, (48, 8, 1))
    w = (codes * scale + rng.uniform(-1, 0, (48, 8, 1))).reshape(48, 256).astype(np.float32)
    q = graph_opt.quantize_int4(w, 32)
    assert np.abs(q.dequantize() - w).max() < 1e-5 * np.abs(w).max()


@pytest.mark.parametrize("symmetric", [False, True])
def test_int8_per_channel(symmetric: bool) -> None:
    w = (
        np.random.default_rng(1).standard_normal((48, 200)).astype(np.float32)
        * np.linspace(0.1, 3, 48)[:, None]
    )
    q = graph_opt.quantize_int8(w, symmetric=symmetric)
    assert q.k_blocks == 1 and q.scales.shape == (48, 1)  # one scale per output channel
    assert np.abs(q.dequantize() - w).max(1).max() < 0.6 * np.abs(w).max(1).max() / 127


def test_gptq_beats_round_to_nearest_on_correlated_inputs() -> None:
    rng = np.random.default_rng(2)
    mix = rng.standard_normal((96, 96))
    x = rng.standard_normal((512, 96)) @ mix  # correlated input channels, as activations are
    w = rng.standard_normal((64, 96)).astype(np.float32)
    h = x.T @ x
    rtn = graph_opt.quantize_int4(w, 32)
    gptq = graph_opt.quantize_int4(w, 32, hessian=h)
    out_err = {
        k: float(np.linalg.norm(x @ (q.dequantize() - w).T)) for k, q in (("rtn", rtn), ("gptq", gptq))
    }
    print(out_err)
    assert out_err["gptq"] < 0.8 * out_err["rtn"]


def test_policy_plan() -> None:
    names = [f"blk.{i}.attn_q_fused" for i in range(10)] + [f"blk.{i}.ffn_down.weight" for i in range(10)]
    names.append("token_embd.weight")
    sens = {i: float(i == 3) * 0.5 + float(i == 7) * 0.2 + 0.01 for i in range(10)}
    plan = graph_opt.plan_precision(names, QuantSpec("int4", sensitive_layers=0.2), sens)
    assert plan["token_embd.weight"] == "int8"  # the head
    assert {n for n, p in plan.items() if p == "int8" and n.startswith("blk.")} == {
        "blk.3.attn_q_fused",
        "blk.3.ffn_down.weight",
        "blk.7.attn_q_fused",
        "blk.7.ffn_down.weight",
    }
    budget = graph_opt.plan_precision(names, QuantSpec("int4", kl_budget=0.1), sens)
    assert sum(p == "int8" for p in budget.values()) == 2 * 2 + 1  # layers 3 and 7 bring the sum to 0.08
    assert set(graph_opt.plan_precision(names, QuantSpec("int8"), sens).values()) == {"int8"}
    assert set(graph_opt.plan_precision(names, QuantSpec("keep"), sens).values()) == {"keep"}


def test_quant_spec_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="--quant"):
        QuantSpec("int3")
    with pytest.raises(ValueError, match="group"):
        QuantSpec("int4", group=48)


# --- the passes on tiny models ---------------------------------------------------------------------------


def _calibration(proto: onnx.ModelProto, path: Path, steps: int = 3) -> list[dict[str, np.ndarray]]:
    return [token_feeds(proto, path, q=32, seed=s) for s in range(steps)]


@pytest.mark.parametrize("arch", ARCHS)
def test_quantize_pass(tmp_path: Path, arch: str) -> None:
    """INT8 per-channel and INT4 g32 (GPTQ, sensitivity-ranked INT8 layers) of F32 models, ORT lowering."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", SPECS[arch])
    cfg = tiny_config(path)
    proto = tiny_graph(path)
    evals = [
        token_feeds(proto, path, q=32, seed=s) for s in range(9, 17)
    ]  # 256 positions, none calibrated on
    want = np.concatenate([run_ort(proto, f)["logits"] for f in evals], axis=1)
    for spec, kl_max in ((QuantSpec("int8"), 0.005), (QuantSpec("int4"), 0.05)):
        model = to_ir(proto)
        report = QuantReport(spec)
        ctx = PassContext(
            "ort", {"quant": spec, "quant_report": report, "calibration": _calibration(proto, path)}
        )
        [rec] = run_passes(model, ["quantize"], ctx)
        assert rec.rewrites == 4 * cfg.n_layer + 1
        assert rec.weight_bytes_after < rec.weight_bytes_before * (0.4 if spec.mode == "int8" else 0.3)
        assert ops(model).get("MatMulNBits") == rec.rewrites
        got = np.concatenate([run_ort(model, f)["logits"] for f in evals], axis=1)
        kl, top1 = _kl_top1(want, got)
        print(f"{arch} {spec.mode}: KL {kl:.5f} top-1 {top1:.3f} {report.to_dict()['linears']}")
        assert kl < kl_max
        if spec.mode == "int4":
            assert report.method == "gptq" and len(report.sensitivity) == cfg.n_layer
            assert report.precision["token_embd.weight" if cfg.tied_embeddings else "output.weight"] == "int8"


@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_weights_land_on_fused_graphs(tmp_path: Path, arch: str) -> None:
    """Weights quantized on the whole unfused model and applied to the fused graph by name (what `edge
    convert` does) give the unfused graph's outputs. Regression: gemma3 puts an RMSNorm right after
    attn_output, and skip_rmsnorm took a min-offset linear's block-bias Add for a residual add, so the
    linear was found without its bias and the quantized weight (bias included) added it twice."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", replace(SPECS[arch], weight_type=T.Q4_1))
    cfg = tiny_config(path)
    proto = tiny_graph(path)
    feeds = feeds_for(proto, cfg)
    report = graph_opt.plan_quantization(to_ir(proto), QuantSpec("int8"))
    outs = []
    for fuse in (False, True):
        model = to_ir(proto)
        graph_opt.optimize(model, "ort", quant_report=report, fuse=fuse)
        outs.append(run_ort(model, feeds))
    scale = max(float(np.abs(v).max()) for v in outs[0].values())
    assert max_abs_diff(outs[0], outs[1]) < 1e-4 * scale


@pytest.mark.parametrize("arch", ARCHS)
def test_coreml_lowering_is_standard_onnx(tmp_path: Path, arch: str) -> None:
    """coreml: DequantizeLinear + MatMul for every quantized linear, no com.microsoft op, onnx.checker passes,
    and the same outputs as the MatMulNBits lowering of the same weights."""
    path = write_tiny_model(tmp_path / f"{arch}.gguf", replace(SPECS[arch], weight_type=T.Q4_0))
    cfg = tiny_config(path)
    proto = tiny_graph(path)
    feeds = feeds_for(proto, cfg)
    for spec in (QuantSpec("keep"), QuantSpec("int4", sensitive_layers=0)):
        ort_model, coreml = to_ir(proto), to_ir(proto)
        graph_opt.optimize(ort_model, "ort", quant=spec, fuse=False)
        graph_opt.optimize(coreml, "coreml", quant=spec)
        assert not [n for n in coreml.graph.all_nodes() if n.domain == "com.microsoft"]
        assert ops(coreml)["DequantizeLinear"] >= 4 * cfg.n_layer
        onnx.checker.check_model(to_proto(coreml), full_check=True)
        assert max_abs_diff(run_ort(ort_model, feeds), run_ort(coreml, feeds)) < 1e-4


def test_lower_sets_accuracy_levels(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "m.gguf", replace(SPECS["llama"], weight_type=T.Q4_0))
    model = to_ir(tiny_graph(path))
    graph_opt.optimize(model, "ort", accuracy_level=0, head_accuracy_level=4)
    levels = {lin.name: lin.accuracy_level for lin in graph_opt.linears_in(model)}
    assert levels.pop("output.weight") == 4 and set(levels.values()) == {0}
    assert isinstance(graph_opt.linears_in(model)[0].weight, BlockWeight)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q5_0, T.Q5_1])
def test_int8_nibbles_keeps_outputs_and_leaves_int8_activations_alone(tmp_path: Path, qtype: T) -> None:
    """8-bit linears with fp32 activations become two 4-bit MatMulNBits and an Add (ORT's fast 4-bit kernels,
    the same products); a level-4 head (int8 activations, ORT's fast 8-bit path) stays 8-bit; OpenVINO keeps
    its 8-bit weights."""
    path = write_tiny_model(tmp_path / "m.gguf", replace(SPECS["qwen2"], weight_type=qtype))
    cfg = tiny_config(path)
    proto = tiny_graph(path, BuildOptions(head_accuracy_level=4))
    feeds = feeds_for(proto, cfg)
    want = run_ort(proto, feeds)
    model = to_ir(proto)
    before = [(lin.weight.bits, lin.accuracy_level) for lin in graph_opt.linears_in(model)]
    assert before[-1] == (8, 4) and set(before[:-1]) == {(8, 0)}
    (rec,) = run_passes(model, ["int8_nibbles"], PassContext("ort"))
    assert rec.rewrites == len(before) - 1
    after = [(lin.form, lin.weight.bits, lin.accuracy_level) for lin in graph_opt.linears_in(model)]
    assert after == [("nibbles", 8, 0)] * (len(before) - 1) + [("nbits", 8, 4)]  # read back as one linear
    assert ops(model)["MatMulNBits"] == 2 * (len(before) - 1) + 1
    got = run_ort(model, feeds)
    scale = max(float(np.abs(v).max()) for v in want.values())
    assert max_abs_diff(want, got) < 1e-5 * scale
    ov = to_ir(proto)
    (skipped,) = run_passes(ov, ["int8_nibbles"], PassContext("openvino"))
    assert not skipped.applied and ops(ov) == ops(proto)


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_1])
def test_float_zero_points_fold_the_block_bias_for_openvino(tmp_path: Path, qtype: T) -> None:
    """Min-offset blocks (Q4_1, Q5_1 as 8-bit; Q4_K and edge's asymmetric INT4 / INT8 are the same form) lose their
    block-bias nodes on OpenVINO: one MatMulNBits each with float zero points, the same outputs on OpenVINO
    (fp32); ORT keeps the bias term (its float-zero-point kernels are slow or absent)."""
    path = write_tiny_model(tmp_path / "m.gguf", replace(SPECS["llama"], weight_type=qtype))
    cfg = tiny_config(path)
    proto = tiny_graph(path)
    feeds = feeds_for(proto, cfg)
    want = run_openvino(proto, feeds, tmp_path)
    model = to_ir(proto)
    with_bias = [
        lin
        for lin in graph_opt.linears_in(model)
        if isinstance(lin.weight, BlockWeight) and lin.weight.bias is not None
    ]
    assert with_bias and ops(model)["ReduceSum"] >= len(with_bias)
    (rec,) = run_passes(model, ["float_zero_points"], PassContext("openvino"))
    assert rec.rewrites == len(with_bias)
    assert ops(model).get("ReduceSum", 0) == 0 and ops(model)["MatMulNBits"] == len(
        graph_opt.linears_in(model)
    )
    got = run_openvino(model, feeds, tmp_path)
    scale = max(float(np.abs(v).max()) for v in want.values())
    assert max_abs_diff(want, got) < 1e-5 * scale
    (again,) = run_passes(model, ["float_zero_points"], PassContext("openvino"))
    assert again.rewrites == 0  # already folded
    ort_model = to_ir(proto)
    (skipped,) = run_passes(ort_model, ["float_zero_points"], PassContext("ort"))
    assert not skipped.applied and ops(ort_model) == ops(proto)


def test_nibbles_lowering_of_a_per_channel_int8_weight() -> None:
    """A per-channel INT8 weight (one block spanning a row of 96 inputs, not a power of two) lowers to
    nibbles through the same power-of-two blocks the 8-bit form uses, with the 8-bit form's outputs."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 96)).astype(np.float32)
    proto = linear_graph({"w": w}, rows=3)
    feeds = {"x": rng.standard_normal((3, 96)).astype(np.float32)}
    q = graph_opt.quantize_int8(w)
    assert q.block_size == 96 and q.k_blocks == 1
    outs = {}
    for form in ("nbits", "nibbles"):
        model = to_ir(proto)
        (lin,) = graph_opt.linears_in(model)
        graph_opt.emit_linear(model, lin, q, lowering=form, accuracy_level=0)
        bits = {n.attributes["bits"].value for n in model.graph if n.op_type == "MatMulNBits"}
        assert bits == ({8} if form == "nbits" else {4})
        outs[form] = run_ort(model, feeds)["y_w"]
    assert np.abs(outs["nibbles"] - outs["nbits"]).max() < 1e-5 * np.abs(outs["nbits"]).max()
    assert np.abs(outs["nbits"] - feeds["x"] @ q.dequantize().T).max() < 1e-4


@pytest.mark.parametrize("arch", ["llama", "phi3"])  # Q, K, V fused by the builder; phi3's own attn_qkv
def test_fine_qkv_blocks_at_fast(tmp_path: Path, arch: str) -> None:
    """ORT at precision fast: the 4-bit Q/K/V projections (int8 activations) run in 16-element blocks, the
    same weights exactly, every other linear as it was; and the logits are closer to the exact graph's than
    the fast graph's without the pass (x rounded to int8 per 16 inputs instead of 32)."""
    path = write_tiny_model(tmp_path / "m.gguf", replace(SPECS[arch], weight_type=T.Q4_1))
    proto = tiny_graph(path)
    evals = [token_feeds(proto, path, q=32, seed=s) for s in range(4)]
    exact = to_ir(proto)
    graph_opt.optimize(exact, "ort", precision="exact")
    want = np.concatenate([run_ort(exact, f)["logits"] for f in evals], axis=1)
    fast_passes = graph_opt.pipeline("ort", precision="fast")
    assert "fine_qkv_blocks" in fast_passes and "fine_qkv_blocks" in graph_opt.pipeline(
        "openvino", precision="fast"
    )
    assert "fine_qkv_blocks" not in graph_opt.pipeline("ort") + graph_opt.pipeline("openvino")
    graphs: dict[str, list] = {}
    kl: dict[str, float] = {}
    bias_terms: dict[str, dict] = {}
    for name, passes in (
        ("fine", fast_passes),
        ("plain", [p for p in fast_passes if p != "fine_qkv_blocks"]),
    ):
        model = to_ir(proto)
        run_passes(model, passes, PassContext("ort", {"accuracy_level": 4}))
        got = np.concatenate([run_ort(model, f)["logits"] for f in evals], axis=1)
        graphs[name], (kl[name], _) = graph_opt.linears_in(model), _kl_top1(want, got)
        bias_terms[name] = {v.name: v.shape for v in model.graph.initializers.values() if "bias_t" in v.name}
    fine, plain = graphs["fine"], graphs["plain"]
    split = [a.name for a in fine if a.weight.block_size == 16]
    assert split and all(re.search(r"\.attn_(q|qkv)(\.weight|_fused)$", n) for n in split)
    for a, b in zip(fine, plain, strict=True):
        assert a.name == b.name and a.accuracy_level == b.accuracy_level == 4
        assert a.weight.block_size == (16 if a.name in split else b.weight.block_size)
        np.testing.assert_array_equal(a.weight.dequantize(), b.weight.dequantize())
    assert bias_terms["fine"] == bias_terms["plain"]  # the bias term stays at the file's blocks (Q4_1: 32)
    print(f"{arch}: KL to exact, fast {kl['plain']:.2e}, fast with 16-blocks Q/K/V {kl['fine']:.2e}")
    assert kl["fine"] < kl["plain"]
