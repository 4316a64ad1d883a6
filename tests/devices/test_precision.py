"""`--precision fast|exact`: fast puts the own graphs on the runtimes' int8 paths, exact keeps fp32 math; fast
stays no further from the exact graph than llama.cpp is (the fidelity guard, on a real model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def test_fast_openvino_has_no_float_zero_points_and_quantizes_activations(tiny: Path) -> None:
    """Float zero points take OpenVINO's CPU plugin off its dynamic quantization: fast keeps the mins as a
    separate term (integer codes only); exact folds them (fewer nodes) and turns dynamic quantization off."""
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


def _eval(*args: str, tokens: int = 128, model: str = "smollm2-135m") -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "edge.cli",
        "eval",
        model,
        "--tokens",
        str(tokens),
        "--test-chunk",
        "1",
    ]
    proc = subprocess.run([*cmd, *args, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "kv"), [("ort", "auto"), ("openvino", "auto"), ("ort", "f16")], ids=str)
def test_fast_stays_about_as_close_to_the_exact_graph_as_llamacpp(backend: str, kv: str) -> None:
    """The fidelity guard of the precision policy on smollm2 (Q4_1 body, Q8_0 head), decode path.

    Measured (benchmarks/fast_graphs.py, 512 tokens): fast KL 0.0035 (ORT) / 0.0033 (OpenVINO) vs llama.cpp's
    0.0030 here, 1.1x further; on gemma3-270m and both Qwen models fast is 2-20x closer than llama.cpp. The
    bound is that measurement with a margin: the policy's "no further" is not met on this model yet. With the
    ring in f16 (`--kv-dtype f16`, issue #32) the same bound holds (benchmarks/results/kv-f16-2026-12-05.md:
    ORT's rows after a 512-token prompt KL 0.00294 against f32's 0.00251 and llama.cpp's 0.00289). This test's
    own schedule on the Zen 5 EPYC (2026-12-05): KL 0.00285 / 0.00239 / 0.00301 (ORT, OpenVINO, ORT f16) against
    llama.cpp's 0.00303, top-1 0.949 / 0.957 / 0.949 against 0.951."""
    ref = ("--reference", backend, "--reference-precision", "exact")
    # NOTE: 512 tokens, as the measurement: at 128, top-1 moves in steps of 0.8% and two flips at near-ties (the
    # f16 ring's: 122 of 128 against f32's 124) cross the 3-point margin; at 512 the three agree within 1%
    fast = _eval("--backend", backend, "--precision", "fast", "--kv-dtype", kv, *ref, tokens=512)
    llama = _eval("--backend", "llamacpp", *ref, tokens=512)
    print(f"{backend}: fast KL {fast['kl_mean']:.5f} top-1 {fast['top1_agree']:.3f}; ", end="")
    print(f"llama.cpp KL {llama['kl_mean']:.5f} top-1 {llama['top1_agree']:.3f}")
    assert 0 < fast["kl_mean"] <= 1.3 * llama["kl_mean"]
    assert fast["top1_agree"] >= llama["top1_agree"] - 0.03


@pytest.mark.slow
def test_kquant_kernels_stay_as_close_to_the_exact_graph_as_llamacpp() -> None:
    """The same guard where edge's K-quant kernels run: qwen2.5-coder-0.5b's Q4_K/Q6_K linears (its ffn_down;
    the rest of its rows are not 256-multiples) round activations to int8 per 256 as llama.cpp does.
    Measured on the 1.5b, every linear on the kernels (512 tokens, reference ORT exact, Xeon 2026-12-07): KL
    0.01357 against llama.cpp's 0.01355, top-1 0.955 against 0.971."""
    ref = ("--reference", "ort", "--reference-precision", "exact")
    fast = _eval("--backend", "ort", "--precision", "fast", *ref, tokens=256, model="qwen2.5-coder-0.5b")
    llama = _eval("--backend", "llamacpp", *ref, tokens=256, model="qwen2.5-coder-0.5b")
    print(f"kquant: fast KL {fast['kl_mean']:.5f} top-1 {fast['top1_agree']:.3f}; ", end="")
    print(f"llama.cpp KL {llama['kl_mean']:.5f} top-1 {llama['top1_agree']:.3f}")
    assert 0 < fast["kl_mean"] <= 1.3 * llama["kl_mean"]
    assert fast["top1_agree"] >= llama["top1_agree"] - 0.03


def _has_bf16() -> bool:
    """What the bf16 half's runner checks (devices/runners.py): OpenVINO's CPU lists a bf16 path."""
    return "BF16" in [str(c) for c in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "plan",
    ["prefill=openvino:cpu:bf16,decode=ort:cpu", "prefill=openvino:cpu:fast,decode=ort:cpu"],
    ids=["bf16+ort", "fast+ort"],
)
def test_the_phase_split_stays_about_as_close_to_the_exact_graph_as_llamacpp(plan: str) -> None:
    """The same guard for a phase split (issue #32), as generation runs it: a 128-token prompt on the prefill
    half, then 128 one-token steps on the decode half over the prompt's K/V; llama.cpp on the same schedule
    (its batched prompt path, then its decode path). Both parts are held: the prompt's rows and the rows after.

    Measured on smollm2 (1024 tokens, a 512-token prompt; benchmarks/results/phase-split-fidelity-2026-12-05.md):
    bf16 prompt rows KL 0.0010 against llama.cpp's 0.0032, rows after 0.0025 against 0.0029. Top-1 on the
    prompt's rows is lower than llama.cpp's (95.1% against 97.1%; ORT fast alone 95.1% too) at a third of its
    KL: every flip, of every engine, is where the exact graph's top two are within 0.19 logit of each other,
    and this flat model has 40% of its rows within 0.5, so those counts move by a few rows a run; hence the
    prompt's wider top-1 margin."""
    if "bf16" in plan and not _has_bf16():
        pytest.skip(
            "this CPU has no bf16 path (OpenVINO's CPU capabilities lack BF16): the bf16 half cannot run"
        )
    sched = ("--test-prompt", "128", "--reference", "ort", "--reference-precision", "exact")
    split = _eval("--plan", plan, *sched, tokens=256)
    llama = _eval("--backend", "llamacpp", *sched, tokens=256)
    for part in ("prompt", "after"):
        s, ll = split[part], llama[part]
        print(f"{plan} {part}: KL {s['kl_mean']:.5f} top-1 {s['top1_agree']:.3f}; ", end="")
        print(f"llama.cpp KL {ll['kl_mean']:.5f} top-1 {ll['top1_agree']:.3f}")
        assert s["tokens"] == ll["tokens"] == 128
        assert 0 < s["kl_mean"] <= 1.3 * ll["kl_mean"], part
        assert s["top1_agree"] >= ll["top1_agree"] - (0.06 if part == "prompt" else 0.03), part


@pytest.mark.parametrize("precision", ["fast", "exact"])
def test_run_reports_the_precision_it_ran(tiny: Path, precision: str) -> None:
    cmd = [sys.executable, "-m", "edge.cli", "run", str(tiny), "hello", "--raw", "--backend", "ort"]
    cmd += ["--precision", precision, "--max-tokens", "2", "--temperature", "0", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["backend"] == "ort" and out["precision"] == precision
