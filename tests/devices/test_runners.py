"""OrtRunner keeps an input bound while it is fed the same array object (a decode step's past KV views):
ORT reads the memory at run time, so in-place writes are seen, and a binding never outlives its input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

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
