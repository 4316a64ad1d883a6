"""`edge convert` artifacts on tiny models: the files and manifest, byte-identical output for identical inputs,
the PartitionedDecoder over them equal to the GraphDecoder on the GGUF (one backend, two backends, static
shapes), the CLI (`convert --explain`, `run DIR`, `eval DIR`), and INT4 g32 of an F32 tiny model within the
issue's quality bounds (mean KL <= 0.05, top-1 >= 95% vs the unquantized graph, on text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.partitioned import PartitionedOptions, open_artifact_decoder
from edge.errors import EdgeError
from edge.graph_opt import QuantSpec
from edge.models.artifact import is_artifact, open_artifact
from edge.models.convert import ConvertOptions, convert
from edge.models.gguf_file import open_gguf
from tests.graph_opt.graphs import ARCHS, tiny_gguf
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    for arch in ARCHS:
        tiny_gguf(root, arch)
    return root


def _ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 320, n).tolist()


def _run(decoder: object, ids: list[int]) -> np.ndarray:
    """A chunked prefill, single-token decode steps, a rollback and a re-decode: every path of a step."""
    f = decoder.forward  # type: ignore[attr-defined]
    out = [f(ids[:20]), f(ids[20:21]), f(ids[21:22]), f(ids[22:25])]
    decoder.rollback(2)  # type: ignore[attr-defined]
    out.append(f(ids[23:25]))
    return np.concatenate(out)


def test_artifact_files_and_manifest(models: Path, tmp_path: Path) -> None:
    src = models / "llama.gguf"
    out = tmp_path / "art"
    result = convert(src, out, ConvertOptions(target="ort", partitions=2))
    assert is_artifact(out)
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "embed.npy",
        "manifest.json",
        "metadata.gguf",
        "part0.dynamic.onnx",
        "part0.weights",
        "part1.dynamic.onnx",
        "part1.weights",
    ]
    m = json.loads((out / "manifest.json").read_text())
    assert m == result.manifest
    assert m["source"]["file"] == "llama.gguf" and len(m["source"]["sha256"]) == 64
    assert m["target"] == "ort" and m["arch"]["arch"] == "llama" and m["quant"]["mode"] == "keep"
    assert [p["name"] for p in m["passes"]][:5] == ["fold", "rmsnorm", "skip_rmsnorm", "rotary", "attention"]
    assert [(p["first_layer"], p["last_layer"], p["head"]) for p in m["partitions"]] == [
        (0, 1, False),
        (1, 2, True),
    ]
    assert m["shapes"] == {"static": False, "prefill_chunk": None, "capacity": None}
    art = open_artifact(out)
    assert art.config.n_layer == 2 and art.source_path() == src
    rows = art.embedder()([5, 7])
    assert rows.shape == (1, 2, 64) and rows.dtype == np.float32
    for part in m["partitions"]:  # the weights live in the shared external file, not in the graph
        graph = onnx.load(str(out / part["graphs"]["dynamic"]), load_external_data=False)
        assert all(
            t.data_location == onnx.TensorProto.EXTERNAL
            for t in graph.graph.initializer
            if t.name.endswith(".w_t")
        )


def test_identical_inputs_give_identical_artifacts(models: Path, tmp_path: Path) -> None:
    src = models / "qwen2.gguf"
    opts = ConvertOptions(
        target="openvino", quant=QuantSpec("int4"), partitions=2, static=True, capacity=32, prefill_chunk=8
    )
    a, b = tmp_path / "a", tmp_path / "b"
    convert(src, a, opts)
    convert(src, b, opts)
    files = sorted(p.name for p in a.iterdir())
    assert files == sorted(p.name for p in b.iterdir())
    for name in files:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("arch", ARCHS)
def test_partitioned_decoder_equals_graph_decoder(models: Path, tmp_path: Path, arch: str) -> None:
    """One ORT partition, two partitions on OpenVINO then ORT, and a static OpenVINO artifact: the logits of
    GraphDecoder on the GGUF (fp32, 1e-4)."""
    src = models / f"{arch}.gguf"
    ids = _ids(25)
    ref = GraphDecoder(open_gguf(src), GraphOptions(capacity=48, prefill_chunk=16))
    want = _run(ref, ids)
    cases = [
        (ConvertOptions(target="ort", accuracy_level=0), "ort"),
        (ConvertOptions(target="openvino", partitions=2), [("openvino", "cpu"), ("ort", "cpu")]),
        (ConvertOptions(target="openvino", static=True, prefill_chunk=8, capacity=48), "openvino"),
    ]
    for i, (opts, where) in enumerate(cases):
        out = tmp_path / f"art{i}"
        convert(src, out, opts)
        # twice: the second load comes from the backends' compile caches (OpenVINO once got those wrong)
        for load in ("compiled", "cached"):
            dec = open_artifact_decoder(out, where, options=PartitionedOptions(capacity=48, prefill_chunk=16))
            got = _run(dec, ids)
            dec.close()
            err = np.abs(got - want).max()
            n_parts = len(open_artifact(out).partitions)
            print(f"{arch} {opts.target} partitions={n_parts} static={opts.static} {load}: {err:.2e}")
            assert got.shape == want.shape
            assert err < 1e-4


def test_coreml_artifact_is_standard_onnx(models: Path, tmp_path: Path) -> None:
    out = tmp_path / "cm"
    convert(
        models / "gemma3.gguf", out, ConvertOptions(target="coreml", quant=QuantSpec("int4", symmetric=True))
    )
    m = json.loads((out / "manifest.json").read_text())
    assert m["quant"]["symmetric"] is True
    graph = onnx.load(str(out / "part0.dynamic.onnx"), load_external_data=False)
    assert not [n for n in graph.graph.node if n.domain == "com.microsoft"]
    assert "DequantizeLinear" in {n.op_type for n in graph.graph.node}
    onnx.checker.check_model(str(out / "part0.dynamic.onnx"), full_check=True)


def test_refuses_to_overwrite_other_directories(models: Path, tmp_path: Path) -> None:
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    with pytest.raises(EdgeError, match="not an edge artifact"):
        convert(models / "llama.gguf", tmp_path / "x")


def test_refuses_longrope_tables_it_would_have_to_fix(tmp_path: Path) -> None:
    """Phi-3 128k's long/short RoPE table depends on the context it runs with, which an artifact does not
    record: refused rather than fixed silently (the GGUF runs on the own graphs directly)."""
    src = write_tiny_model(tmp_path / "phi3.gguf", TinySpec(arch="phi3", long_rope=True))
    with pytest.raises(EdgeError, match="LongRoPE") as exc:
        convert(src, tmp_path / "out")
    assert "--backend" in (exc.value.hint or "")
    assert not (tmp_path / "out").exists()


def test_int4_of_an_f32_tiny_model_meets_the_quality_bounds(models: Path, tmp_path: Path) -> None:
    """Issue 5 'done when': INT4 g32 asym of an F32 tiny model, mean KL <= 0.05 and top-1 >= 95% against the
    unquantized graph, teacher-forced on text (edge eval DIR --reference DIR_KEEP); INT8 per-channel KL <= 0.005.
    NOTE: qwen2; the tiny llama's next-token distribution is nearly flat (perplexity above its vocab size), so
    its top-1 flips on any change (INT8 included)."""
    from edge.evaluate import EvalConfig, evaluate

    src = models / "qwen2.gguf"
    keep = tmp_path / "keep"
    convert(src, keep, ConvertOptions(accuracy_level=0))
    for mode, kl_max, top1_min in (("int4", 0.05, 0.95), ("int8", 0.005, 0.95)):
        out = tmp_path / mode
        convert(src, out, ConvertOptions(quant=QuantSpec(mode, group=32), accuracy_level=0))
        m = evaluate(str(out), EvalConfig(reference=str(keep), tokens=400)).metrics
        print(f"qwen2 {mode}: KL {m.kl_mean:.5f} top-1 {m.top1_agree:.3f}")
        assert m.kl_mean <= kl_max and m.top1_agree >= top1_min


def test_eval_refuses_a_reference_with_another_tokenizer(models: Path, tmp_path: Path) -> None:
    """--reference DIR takes any artifact of the same model (any quantization, converted from any file of it);
    one with another vocabulary is refused before anything runs."""
    from dataclasses import replace

    from edge.evaluate import EvalConfig, evaluate
    from tests.graph_opt.graphs import SPECS
    from tests.tiny_models import write_tiny_model

    other = write_tiny_model(tmp_path / "other.gguf", replace(SPECS["llama"], n_vocab=300))
    ref = convert(other, tmp_path / "other", ConvertOptions(accuracy_level=0)).path
    with pytest.raises(EdgeError, match="another tokenizer") as err:
        evaluate(str(models / "llama.gguf"), EvalConfig(backend="ort", reference=str(ref), tokens=16))
    assert err.value.hint and "same model" in err.value.hint


def _edge(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True, env=env, timeout=600
    )


def test_cli_convert_run_eval(models: Path, tmp_path: Path, edge_cache: Path) -> None:
    env = {**os.environ, "EDGE_CACHE_DIR": str(edge_cache)}
    env.pop("EDGE_DEBUG", None)
    out = tmp_path / "cli"
    proc = _edge(
        "convert", str(models / "llama.gguf"), "--target", "ort", "-o", str(out), "--explain", env=env
    )
    assert proc.returncode == 0, proc.stderr
    for name in ("rmsnorm", "skip_rmsnorm", "rotary", "attention", "quantize", "lower"):
        assert f"\n{name} " in proc.stdout
    assert "SimplifiedLayerNormalization" in proc.stdout and "nodes" in proc.stdout
    proc = _edge("run", str(out), "hello", "--max-tokens", "5", "--temperature", "0", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert res["backend"] == "ort" and res["n_tokens"] == 5
    gguf_run = _edge("run", str(models / "llama.gguf"), "hello", "--max-tokens", "5", "--temperature", "0",
                     "--json", "--backend", "ort", env=env)  # fmt: skip
    assert json.loads(gguf_run.stdout)["token_ids"] == res["token_ids"]
    proc = _edge("eval", str(out), "--reference", "llamacpp", "--tokens", "64", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    ev = json.loads(proc.stdout)
    assert ev["backend"] == "ort" and ev["reference"] == "llamacpp" and ev["kl_mean"] < 1e-3
