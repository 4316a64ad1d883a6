"""Auto by phase (devices/auto_split.py): `--backend auto` splits a model by phase only where one measured run
says the split is faster than the fastest single backend by the margin, both halves are own graphs that run
here (bf16 only on a CPU with a matrix engine), and one sequence runs at a time; loading opens the split as
`--plan` does, and says so. The measurements are injected by writing the speeds store, as `edge bench` does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edge.api import load
from edge.bench import BenchConfig, run_bench
from edge.devices import auto
from edge.devices.auto import HalfSpeed, Speed, choose_backend, machine_key, model_sha256, record_speeds
from edge.devices.auto_split import SPLIT_MARGIN, phase_table, weigh_split
from edge.models.store import cache_dir
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")

ALL = ["llamacpp", "ort", "openvino"]
# ort decodes fastest, OpenVINO prompts fastest: the split runs the reference request 2.3x ort alone
SPLIT_PAYS = {"llamacpp": (100.0, 100.0), "ort": (100.0, 150.0), "openvino": (2000.0, 60.0)}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", TinySpec(arch="llama"))


@pytest.fixture(autouse=True)
def _no_measurements() -> None:
    (cache_dir() / auto.SPEEDS_FILE).unlink(missing_ok=True)


def _record(
    path: Path,
    speeds: dict[str, tuple[float, float]],
    halves: dict[str, HalfSpeed] | None = None,
    precision: str = "fast",
) -> None:
    kept = record_speeds(
        model_sha256(path),
        machine_key(1),
        precision,
        {b: Speed(p, d) for b, (p, d) in speeds.items()},
        "test",
        halves,
    )
    assert kept


def _without_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another CPU of the same model name, without a bf16 path (AVX512-BF16, AMX): as KVM shows an AVX2-only
    EPYC and a Zen 5 alike ("AMD EPYC")."""
    from edge.devices import cpu

    real = cpu.probe_cpu()
    # NOTE: on a CPU that has no bf16 path itself (an Intel Xeon whose VM hides AMX and AVX512-BF16), the
    # other CPU is the one with it: either way the instruction sets, and so the machine key, differ
    has = bool(real.isa.get("avx512_bf16") or real.isa.get("amx"))
    isa = {**real.isa, "avx512_bf16": not has, "amx": False}
    monkeypatch.setattr(cpu, "probe_cpu", lambda: replace(real, isa=isa))


def test_a_split_is_chosen_where_it_measured_faster(tiny: Path) -> None:
    _record(tiny, SPLIT_PAYS)
    c = choose_backend(tiny, threads=1, available=ALL)
    assert (c.backend, c.source, c.plan) == (
        "openvino+ort",
        "measured",
        "prefill=openvino:cpu,decode=ort:cpu",
    )
    assert c.split is not None and c.split.chosen and c.split.single == "ort"
    text = c.explain()
    assert "backend auto -> openvino+ort (measured): split by phase" in text
    assert "split by phase (chosen)" in text and "prefill  openvino" in text and "decode   ort" in text
    # parallel sequences split too (slots over both halves); not where a half is not installed, or where the
    # caller runs one backend
    assert choose_backend(tiny, threads=1, available=ALL, batching=True).plan == c.plan
    assert choose_backend(tiny, threads=1, available=["llamacpp", "ort"]).backend == "ort"
    c = choose_backend(tiny, threads=1, available=ALL, split=False)
    assert (c.backend, c.plan) == ("ort", None)


def test_a_small_gain_keeps_the_single_backend(tiny: Path) -> None:
    # the split's request is 1.07x ort alone's: under the margin, and said so
    _record(tiny, {"llamacpp": (100.0, 50.0), "ort": (500.0, 100.0), "openvino": (800.0, 60.0)})
    c = choose_backend(tiny, threads=1, available=ALL)
    assert (c.backend, c.plan) == ("ort", None)
    assert c.split is not None and not c.split.chosen
    assert "split by phase (not chosen)" in c.explain() and f"under the {SPLIT_MARGIN:.2f}x" in c.explain()


def test_one_graph_measured_never_splits(tiny: Path) -> None:
    """Only one own graph measured (here with llama.cpp): nothing to split, and llama.cpp is never a half."""
    _record(tiny, {"llamacpp": (5000.0, 50.0), "ort": (100.0, 150.0)})
    c = choose_backend(tiny, threads=1, available=ALL)
    assert (c.backend, c.split) == ("ort", None)
    # a run of one backend compares nothing, whatever halves it measured: not kept
    halves = {"openvino": HalfSpeed(prefill_tok_s=5000.0)}
    assert not record_speeds(model_sha256(tiny), machine_key(1), "fast", {"ort": Speed(1, 1)}, "t", halves)


def test_a_bf16_half_stands_only_where_it_was_measured(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan's bf16 prompt half measured fast: auto takes it on this machine at --precision fast; another CPU
    of the same model name without a bf16 path is another machine (its key holds the instruction sets), so the
    measurement is not its own; an exact request never takes a bf16 half."""
    bf16 = {"openvino:bf16": HalfSpeed(3000.0, 5000.0), "ort": HalfSpeed(decode_tok_s=98.0)}
    _record(tiny, {"ort": (300.0, 100.0), "openvino": (400.0, 50.0)}, bf16)
    c = choose_backend(tiny, threads=1, available=ALL)
    assert (c.backend, c.plan) == ("openvino:bf16+ort", "prefill=openvino:cpu:bf16,decode=ort:cpu")
    assert c.split is not None and c.split.decode_half.decode_tok_s == 98.0  # ort's lower measurement
    assert "first prompt    3000 tok/s, warm 5000" in c.explain()
    _record(tiny, {"ort": (300.0, 100.0), "openvino": (400.0, 50.0)}, bf16, precision="exact")
    assert choose_backend(tiny, precision="exact", threads=1, available=ALL).plan is None
    _without_bf16(monkeypatch)
    c = choose_backend(tiny, threads=1, available=ALL)
    assert c.source != "measured" and c.plan is None


def test_records_before_auto_by_phase_still_read(tiny: Path) -> None:
    """A store written before auto by phase (no warm prompt, no halves) still decides; a new one keeps the
    fields an older edge reads."""
    old = {
        "format": 1,
        "runs": [
            {
                "model": model_sha256(tiny),
                "machine": machine_key(1),
                "precision": "fast",
                "backends": {b: {"prefill_tok_s": p, "decode_tok_s": d} for b, (p, d) in SPLIT_PAYS.items()},
                "source": "edge bench",
                "recorded": "2026-12-01T00:00:00+00:00",
            }
        ],
    }
    (cache_dir() / auto.SPEEDS_FILE).write_text(json.dumps(old))
    c = choose_backend(tiny, threads=1, available=ALL)
    assert c.source == "measured" and c.backend == "openvino+ort"
    assert c.speeds["ort"] == Speed(100.0, 150.0) and c.speeds["ort"].prefill_warm_tok_s is None
    halves = {"openvino:bf16": HalfSpeed(3000.0, 5000.0)}
    speeds = {"ort": Speed(100.0, 150.0, 120.0), "openvino": Speed(2000.0, 60.0)}
    assert record_speeds(model_sha256(tiny), machine_key(1), "fast", speeds, "test", halves)
    run = json.loads((cache_dir() / auto.SPEEDS_FILE).read_text())["runs"][-1]
    assert run["backends"]["ort"] == {
        "prefill_tok_s": 100.0,
        "decode_tok_s": 150.0,
        "prefill_warm_tok_s": 120.0,
    }
    assert run["halves"] == {"openvino:bf16": {"prefill_tok_s": 3000.0, "prefill_warm_tok_s": 5000.0}}


def test_weighing_is_the_reference_request() -> None:
    table = phase_table(
        {"ort": Speed(128.0, 128.0), "openvino": Speed(256.0, 64.0)},
        {"openvino": HalfSpeed(prefill_tok_s=200.0)},  # measured twice: the lower figure
    )
    verdict = weigh_split(table, ["ort", "openvino"], "ort", 2.0)
    assert verdict is not None and (verdict.prefill, verdict.decode) == ("openvino", "ort")
    assert verdict.request_s() == pytest.approx(128 / 200 + 1.0)
    assert verdict.chosen  # 2.0 s against 1.64 s: 1.22x
    split_s = verdict.request_s()
    for ratio, chosen in ((SPLIT_MARGIN - 0.01, False), (SPLIT_MARGIN + 0.01, True)):  # either side of it
        near = weigh_split(table, ["ort", "openvino"], "ort", split_s * ratio)
        assert near is not None and near.chosen is chosen, ratio
    assert weigh_split(table, ["ort"], "ort", 2.0) is None


def test_loading_opens_the_split_as_a_plan_does(tiny: Path) -> None:
    _record(tiny, SPLIT_PAYS)
    with load(str(tiny), n_ctx=64, n_threads=1) as m:
        assert (m.placement.backend, m.placement.device) == ("openvino+ort", "cpu")
        assert m.placement.auto is not None and m.placement.auto.plan == "prefill=openvino:cpu,decode=ort:cpu"
        phases = m.decoder.capabilities().phases
        assert phases is not None and (phases.prefill, phases.decode) == ("openvino:cpu:fast", "ort:cpu:fast")
        assert np.isfinite(m.decoder.forward(list(range(3, 43)), last_only=True)).all()
        assert m.backend_choice is not None and "split by phase (chosen)" in m.backend_choice
        # --draft auto drafts as on the decode half, which runs the verifies (ORT: prompt lookup)
        assert m.speculative is not None and m.speculative.name.startswith("ngram"), m.speculative


def test_a_split_for_parallel_requests_gives_slots_over_both_halves(tiny: Path) -> None:
    _record(tiny, SPLIT_PAYS)
    with load(str(tiny), n_ctx=64, n_threads=1, parallel=2) as m:
        assert m.placement.auto is not None and m.placement.auto.plan == "prefill=openvino:cpu,decode=ort:cpu"
        slots = m.slots(2)
    try:
        engine = slots[0].batch_engine
        assert engine is not None and engine.prefill is not None
        long = slots[0].decoder.forward(list(range(3, 43)), last_only=True)  # 40 tokens: the prefill half's
        short = slots[1].decoder.forward([1, 5, 6])
        assert np.isfinite(long).all() and np.isfinite(short).all() and engine.prefill_runs == 1
    finally:
        for s in slots:
            s.close()


def test_a_split_for_parallel_requests_counts_every_slots_kv(tiny: Path) -> None:
    """Both halves' weights and one KV fit, four KV caches do not: auto runs the single backend, with a note,
    rather than failing when the slots are made."""
    from edge.devices.planned import DeviceRequest, PlannedOptions, resolve_request
    from edge.devices.registry import estimate_memory
    from edge.models.checked import check_model

    _record(tiny, SPLIT_PAYS)
    checked = check_model(tiny)
    n_ctx = 2048  # a KV large against the tiny weights
    halves = [estimate_memory(b, checked, n_ctx) for b in ("openvino", "ort")]
    assert halves[0] is not None and halves[1] is not None
    both = halves[0].weights + halves[1].weights + halves[0].scratch + halves[1].scratch
    free = both + 2 * halves[0].kv_cache  # the split with one or two KV caches fits, with four it does not
    for parallel, split in ((1, True), (4, False)):
        opts = PlannedOptions(n_ctx=n_ctx, threads=1, available_memory=free, parallel=parallel)
        placement = resolve_request(checked, DeviceRequest(None, "cpu", None), opts).placement
        assert placement.auto is not None and (placement.auto.plan is not None) == split, parallel
    assert placement.auto.note is not None and "does not fit in memory" in placement.auto.note


def test_a_split_that_does_not_fit_runs_the_single_backend_it_beat(tiny: Path) -> None:
    """Auto was not asked to split: a split whose two halves' weights do not fit must not stop the load."""
    from edge.devices.registry import estimate_memory
    from edge.models.checked import check_model

    _record(tiny, SPLIT_PAYS)
    one = estimate_memory("ort", check_model(tiny), 64)
    assert one is not None
    free = one.total + one.weights // 2  # one copy of the weights fits, two do not
    with load(str(tiny), n_ctx=64, n_threads=1, available_memory=free) as m:
        assert (m.placement.backend, m.decoder.capabilities().phases) == ("ort", None)
        auto_choice = m.placement.auto
        assert auto_choice is not None and auto_choice.plan is None
        assert auto_choice.note is not None and "does not fit in memory" in auto_choice.note
        assert np.isfinite(m.decoder.forward(list(range(3, 13)), last_only=True)).all()


def test_edge_bench_records_the_halves_it_measured(tiny: Path) -> None:
    plan = "prefill=openvino:cpu,decode=ort:cpu"
    cfg = BenchConfig(
        backends=("ort", "openvino"), plans=(plan,), prompt_tokens=64, gen_tokens=32, repeat=1, threads=1
    )
    report = run_bench(str(tiny), cfg)
    assert "auto_record" in report.notes
    row = next(r for r in report.results if r.backend == plan)
    run = json.loads((cache_dir() / auto.SPEEDS_FILE).read_text())["runs"][-1]
    assert set(run["backends"]) == {"ort", "openvino"}
    assert all("prefill_warm_tok_s" in s for s in run["backends"].values())
    assert run["halves"] == {
        "openvino": {
            "prefill_tok_s": round(row.prefill_tok_s.median, 2),
            "prefill_warm_tok_s": round(row.prefill_warm_tok_s.median, 2),
        },
        "ort": {"decode_tok_s": round(row.decode_tok_s.median, 2)},
    }
    # `--backends auto` where auto splits: the single backend it beat, and the split beside it
    _record(tiny, SPLIT_PAYS)
    auto_run = run_bench(str(tiny), BenchConfig(prompt_tokens=8, gen_tokens=4, repeat=1, threads=1))
    assert [r.backend for r in auto_run.results] == ["ort", plan]
    assert "backend auto -> openvino+ort" in auto_run.notes["auto"]


def test_edge_run_auto_opens_the_split_and_names_its_halves(tiny: Path) -> None:
    _record(tiny, SPLIT_PAYS)
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}  # EDGE_CACHE_DIR: this module's cache
    args = ["run", str(tiny), "w1 w2 w3", "--backend", "auto", "--threads", "1", "--ctx-size", "64"]
    args += ["--max-tokens", "2", "--raw", "--explain", "--json"]
    proc = subprocess.run(
        [sys.executable, "-m", "edge.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (out["backend"], out["device"]) == ("openvino+ort", "cpu")
    assert out["backend_auto"]["plan"] == "prefill=openvino:cpu,decode=ort:cpu"
    assert out["backend_auto"]["source"] == "measured"
    assert "split by phase" in proc.stderr
    assert "prefill: openvino:cpu:fast" in proc.stderr and "decode:  ort:cpu:fast" in proc.stderr
    assert "backend auto -> openvino+ort (measured)" in proc.stderr
