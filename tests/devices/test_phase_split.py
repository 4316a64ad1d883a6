"""One model split by phase (devices/phase_split.py): prompts on one graph, decode steps on another, one ring KV.

At --precision exact both halves compute fp32 on the file's own blocks, so the split must decode as the decode
half alone does, token for token, through prompts of several chunks, ring wraps, sinks and rollbacks.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.phase_split import PhaseSplitDecoder, parse_phase_plan
from edge.devices.planned import DeviceRequest, PlannedOptions, open_requested, resolve_request
from edge.errors import DeviceError, PlanError
from edge.kvcache.staging import WINDOW
from edge.models.gguf_file import open_gguf
from tests.devices.test_batch import PLANS, _prompt, _run_plan
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")

Q = gguf.GGMLQuantizationType
SPECS = {
    "llama-q4_1": TinySpec(arch="llama", weight_type=Q.Q4_1, seed=5),
    "gemma3-f16": TinySpec(arch="gemma3", n_layer=3, weight_type=Q.F16, seed=7),  # sliding windows of 8
}
ATOL = 2e-3  # fp32 on two runtimes: summation order only

PLANS_MORE = [*PLANS, (_prompt(2 * WINDOW + 3, 8), [(5, 4), (3 * WINDOW, 0)])]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("phases")
    return {name: write_tiny_model(tmp / f"{name}.gguf", spec) for name, spec in SPECS.items()}


def _options(backend: str, capacity: int, staged: bool = False) -> GraphOptions:
    return GraphOptions(
        backend=backend,
        precision="exact",
        staged=staged,
        capacity=capacity,
        sink=2,
        threads=1,
        prefill_chunk=WINDOW,
        max_rollback=8,
    )


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("capacity", [256, 48], ids=["long", "wraps"])
@pytest.mark.parametrize("staged", [False, True], ids=["ort", "ort-staged"])
def test_split_decodes_as_the_decode_half_alone(
    files: dict[str, Path], name: str, capacity: int, staged: bool
) -> None:
    gg = open_gguf(files[name])
    alone = GraphDecoder(gg, _options("ort", capacity, staged))
    expected = []
    for plan in PLANS_MORE:
        alone.reset()
        expected.append(_run_plan(alone, plan))
    alone.close()

    prefill = GraphDecoder(gg, _options("openvino", capacity))
    split = PhaseSplitDecoder(prefill, GraphDecoder(gg, _options("ort", capacity, staged)))
    got = []
    for plan in PLANS_MORE:
        split.reset()
        got.append(_run_plan(split, plan))
    prefill_s, decode_s = split.seconds
    split.close()

    for i, ((tokens, rows), (want, want_rows)) in enumerate(zip(got, expected, strict=True)):
        assert tokens == want, f"plan {i} parted from the decode half alone"
        np.testing.assert_allclose(np.stack(rows), np.stack(want_rows), atol=ATOL)
    assert prefill_s > 0 and decode_s > 0  # both halves ran: the long prompts on the prefill half
    assert split.staged == staged


def test_a_prompt_runs_on_the_prefill_half_whole(files: dict[str, Path]) -> None:
    """A prompt's chunks all go to the prefill half (its last short one too); a short forward to the decode half."""
    gg = open_gguf(files["llama-q4_1"])
    split = PhaseSplitDecoder(
        GraphDecoder(gg, _options("openvino", 256)), GraphDecoder(gg, _options("ort", 256))
    )
    split.forward(_prompt(WINDOW + 3, 1))  # two chunks: 32 and 3 tokens
    after_prompt = list(split.seconds)
    assert after_prompt[0] > 0 and after_prompt[1] == 0
    split.forward([5, 6, 7])
    assert split.seconds[0] == after_prompt[0] and split.seconds[1] > 0
    caps = split.capabilities()
    assert caps.phases is not None and not caps.batch_invariant
    assert (caps.phases.prefill, caps.phases.decode) == ("openvino:cpu:exact", "ort:cpu:exact")
    split.close()


def test_halves_of_other_models_are_refused(tmp_path: Path, files: dict[str, Path]) -> None:
    other = write_tiny_model(tmp_path / "other.gguf", TinySpec(arch="llama", n_layer=3, seed=9))
    a = GraphDecoder(open_gguf(files["llama-q4_1"]), _options("ort", 64))
    b = GraphDecoder(open_gguf(other), _options("ort", 64))
    with pytest.raises(PlanError, match=r"KV geometry.*layers"):
        PhaseSplitDecoder(a, b)
    a.close()
    b.close()


@pytest.mark.parametrize(
    "text",
    [
        "prefill=openvino:cpu",  # one half
        "prefill=openvino:cpu:bf16;decode=ort:cpu",
        "prefill=llamacpp:cpu,decode=ort:cpu",  # llama.cpp owns its KV
        "prefill=ort:cpu:bf16,decode=ort:cpu",  # bf16 is OpenVINO's
        "prefill=openvino:cpu:half,decode=ort:cpu",
        "prefill=openvino,decode=ort:cpu",
        "prefill=ort:cpu,prefill=ort:cpu",
    ],
)
def test_a_bad_plan_is_a_plan_error(files: dict[str, Path], text: str) -> None:
    with pytest.raises(PlanError) as err:
        resolve_request(files["llama-q4_1"], DeviceRequest(phases=text), PlannedOptions(n_ctx=64))
    assert isinstance(err.value, DeviceError) and "--plan" in err.value.message


def test_a_plan_takes_no_backend_nor_device(files: dict[str, Path]) -> None:
    request = DeviceRequest(backend="ort", phases="prefill=openvino:cpu,decode=ort:cpu")
    with pytest.raises(PlanError, match="no --backend"):
        resolve_request(files["llama-q4_1"], request, PlannedOptions(n_ctx=64))


def test_plan_opens_through_the_planner(files: dict[str, Path]) -> None:
    """`--plan` reaches the decoder through devices/planned.py; run precision fills a half that names none."""
    plan = "prefill=openvino:cpu,decode=ort:cpu"
    opts = PlannedOptions(n_ctx=64, threads=1, precision="exact")
    dec, placement, device_plan = open_requested(files["llama-q4_1"], DeviceRequest(phases=plan), opts)
    try:
        assert (placement.backend, placement.device, device_plan) == ("openvino+ort", "cpu", None)
        phases = dec.capabilities().phases
        assert phases is not None and phases.label == "prefill openvino:cpu:exact, decode ort:cpu:exact"
        assert dec.forward(_prompt(40, 3), last_only=True).shape == (1, SPECS["llama-q4_1"].n_vocab)
    finally:
        dec.close()
    assert parse_phase_plan("prefill=openvino:cpu:bf16,decode=ort:cpu", "fast").backend == "openvino:bf16+ort"


def test_the_memory_check_counts_both_halves(files: dict[str, Path]) -> None:
    from edge.devices.registry import estimate_memory
    from edge.errors import InsufficientMemoryError

    path = files["llama-q4_1"]
    one = estimate_memory("ort", path, 64)
    assert one is not None
    request = DeviceRequest(phases="prefill=openvino:cpu,decode=ort:cpu")
    # room for one copy of the weights, not two
    with pytest.raises(InsufficientMemoryError):
        resolve_request(
            path, request, PlannedOptions(n_ctx=64, available_memory=one.total + one.weights // 2)
        )
    resolve_request(path, request, PlannedOptions(n_ctx=64, available_memory=2 * one.total))


def test_warm_up_runs_the_prefill_half(files: dict[str, Path]) -> None:
    """`warm_kernels` (what chat and serve run at load) reaches the prefill half, whose first runs cost more."""
    from edge.devices.base import warm_kernels

    gg = open_gguf(files["llama-q4_1"])
    split = PhaseSplitDecoder(
        GraphDecoder(gg, _options("openvino", 256)), GraphDecoder(gg, _options("ort", 256))
    )
    assert split.capabilities().first_run_costs  # OpenVINO's
    warm_kernels(split)
    assert split.seconds[0] > 0 and split.seconds[1] > 0 and split.position == 0
    split.close()


def test_bench_refuses_a_bad_phase_plan_up_front() -> None:
    from edge.bench_config import BenchConfig

    with pytest.raises(PlanError):
        BenchConfig(backends=("ort",), plans=("prefill=ort:cpu",))
    BenchConfig(backends=("ort",), plans=("prefill=openvino:cpu:bf16,decode=ort:cpu", "npu-emulated"))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_an_emulated_npu_prefill_half_decodes_as_the_decode_half_alone(
    files: dict[str, Path], name: str
) -> None:
    """`--plan prefill=openvino:npu,decode=ort:cpu --emulate`: prompts on the NPU-shaped static graphs (OpenVINO
    on the CPU, an 8-token prefill graph over 64 slots: prompts padded and cut at its width, the ring wrapping),
    tokens on ORT's graph, one ring: at exact, as ORT alone."""
    plan = "prefill=openvino:npu,decode=ort:cpu"
    opts = PlannedOptions(n_ctx=64, threads=1, precision="exact", prefill_chunk=8, static_capacity=64)
    dec, placement, _ = open_requested(files[name], DeviceRequest(phases=plan, emulate=True), opts)
    alone = GraphDecoder(
        open_gguf(files[name]), GraphOptions(backend="ort", precision="exact", capacity=64, threads=1)
    )
    try:
        assert isinstance(dec, PhaseSplitDecoder) and placement.device == "npu+cpu"
        phases = dec.capabilities().phases
        assert phases is not None and phases.prefill == "openvino:npu:exact"
        assert dec.capabilities().batching is None  # the static half runs one sequence
        with pytest.raises(DeviceError, match="one sequence"):
            dec.slots(2)
        for plan_ in PLANS_MORE:
            dec.reset()
            alone.reset()
            tokens, rows = _run_plan(dec, plan_)
            want, want_rows = _run_plan(alone, plan_)
            assert tokens == want
            np.testing.assert_allclose(np.stack(rows), np.stack(want_rows), atol=ATOL)
        assert dec.seconds[0] > 0 and dec.seconds[1] > 0
        sink = dec.max_sink  # (gemma3's 3 layers are all windowed: no sink beyond the default)
        assert sink == min(32, 64 - 8) if name == "llama-q4_1" else sink == 4
        if sink > 4:
            assert dec.set_sink(sink)  # a new ring: the NPU half's next prompt is written to it
            dec.forward(_prompt(40, 9))
            assert dec.position == 40 and dec.kv_fill().sink == sink
    finally:
        dec.close()
        alone.close()


def test_emulate_with_a_plan_needs_an_npu_prefill_half(files: dict[str, Path]) -> None:
    for plan in ("prefill=openvino:cpu,decode=ort:cpu", "prefill=openvino:npu,decode=openvino:npu"):
        with pytest.raises(PlanError, match="emulates an NPU prefill half"):
            resolve_request(
                files["llama-q4_1"], DeviceRequest(phases=plan, emulate=True), PlannedOptions(n_ctx=64)
            )
