"""`--precision fast|exact`: fast puts the own graphs on the runtimes' int8 paths, exact keeps fp32 math; fast
stays no further from the exact graph than llama.cpp is (the fidelity guard, on a real model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import onnx
import openvino as ov
import pytest

from edge.devices.base import Decoder
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.registry import DecoderOptions, open_decoder
from edge.models.gguf_file import open_gguf
from tests.tiny_models import TinySpec, write_tiny_model

ROOT = Path(__file__).resolve().parents[2]
Q = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, edge_cache: Path) -> Path:
    # Q4_1: a min-offset format (integer codes + per-block mins, as Q4_K and Q5_K), the case float zero
    # points used to take
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "q4_1.gguf", TinySpec(weight_type=Q.Q4_1))


def _decoder(path: Path, backend: str, precision: str) -> GraphDecoder:
    opts = GraphOptions(backend=backend, threads=1, capacity=64, precision=precision)
    return GraphDecoder(open_gguf(path), opts)


def _graph(dec: GraphDecoder) -> onnx.ModelProto:
    return onnx.load(str(dec.graph_path), load_external_data=False)


def _linears(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type == "MatMulNBits"]


def _level(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "accuracy_level"), 0)


def test_fast_ort_graph_runs_every_linear_with_int8_activations(tiny: Path) -> None:
    fast, exact = _decoder(tiny, "ort", "fast"), _decoder(tiny, "ort", "exact")
    try:
        assert {_level(n) for n in _linears(_graph(fast))} == {4}
        assert {_level(n) for n in _linears(_graph(exact))} == {0}
    finally:
        fast.close()
        exact.close()


def test_fast_openvino_keeps_integer_zero_points_and_quantizes_activations(tiny: Path) -> None:
    """Float zero points take OpenVINO's CPU plugin off its dynamic quantization: fast keeps the mins as a
    separate term; exact folds them (fewer nodes) and turns dynamic quantization off."""
    fast, exact = _decoder(tiny, "openvino", "fast"), _decoder(tiny, "openvino", "exact")
    try:

        def float_zps(model: onnx.ModelProto) -> int:
            types = {i.name: i.data_type for i in model.graph.initializer}
            return sum(
                1
                for n in _linears(model)
                if len(n.input) > 3 and types.get(n.input[3]) == onnx.TensorProto.FLOAT
            )

        assert float_zps(_graph(fast)) == 0
        assert float_zps(_graph(exact)) == len(_linears(_graph(exact))) > 0
        for dec, group in ((fast, 32), (exact, 0)):
            compiled = dec.runner.compiled  # type: ignore[attr-defined]
            assert int(compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")) == group
            assert compiled.get_property("INFERENCE_PRECISION_HINT") == ov.Type.f32
    finally:
        fast.close()
        exact.close()


def _kl(ref: np.ndarray, test: np.ndarray) -> float:
    def logp(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64) - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    lp, lq = logp(ref), logp(test)
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def _feed(dec: Decoder, ids: list[int]) -> np.ndarray:
    """Logits of a prefill, a 4-token forward and single-token decode steps (every path generation takes)."""
    try:
        out = [dec.forward(ids[:16]), dec.forward(ids[16:20]), *[dec.forward([t]) for t in ids[20:]]]
    finally:
        dec.close()
    return np.concatenate(out)


@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_fast_is_about_as_far_from_exact_as_llamacpp(tiny: Path, backend: str) -> None:
    """The precision policy on a tiny Q4_1 model: fast moves the logits (int8 activations ran) by about as
    much as llama.cpp's own int8 dot products do (measured: 8.6e-5 vs 7.3e-5 nats)."""
    ids = np.random.default_rng(0).integers(0, 320, 28).tolist()
    exact = _feed(_decoder(tiny, backend, "exact"), ids)
    fast = _feed(_decoder(tiny, backend, "fast"), ids)
    llama = _feed(open_decoder("llamacpp", tiny, "cpu", DecoderOptions(n_ctx=64, n_threads=1)), ids)
    kl_fast, kl_llama = _kl(exact, fast), _kl(exact, llama)
    assert 0 < kl_fast <= 1.5 * kl_llama, (kl_fast, kl_llama)


def test_precision_is_checked() -> None:
    with pytest.raises(ValueError, match="fast or exact"):
        DecoderOptions(precision="fp16")


def _eval(*args: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "edge.cli", "eval", "smollm2-135m", "--tokens", "128", "--test-chunk", "1"]
    proc = subprocess.run([*cmd, *args, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_fast_is_no_further_from_the_exact_graph_than_llamacpp(backend: str) -> None:
    """The fidelity guard of the precision policy, on the decode path (one token per forward)."""
    ref = ("--reference", backend, "--reference-precision", "exact")
    fast = _eval("--backend", backend, "--precision", "fast", *ref)
    llama = _eval("--backend", "llamacpp", *ref)
    print(f"{backend}: fast KL {fast['kl_mean']:.5f} top-1 {fast['top1_agree']:.3f}; ", end="")
    print(f"llama.cpp KL {llama['kl_mean']:.5f} top-1 {llama['top1_agree']:.3f}")
    assert 0 < fast["kl_mean"] <= llama["kl_mean"]


def test_centred_codes_hold_the_same_weights(tiny: Path) -> None:
    """graph_opt.center_codes (fast): codes shifted to the default zero point, the shift in the block bias."""
    import onnx_ir as ir

    from edge.graph_opt import find_linears

    def weights(precision: str) -> dict[str, object]:
        dec = _decoder(tiny, "ort", precision)
        try:
            model = ir.serde.deserialize_model(onnx.load(str(dec.graph_path)))
        finally:
            dec.close()
        return {lin.name: lin.weight for lin in find_linears(model)}

    fast, exact = weights("fast"), weights("exact")
    assert fast.keys() == exact.keys() and fast
    for name, w in fast.items():
        e = exact[name]
        assert w.zero_points is None and e.zero_points is not None, name  # type: ignore[attr-defined]
        mid = 1 << (w.bits - 1)  # type: ignore[attr-defined]
        assert abs(int(w.codes.min()) + int(w.codes.max()) + 1 - 2 * mid) <= 1, name  # type: ignore[attr-defined]
        np.testing.assert_allclose(w.dequantize(), e.dequantize(), rtol=1e-6, atol=1e-6)  # type: ignore[attr-defined]
