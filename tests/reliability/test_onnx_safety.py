"""ONNX files whose external data points outside their folder (absolute path, `..`, symlink) or past the end of
their data: refused by models.onnx_safety before ONNX Runtime or OpenVINO open them."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge.devices.registry import graph_runner
from edge.devices.runners import RunnerOptions
from edge.errors import ModelFormatError
from edge.models.onnx_safety import check_onnx_file

N = 256  # floats in the external tensor (1 KiB)
SECRET = np.arange(N, dtype=np.float32) + 1000.0  # what a hostile location would read


def _graph(initializers: list[TensorProto], nodes: list[onnx.NodeProto] | None = None) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [N])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [N])
    nodes = nodes or [helper.make_node("Add", ["x", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _external(tensor: TensorProto, location: str, offset: int = 0, length: int = N * 4) -> TensorProto:
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    del tensor.external_data[:]
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = k, v
    return tensor


@pytest.fixture
def layout(tmp_path: Path) -> tuple[Path, Path]:
    """model/ (the graph's folder, with its own good data file) and outside/secret.bin beside it."""
    model_dir, outside = tmp_path / "model", tmp_path / "outside"
    model_dir.mkdir()
    outside.mkdir()
    (outside / "secret.bin").write_bytes(SECRET.tobytes())
    (model_dir / "w.bin").write_bytes(np.ones(N, np.float32).tobytes())
    (model_dir / "sub").mkdir()
    (model_dir / "sub" / "w.bin").write_bytes(np.full(N, 2.0, np.float32).tobytes())
    return model_dir, outside


def write_model(model_dir: Path, location: str, **kw: int) -> Path:
    w = _external(numpy_helper.from_array(np.zeros(N, np.float32), "w"), location, **kw)
    path = model_dir / "model.onnx"
    path.write_bytes(_graph([w]).SerializeToString())
    return path


def run(path: Path, backend: str = "ort") -> np.ndarray:
    runner = graph_runner(backend)(path, RunnerOptions(threads=1))
    return runner.run({"x": np.zeros(N, np.float32)}, ["y"])[0]


@pytest.mark.parametrize("location", ["w.bin", "sub/w.bin", "./w.bin"])
def test_data_inside_the_folder_loads(location: str, layout: tuple[Path, Path]) -> None:
    model_dir, _ = layout
    path = write_model(model_dir, location)
    check_onnx_file(path)
    expected = np.fromfile(model_dir / location, np.float32)
    np.testing.assert_array_equal(run(path), expected)


HOSTILE: dict[str, Callable[[Path, Path], str]] = {
    "absolute": lambda m, o: str(o / "secret.bin"),
    "dot-dot": lambda m, o: "../outside/secret.bin",
    "dot-dot-inside-a-path": lambda m, o: "sub/../../outside/secret.bin",
    "windows-absolute": lambda m, o: "C:\\outside\\secret.bin",
    "windows-unc": lambda m, o: "\\\\server\\share\\secret.bin",
    "windows-dot-dot": lambda m, o: "..\\outside\\secret.bin",
    "empty": lambda m, o: "",
    "missing": lambda m, o: "nope.bin",
}


@pytest.mark.parametrize("case", list(HOSTILE))
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_external_data_outside_the_folder_is_refused(
    case: str, backend: str, layout: tuple[Path, Path]
) -> None:
    model_dir, outside = layout
    path = write_model(model_dir, HOSTILE[case](model_dir, outside))
    with pytest.raises(ModelFormatError):
        check_onnx_file(path)
    with pytest.raises(ModelFormatError):  # the runner checks before the backend opens the file
        run(path, backend)


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")
@pytest.mark.parametrize("kind", ["file-link", "folder-link", "link-to-inside"])
def test_symlinks_are_followed_before_the_check(kind: str, layout: tuple[Path, Path]) -> None:
    model_dir, outside = layout
    if kind == "file-link":
        (model_dir / "link.bin").symlink_to(outside / "secret.bin")
        location = "link.bin"
    elif kind == "folder-link":
        (model_dir / "linked").symlink_to(outside, target_is_directory=True)
        location = "linked/secret.bin"
    else:  # a link that stays inside the folder is fine
        (model_dir / "alias.bin").symlink_to(model_dir / "w.bin")
        location = "alias.bin"
    path = write_model(model_dir, location)
    if kind == "link-to-inside":
        check_onnx_file(path)
        np.testing.assert_array_equal(run(path), np.ones(N, np.float32))
        return
    with pytest.raises(ModelFormatError, match="resolves outside"):
        check_onnx_file(path)
    with pytest.raises(ModelFormatError):
        run(path)


@pytest.mark.parametrize(
    ("offset", "length"),
    [(0, N * 4 + 4), (N * 4, 4), (2**62, 4), (-4, 8), (N * 4 + 8, -1)],  # -1: to the end of the file
)
def test_ranges_beyond_the_data_file_are_refused(offset: int, length: int, layout: tuple[Path, Path]) -> None:
    model_dir, _ = layout
    path = write_model(model_dir, "w.bin", offset=offset, length=length)
    with pytest.raises(ModelFormatError):
        check_onnx_file(path)


def test_non_numeric_offset_is_refused(layout: tuple[Path, Path]) -> None:
    model_dir, _ = layout
    w = _external(numpy_helper.from_array(np.zeros(N, np.float32), "w"), "w.bin")
    w.external_data[1].value = "0x10"
    (model_dir / "model.onnx").write_bytes(_graph([w]).SerializeToString())
    with pytest.raises(ModelFormatError, match="non-numeric"):
        check_onnx_file(model_dir / "model.onnx")


def test_tensors_outside_the_initializer_list_are_checked(layout: tuple[Path, Path]) -> None:
    """External tensors also hide in Constant nodes and in subgraphs (an If branch)."""
    model_dir, _ = layout
    leak = "../outside/secret.bin"
    const = helper.make_node(
        "Constant", [], ["w"], value=_external(numpy_helper.from_array(np.zeros(N, np.float32), "c"), leak)
    )
    path = model_dir / "model.onnx"
    path.write_bytes(_graph([], [const, helper.make_node("Add", ["x", "w"], ["y"])]).SerializeToString())
    with pytest.raises(ModelFormatError, match="'c'"):
        check_onnx_file(path)

    out = helper.make_tensor_value_info("b", TensorProto.FLOAT, [N])
    hidden = _external(numpy_helper.from_array(np.zeros(N, np.float32), "hidden"), leak)
    branch = helper.make_graph([helper.make_node("Identity", ["hidden"], ["b"])], "br", [], [out], [hidden])
    cond = numpy_helper.from_array(np.array(True), "cond")
    if_node = helper.make_node("If", ["cond"], ["w"], then_branch=branch, else_branch=branch)
    model = _graph([cond], [if_node, helper.make_node("Add", ["x", "w"], ["y"])])
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelFormatError, match="'hidden'"):
        check_onnx_file(path)


@pytest.mark.parametrize("cut", [1, 10, 40])
def test_truncated_or_garbage_graph_is_refused(cut: int, layout: tuple[Path, Path]) -> None:
    model_dir, _ = layout
    path = write_model(model_dir, "w.bin")
    path.write_bytes(path.read_bytes()[:cut] + b"\xff" * 3)
    with pytest.raises(ModelFormatError, match="not a readable ONNX file"):
        check_onnx_file(path)


@pytest.fixture(autouse=True)
def _private_cache(edge_cache: Path) -> None:
    """check_onnx_file remembers what it checked in edge's cache: a private one per module."""


def test_a_checked_graph_is_not_parsed_again_until_it_changes(tmp_path: Path, edge_cache: Path) -> None:
    import subprocess
    import sys

    model_dir, outside = edge_cache / "graphs" / "entry", tmp_path / "outside"
    model_dir.mkdir(parents=True)
    outside.mkdir()
    (outside / "secret.bin").write_bytes(SECRET.tobytes())
    (model_dir / "blobs").mkdir()
    (model_dir / "blobs" / "w.bin").write_bytes(np.ones(N, np.float32).tobytes())
    (model_dir / "w.bin").symlink_to(model_dir / "blobs" / "w.bin")  # a hop inside the folder
    path = write_model(model_dir, "w.bin")
    assert check_onnx_file(path) == {(model_dir / "blobs" / "w.bin").resolve()}
    code = (
        "import sys\nfrom edge.models.onnx_safety import check_onnx_file\n"
        f"assert [p.name for p in check_onnx_file({str(path)!r})] == ['w.bin']\n"
        "assert 'onnx' not in sys.modules  # the record spared the parse\n"
    )
    env = {**os.environ, "EDGE_CACHE_DIR": str(edge_cache)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    # the same graph bytes, but the location it names now points out of the folder: refused
    (model_dir / "w.bin").unlink()
    (model_dir / "w.bin").symlink_to(outside / "secret.bin")
    with pytest.raises(ModelFormatError, match="outside"):
        check_onnx_file(path)
    # a rewritten graph is parsed again, whatever the record said
    (model_dir / "w.bin").unlink()
    (model_dir / "w.bin").write_bytes(np.ones(N, np.float32).tobytes())
    check_onnx_file(path)
    write_model(model_dir, str(outside / "secret.bin"))
    with pytest.raises(ModelFormatError, match="absolute"):
        check_onnx_file(path)


def test_a_graph_outside_edges_graph_cache_is_parsed_every_time(
    layout: tuple[Path, Path], edge_cache: Path
) -> None:
    """An artifact or a user's graph never rides on a record: only edge's own builds are remembered."""
    model_dir, _ = layout
    path = write_model(model_dir, "w.bin")
    check_onnx_file(path)
    records = edge_cache / "onnx-checked.json"
    assert not records.exists() or str(path.resolve()) not in records.read_text()
