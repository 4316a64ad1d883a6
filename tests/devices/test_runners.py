"""OrtRunner keeps an input bound while it is fed the same array object (a decode step's past KV views):
ORT reads the memory at run time, so in-place writes are seen, and a binding never outlives its input. It keeps
small outputs bound between runs of the same shapes, and a result it handed out never changes afterwards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import edge.devices.runners as runners
from edge.devices.runners import OrtRunner, RunnerOptions


def _add_graph(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [None, 4])
    graph = helper.make_graph([helper.make_node("Add", ["x", "y"], ["z"])], "add", [x, y], [z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


def test_a_kept_binding_reads_the_array_as_it_is_at_run_time(tmp_path: Path) -> None:
    runner = OrtRunner(_add_graph(tmp_path / "add.onnx"), RunnerOptions())
    buffer = np.zeros((3, 4), np.float32)  # a ring buffer: the same object every run, written in place
    view = buffer[:2]  # a contiguous prefix view, as RingDecoder binds the past
    one = np.ones((2, 4), np.float32)
    assert np.array_equal(runner.run({"x": view, "y": one}, ["z"])[0], one)
    view[1] = 5.0  # written between runs; `view` is fed again: left bound, and its new content is read
    out = runner.run({"x": view, "y": one}, ["z"])[0]
    assert np.array_equal(out, np.array([[1] * 4, [6] * 4], np.float32))
    # a new array object with other content: rebound
    other = np.full((2, 4), 2.0, np.float32)
    assert np.array_equal(runner.run({"x": view, "y": other}, ["z"])[0][0], np.full(4, 2.0, np.float32))
    # another shape through a new view of the same buffer: rebound
    buffer[2] = 7.0
    assert runner.run({"x": buffer, "y": np.zeros((3, 4), np.float32)}, ["z"])[0][2].tolist() == [7.0] * 4
    # a non-contiguous array (ORT may copy it at bind time) is bound anew every run
    wide = np.zeros((2, 8), np.float32)
    strided = wide[:, ::2]
    runner.run({"x": strided, "y": one}, ["z"])
    wide[:, ::2] = 3.0
    assert np.array_equal(runner.run({"x": strided, "y": one}, ["z"])[0], np.full((2, 4), 4.0, np.float32))
    runner.close()


def _range_graph(path: Path) -> Path:
    """y = Range(0, n, 1): the output's shape hangs on the value of n, not on any input's shape."""
    n = helper.make_tensor_value_info("n", TensorProto.INT64, [])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [None])
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    graph = helper.make_graph(
        [helper.make_node("Range", ["zero", "n", "one"], ["y"])], "range", [n], [y], [zero, one]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("keep_bytes", [runners.KEEP_OUTPUTS_BYTES, -1])
def test_results_are_never_overwritten_by_later_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_bytes: int
) -> None:
    """Small outputs stay bound between runs of the same shapes (ORT reuses their buffers), large ones are
    bound afresh: either way a result handed out earlier keeps its values."""
    monkeypatch.setattr(runners, "KEEP_OUTPUTS_BYTES", keep_bytes)
    runner = OrtRunner(_add_graph(tmp_path / "add.onnx"), RunnerOptions())
    binds = _count_output_binds(runner, monkeypatch)
    x = np.ones((2, 4), np.float32)
    results = [runner.run({"x": x, "y": np.full((2, 4), v, np.float32)}, ["z"])[0] for v in (1.0, 2.0, 3.0)]
    # small outputs: bound once and kept for the next two runs; too large: bound every run
    assert len(binds) == (1 if keep_bytes > 0 else 3)
    for v, got in zip((2.0, 3.0, 4.0), results, strict=True):
        assert np.array_equal(got, np.full((2, 4), v, np.float32))
    # another row count: the runner sees the inputs' new shape and binds the outputs anew (not a refused run
    # first), then keeps them for the next run of that shape
    one = np.ones((1, 4), np.float32)
    for _ in range(2):
        assert np.array_equal(runner.run({"x": one, "y": one}, ["z"])[0], np.full((1, 4), 2.0, np.float32))
    assert len(binds) == (2 if keep_bytes > 0 else 5)
    assert runner._keep_outputs  # no run was refused
    runner.close()


def test_an_output_shaped_by_input_values_is_bound_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same input shapes, another output shape: ORT refuses the kept buffer, the runner redoes the run with a
    new one and keeps no outputs for that graph from then on (no refused run per call)."""
    runner = OrtRunner(_range_graph(tmp_path / "range.onnx"), RunnerOptions())
    binds = _count_output_binds(runner, monkeypatch)
    for n in (3, 3, 5, 2, 2):
        assert runner.run({"n": np.array(n, np.int64)}, ["y"])[0].tolist() == list(range(n))
    # 3: bound; 3: kept; 5: refused, bound; 2, 2: bound every run
    assert len(binds) == 4
    runner.close()


def _count_output_binds(runner: OrtRunner, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    bind = runner._binding.bind_output

    def counted(name: str, *args: object, **kwargs: object) -> None:
        calls.append(name)
        bind(name, *args, **kwargs)

    monkeypatch.setattr(runner._binding, "bind_output", counted)
    return calls
