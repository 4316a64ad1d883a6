"""A graph build reports its progress (issue 30, "a build that talks"): `edge.load`'s on_progress gets phase
"build" from (0, total) to (total, total), for an own graph and for an NPU-shaped plan; without a callback, a
line on stderr says what is built, that it happens once per model and where it is cached; a cached graph says
nothing. On tiny random GGUFs."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

import edge
from edge.devices.graph_decoder import GraphOptions, build_options, ensure_graph
from edge.models.arch import ArchConfig
from edge.models.build_progress import (
    BUILD_PHASE,
    COMPILE_PHASE,
    BuildTask,
    StderrBuildProgress,
    opening,
    reporting,
)
from edge.models.gguf_file import open_gguf
from edge.models.transformer import build_steps
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen2.gguf", TinySpec(arch="qwen2"))


Call = tuple[int, int, str]


def _checked_build(calls: list[Call]) -> None:
    """One build's calls: phase build, from (0, total) to (total, total), done never going back; then the
    runtime's open (phase compile) when the calls come from a load."""
    opened = [c for c in calls if c[2] == COMPILE_PHASE]
    assert opened in ([], [(0, 1, COMPILE_PHASE), (1, 1, COMPILE_PHASE)])
    calls = [c for c in calls if c[2] != COMPILE_PHASE]
    assert calls and all(phase == BUILD_PHASE for _, _, phase in calls)
    assert calls[0][0] == 0 and calls[-1][0] == calls[-1][1] > 0
    done = [d for d, _, _ in calls]
    assert done == sorted(done)
    assert all(d <= t for d, t, _ in calls)


def _build(path: Path, backend: str = "ort") -> Path:
    gguf = open_gguf(path)
    cfg = ArchConfig.from_gguf(gguf.metadata, set(gguf.tensors))
    opts = GraphOptions(backend=backend, precision="fast")
    return ensure_graph(gguf, cfg, build_options(cfg, opts), backend, fuse=opts.fuse, precision="fast")


def test_a_build_reports_its_steps_once(tiny: Path) -> None:
    calls: list[Call] = []
    with reporting(lambda *c: calls.append(c)):
        graph = _build(tiny)
    _checked_build(calls)
    gguf = open_gguf(tiny)
    cfg = ArchConfig.from_gguf(gguf.metadata, set(gguf.tensors))
    assert (
        calls[-1][1] > build_steps(cfg) == cfg.n_layer + 1
    )  # the layers and head, then passes and the write
    assert graph.is_file() and (graph.parent / "model.onnx.data").is_file()
    assert sorted(p.name for p in graph.parent.iterdir()) == ["DONE", "model.onnx", "model.onnx.data"]
    calls.clear()
    with reporting(lambda *c: calls.append(c)):
        assert _build(tiny) == graph  # cached: nothing to report
    assert calls == []


def test_without_a_callback_a_build_is_announced_on_stderr(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _build(tiny, "openvino")
    out, err = capsys.readouterr()
    assert out == ""  # stdout stays the command's (edge run --json)
    lines = err.splitlines()
    assert lines[0].startswith(f"building the OpenVINO graph for {tiny.name} (once per model; cached in ")
    assert lines[-1].startswith(f"built the OpenVINO graph for {tiny.name} in ")


def test_plain_lines_off_a_terminal() -> None:
    stream = io.StringIO()  # not a TTY
    display = StderrBuildProgress(
        "the ORT graph for m.gguf", "once per model; cached in /c", stream, every_s=0
    )
    display.start(10)
    display(3, 10, BUILD_PHASE)
    display.finish(True)
    assert stream.getvalue().splitlines()[:2] == [
        "building the ORT graph for m.gguf (once per model; cached in /c)",
        "building: 3/10 steps, 0 s",
    ]


def test_a_slow_open_is_announced_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with opening("the graph for m.gguf with OpenVINO on cpu", after_s=0.0):
        pass
    with opening("a cached graph", after_s=60.0):  # quick: nothing said
        pass
    out, err = capsys.readouterr()
    assert out == ""
    assert (
        err.splitlines()[0]
        == "opening the graph for m.gguf with OpenVINO on cpu (the runtime prepares its weights; OpenVINO caches its compiled form)"
    )
    assert err.splitlines()[1].startswith("opened the graph for m.gguf with OpenVINO on cpu in ")
    assert "cached graph" not in err


def test_an_inner_task_counts_in_the_outer_one() -> None:
    calls: list[Call] = []
    with reporting(lambda *c: calls.append(c)), BuildTask("plan", "cached") as outer:
        with BuildTask("partitions", "into a temporary", 3) as inner:
            inner.step()
            inner.add(2)
            inner.step(4)
        assert (outer.done, outer.total) == (5, 5)
    assert calls[0] == (0, 0, BUILD_PHASE) and calls[-1] == (5, 5, BUILD_PHASE)


def test_edge_load_hands_the_build_to_on_progress(tmp_path: Path) -> None:
    tiny = write_tiny_model(tmp_path / "tiny-load.gguf", TinySpec(arch="qwen2"))  # not built yet
    calls: list[Call] = []
    with edge.load(str(tiny), backend="ort", draft="none", on_progress=lambda *c: calls.append(c)) as m:
        assert m.backend == "ort"
    _checked_build(calls)  # one build: the native check's own graphs (llama.cpp's known answers) are quiet


def test_an_emulated_npu_plan_reports_its_conversion(tmp_path: Path) -> None:
    tiny = write_tiny_model(tmp_path / "tiny-npu.gguf", TinySpec(arch="qwen2"))
    calls: list[Call] = []
    with edge.load(
        str(tiny), device="npu", emulate=True, draft="none", on_progress=lambda *c: calls.append(c)
    ) as m:
        assert "npu" in m.device
    _checked_build(calls)
