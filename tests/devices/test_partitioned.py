"""PartitionedDecoder on smollm2-135m (slow: the real model): partitions on two backends, static shapes, each
fusion exact, and the quantization quality bounds of issue 5."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from edge.devices.partitioned import PartitionedDecoder, PartitionedOptions, open_artifact_decoder
from edge.graph_opt import QuantSpec
from edge.models.artifact import open_artifact
from edge.models.convert import ConvertOptions, convert
from edge.models.resolve import resolve_model
from edge.models.tokenizer import load_tokenizer

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("edge_cache")]

PROMPT = "<|im_start|>user\nWrite one sentence about the sea.<|im_end|>\n<|im_start|>assistant\n"
N_GEN = 24


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def ov_artifact(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Standard-op graphs (the openvino target) that both backends run, split at layer 15."""
    out = tmp_path_factory.mktemp("art") / "smollm2-ov"
    opts = ConvertOptions(target="openvino", ranges="0-14,15-29", precision="exact")
    convert(smollm2, out, opts, source_name="smollm2-135m")
    return out


def _prompt_ids(art: Path) -> list[int]:
    return load_tokenizer(open_artifact(art).metadata.metadata).encode(PROMPT, parse_special=True)


def greedy(decoder: PartitionedDecoder, ids: Sequence[int], n: int = N_GEN) -> list[int]:
    logits = decoder.forward(ids, last_only=True)
    out = []
    for _ in range(n):
        tok = int(np.argmax(logits[-1]))
        out.append(tok)
        logits = decoder.forward([tok], last_only=True)
    return out


def test_two_backends_give_the_same_greedy_output(ov_artifact: Path) -> None:
    """Layers 0-14 on OpenVINO and 15-29 on ONNX Runtime: the greedy output of either backend alone."""
    ids = _prompt_ids(ov_artifact)
    opts = PartitionedOptions(capacity=256, threads=2)
    runs = {}
    for name, where in (
        ("ort", "ort"),
        ("openvino", "openvino"),
        ("openvino+ort", [("openvino", "cpu"), ("ort", "cpu")]),
    ):
        dec = open_artifact_decoder(ov_artifact, where, options=opts)
        assert [p.backend for p in dec.partitions] == (
            [where] * 2 if isinstance(where, str) else ["openvino", "ort"]
        )
        runs[name] = greedy(dec, ids)
        dec.close()
    print(runs)
    assert runs["openvino+ort"] == runs["ort"] == runs["openvino"]


def test_static_shapes_compile_fully_static_and_match_dynamic(
    smollm2: Path, ov_artifact: Path, tmp_path: Path
) -> None:
    out = tmp_path / "static"
    convert(
        smollm2,
        out,
        ConvertOptions(target="openvino", static=True, prefill_chunk=32, capacity=256),
        source_name="smollm2-135m",
    )
    dec = open_artifact_decoder(out, "openvino", options=PartitionedOptions(threads=2))
    assert dec.static and dec.cache.keys[0].shape[1] == 256
    for runner in dec._parts[0].runners.values():
        assert all(inp.get_partial_shape().is_static for inp in runner.compiled.inputs)  # type: ignore[attr-defined]
    ids = _prompt_ids(ov_artifact)
    static_tokens = greedy(dec, ids)
    dynamic = open_artifact_decoder(
        ov_artifact, "openvino", options=PartitionedOptions(capacity=256, threads=2)
    )
    assert static_tokens == greedy(dynamic, ids)


def test_each_fusion_is_exact_on_smollm2(smollm2: Path) -> None:
    """Every fusion pass, cumulatively, on the real model: fewer nodes, and outputs equal to fp32 resolution.
    NOTE: smollm2's residual stream reaches ~2.5e4, where one fp32 ulp is 2e-3, so any reordering of its
    additions moves the logits (|max| ~29) by ~1e-3: ONNX Runtime's own fusions of the unfused graph do
    (ORT_ENABLE_ALL vs ORT_DISABLE_ALL: 1.7e-3). An absolute 1e-4 is below that resolution; the bound here is
    relative: max |diff| / max |value| < 5e-4 per output (measured <= 1.6e-4), both graphs as ORT runs them."""
    import onnxruntime as ort

    from edge import graph_opt
    from edge.models.arch import ArchConfig
    from edge.models.gguf_file import open_gguf
    from edge.models.transformer import build_decoder
    from tests.graph_opt.graphs import feeds_for, to_ir, to_proto

    g = open_gguf(smollm2)
    proto = build_decoder(g)
    cfg = ArchConfig.from_gguf(g.metadata, set(g.tensors))
    feeds = feeds_for(proto, cfg, q=4, past=40)

    def run(model: object) -> dict[str, np.ndarray]:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 2
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
        names = [o.name for o in sess.get_outputs()]
        return dict(zip(names, sess.run(names, feeds), strict=True))

    want = run(proto)
    for target, passes in (
        ("ort", ["rmsnorm", "skip_rmsnorm", "rotary", "attention"]),
        ("openvino", ["rmsnorm", "attention"]),
    ):
        model = to_ir(proto)
        graph_opt.run_passes(model, ["fold"])
        for name in passes:
            [rec] = graph_opt.run_passes(model, [name], graph_opt.PassContext(target))
            got = run(to_proto(model))
            rel = max(float(np.abs(got[k] - want[k]).max() / np.abs(want[k]).max()) for k in want)
            print(f"{target} {rec.line()}  max relative diff {rel:.1e}")
            assert rec.nodes_after < rec.nodes_before and rel < 5e-4
            assert np.array_equal(got["logits"].argmax(-1), want["logits"].argmax(-1))


def test_quantization_quality_against_the_unquantized_graph(smollm2: Path, tmp_path: Path) -> None:
    """Issue 5 on re-quantized smollm2: INT8 per-channel KL <= 0.005; INT4 g32 asym, with the sensitivity
    policy given a 0.04 nats budget, KL <= 0.05 and top-1 >= 95%. Teacher-forced over 256 tokens of the eval
    text, exact activations (accuracy level 0) on both sides.
    NOTE: the source's Q4_1 blocks are 4-bit g32 scale + min blocks, the format INT4 asym writes: the fit
    finds each block's grid again, so INT4 costs next to nothing here (the head, at INT8 per channel, most of
    it). What INT4 costs on float weights is measured in tests/graph_opt/test_quant_quality.py."""
    from edge.evaluate import EvalConfig, evaluate

    keep = tmp_path / "keep"
    convert(smollm2, keep, ConvertOptions(accuracy_level=0), source_name="smollm2-135m")
    for name, spec, kl_max, top1_min in (
        ("int8", QuantSpec("int8"), 0.005, None),  # the issue bounds INT8 by KL alone
        ("int4", QuantSpec("int4", kl_budget=0.04), 0.05, 0.95),
    ):
        out = tmp_path / name
        res = convert(smollm2, out, ConvertOptions(quant=spec, accuracy_level=0), source_name="smollm2-135m")
        m = evaluate(str(out), EvalConfig(reference=str(keep), tokens=256, threads=2)).metrics
        print(f"smollm2 {name}: KL {m.kl_mean:.4f} top-1 {m.top1_agree:.3f} {res.quant.to_dict()['linears']}")
        assert m.kl_mean <= kl_max
        if top1_min is not None:
            assert m.top1_agree >= top1_min
