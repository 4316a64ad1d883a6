"""Device plans end to end on real models (slow): a 2-backend hetero plan gives the greedy tokens of a single
backend, the NPU-shaped (static) graph compiles fully static and matches the dynamic graph, and `edge bench
--plan` reports each partition's time."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge.api import load
from edge.generate import GenerationConfig
from edge.models.resolve import resolve_model
from edge.sampling import SamplingConfig
from tests.shared_cache import private_cache

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "Write a haiku about the sea."
GREEDY = GenerationConfig(max_tokens=24, sampling=SamplingConfig(temperature=0.0))


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return {name: resolve_model(name) for name in ("smollm2-135m", "qwen2.5-coder-0.5b")}


@pytest.fixture(scope="module", autouse=True)
def plan_cache(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Converted partitions and graphs go to a private cache; the model files stay in the shared one."""
    with private_cache(tmp_path_factory) as path, pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE_CACHE_DIR", str(path))
        yield path


def greedy(path: Path, **opts: object) -> tuple[list[int], object]:
    """Greedy tokens, and what ran them: placement, plan, and the decoder's per-partition facts (read before
    the model closes). Exact precision: the same greedy tokens on every backend and plan is its promise (fast
    lets each runtime round its int8 activations its own way)."""
    with load(str(path), n_ctx=512, precision="exact", **opts) as m:  # type: ignore[arg-type]
        result = m.generate(PROMPT, GREEDY, reuse=False)
        dec = m.decoder
        parts = dec.capabilities().partitions
        facts = {
            "partition_seconds": [] if parts is None else list(parts.partition_times()),
            "static": getattr(dec, "static", None),
            # every input and output shape of every compiled OpenVINO graph (prefill and decode variants)
            "shapes_static": [
                all(x.get_partial_shape().is_static for x in (*r.compiled.inputs, *r.compiled.outputs))
                for part in getattr(dec, "_parts", [])
                for r in part.runners.values()
                if r.backend == "openvino"
            ],
        }
        return result.token_ids, (m.placement, m.device_plan, facts)


@pytest.mark.parametrize("name", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_two_backend_plan_gives_the_greedy_tokens_of_one_backend(name: str, models: dict[str, Path]) -> None:
    hetero, (placement, plan, facts) = greedy(models[name], device="hetero:openvino:cpu,ort:cpu")
    assert placement.backend == "openvino+ort" and plan is not None  # type: ignore[attr-defined]
    parts = plan.partitions  # type: ignore[attr-defined]
    assert [(p.device.backend, p.device.kind) for p in parts] == [("openvino", "cpu"), ("ort", "cpu")]
    assert parts[0].layers.start == 0 and parts[0].layers.stop == parts[1].layers.start and parts[1].head
    assert len(facts["partition_seconds"]) == 2 and all(t > 0 for t in facts["partition_seconds"])  # type: ignore[index]
    for backend in ("openvino", "ort"):
        single, _ = greedy(models[name], backend=backend)
        assert hetero == single, (backend, hetero, single)


def test_npu_shaped_graph_compiles_static_and_matches_dynamic(models: dict[str, Path]) -> None:
    path = models["smollm2-135m"]
    emulated, (placement, plan, facts) = greedy(path, device="npu", emulate=True)
    assert placement.device == "npu (emulated on cpu)" and plan.static  # type: ignore[attr-defined]
    assert facts["static"] is True  # type: ignore[index]
    assert facts["shapes_static"] == [True, True]  # type: ignore[index]  # prefill and decode graphs
    dynamic, _ = greedy(path, backend="openvino")
    assert emulated == dynamic


def test_bench_reports_each_partition(models: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "edge.cli", "bench", str(models["smollm2-135m"]), "--backends", "llamacpp"]
    cmd += ["--plan", "hetero:openvino:cpu,ort:cpu", "--repeat", "1", "--prompt-tokens", "32"]
    cmd += ["--gen-tokens", "8", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    (plan_result,) = [r for r in report["results"] if r["backend"].startswith("hetero:")]
    parts = plan_result["partitions"]
    assert len(parts) == 2 and "openvino:cpu" in parts[0]["partition"] and "ort:cpu" in parts[1]["partition"]
    assert all(p["decode_ms_per_token"] > 0 and p["prefill_ms"] > 0 for p in parts)
    assert plan_result["decode_tok_s"] > 0 and plan_result["ratio_decode"] > 0
    assert "partition 0-" in proc.stdout


def test_the_api_says_where_a_plan_runs(models: dict[str, Path]) -> None:
    import edge

    with edge.load(str(models["smollm2-135m"]), device="hetero:openvino:cpu,ort:cpu", n_ctx=512) as m:
        assert m.backend == "openvino+ort" and m.fallback is None
        assert m.plan is not None and "2 partition(s)" in m.plan and "ort:cpu" in m.plan
        assert m.generate("Hi", max_tokens=4, temperature=0).text
    with edge.load(str(models["smollm2-135m"]), device="cpu") as m:
        assert m.plan is None and m.backend in ("llamacpp", "ort", "openvino")  # --backend auto's choice
