"""`edge models`, `edge rm` and `edge cache [--prune]` on real cache layouts: graphs, plans and compile caches
built by edge itself in a private EDGE_CACHE_DIR (a tiny GGUF; smollm2-135m where a catalog model is needed),
never the shared one's models."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.filesize import decimal

from edge.devices.graph_decoder import GRAPH_FORMAT
from edge.models.catalog import CATALOG
from edge.models.store import is_verified, model_path
from tests.shared_cache import SHARED_CACHE, pull_named_models
from tests.tiny_models import TinySpec, write_tiny_model

EDGE = [sys.executable, "-m", "edge.cli"]


def edge(cache: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    env.update(EDGE_CACHE_DIR=str(cache), COLUMNS="250")  # tables wide enough for a tmp path on one line
    return subprocess.run([*EDGE, *args], capture_output=True, text=True, timeout=timeout, env=env)


def edge_json(cache: Path, *args: str) -> dict:
    proc = edge(cache, *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def build(cache: Path, gguf: Path, *, plan: bool = False) -> None:
    """What a user's runs leave: the own graph on ORT at --precision exact (and a two-backend plan)."""
    code = (
        "import sys\n"
        "from edge.api import load\n"
        "for opts in [dict(backend='ort')] + ([dict(device='hetero:openvino:cpu,ort:cpu')] if sys.argv[2] else []):\n"
        "    with load(sys.argv[1], n_ctx=64, precision='exact', **opts) as m:\n"
        "        m.generate('w1 w2')\n"
    )
    env = {**os.environ, "EDGE_CACHE_DIR": str(cache)}
    args = [sys.executable, "-c", code, str(gguf), "1" if plan else ""]
    subprocess.run(args, check=True, env=env, timeout=300, capture_output=True)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    (tmp_path / "mine").mkdir()
    return write_tiny_model(tmp_path / "mine" / "tiny.gguf", TinySpec(arch="llama"))


def test_models_and_cache_list_what_was_built(tmp_path: Path, tiny: Path) -> None:
    cache = tmp_path / "cache"
    build(cache, tiny, plan=True)
    listing = edge_json(cache, "models")
    old_keys = {"name", "arch", "file", "size", "sha256", "licence", "chat_template", "default"}
    old_keys |= {"packages", "pulled", "path", "description"}
    for row in listing["models"]:  # apps and tests read these keys: kept
        assert old_keys <= row.keys() and row["pulled"] is False and row["bytes_on_disk"] == 0
        assert row["built"] == [] and row["built_bytes"] == 0
    (mine,) = listing["other_sources"]
    assert mine["path"] == str(tiny.resolve()) and mine["present"] is True
    assert mine["labels"] == ["ort exact", "plan exact", "compiled (2)"]
    kinds = {b["kind"] for b in mine["built"]}
    assert kinds == {"graphs", "plans", "compiled"}
    assert mine["built_bytes"] == sum(b["bytes"] for b in mine["built"]) > 0
    text = edge(cache, "models").stdout
    (row,) = [line for line in text.splitlines() if line.startswith(str(tiny.resolve()))]
    assert "ort exact, plan exact, compiled (2)" in row and row.endswith(decimal(mine["built_bytes"]))

    summary = edge_json(cache, "cache")
    assert summary["cache_dir"] == str(cache)
    for kind in ("graphs", "plans", "compiled"):
        assert summary["bytes"][kind] == tree_bytes(cache / kind) > 0, kind
    assert summary["bytes"]["models"] == 0 and summary["bytes"]["other"] > 0  # probe and check records
    assert summary["total_bytes"] == tree_bytes(cache)
    assert summary["stale_bytes"] == 0 and all(e["stale"] is None for e in summary["entries"])
    text = edge(cache, "cache").stdout
    assert f"cache: {cache}" in text and "plans" in text and "stale" not in text


def test_rm_of_a_local_gguf_removes_only_what_edge_built(tmp_path: Path, tiny: Path) -> None:
    cache = tmp_path / "cache"
    build(cache, tiny, plan=True)
    other = write_tiny_model(tmp_path / "other.gguf", TinySpec(arch="llama", seed=3))
    build(cache, other)
    before = tiny.read_bytes()
    proc = edge(cache, "rm", str(tiny))
    assert proc.returncode == 0, proc.stderr
    assert tiny.read_bytes() == before  # the user's file is theirs
    lines = proc.stdout.splitlines()
    assert lines[-1].startswith("freed ") and sum(line.startswith("removed ") for line in lines) == 4
    left = edge_json(cache, "models")["other_sources"]
    assert [s["path"] for s in left] == [str(other.resolve())]  # the other file's graph stays
    assert not any((cache / "plans").iterdir()) and not any((cache / "compiled").iterdir())
    again = edge(cache, "rm", str(tiny))
    assert again.returncode == 0 and again.stdout.startswith("nothing to remove for ")


def test_rm_of_an_unknown_name_is_one_line_with_the_catalog() -> None:
    proc = edge(SHARED_CACHE, "rm", "smollm-135m")
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert (
        line.startswith("edge: error: no model named 'smollm-135m'") and "did you mean smollm2-135m?" in line
    )
    assert all(name in line for name in CATALOG)


def _age(path: Path, seconds: float) -> None:
    """What a killed writer leaves: files last touched `seconds` ago."""
    t = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (t, t))


def test_prune_removes_what_nothing_can_use_and_leaves_writes_under_way(tmp_path: Path, tiny: Path) -> None:
    cache = tmp_path / "cache"
    build(cache, tiny)
    gone = write_tiny_model(tmp_path / "gone.gguf", TinySpec(arch="llama", seed=5))
    build(cache, gone, plan=True)
    gone.unlink()  # the user deleted the file: its graph, plan and compile caches can never be used again
    graphs = cache / "graphs"
    sources = {s["path"]: s for s in edge_json(cache, "models")["other_sources"]}
    (current,) = [Path(b["path"]) for b in sources[str(tiny.resolve())]["built"]]
    # what older edges left: a graph of the previous format, one with no format record
    old = graphs / ("0" * 20)
    shutil.copytree(current, old)
    done = json.loads((old / "DONE").read_text())
    (old / "DONE").write_text(json.dumps({**done, "format": GRAPH_FORMAT - 1}))
    unrecorded = graphs / ("1" * 20)
    shutil.copytree(current, unrecorded)
    (unrecorded / "DONE").write_text(json.dumps({"source": done["source"], "files": done["files"]}))
    # a killed build's temporary (two hours old), and one being written now
    killed, writing = graphs / ("2" * 20 + ".k1ll3d"), graphs / ("3" * 20 + ".wr1t3s")
    for t in (killed, writing):
        t.mkdir()
        (t / "model.onnx.data").write_bytes(bytes(1000))
    _age(killed, 7200)
    partial = cache / "models" / "x.gguf.partial"
    partial.parent.mkdir()
    partial.write_bytes(bytes(10))
    _age(partial, 7200)
    record = cache / "devices" / ".probe.json.x1y2z3"  # a JSON record's write killed midway (jsonstore)
    record.parent.mkdir(exist_ok=True)
    record.write_text("{")
    _age(record, 7200)

    before = edge_json(cache, "cache")
    stale = {e["path"] for e in before["entries"] if e["stale"]}
    pruned = edge_json(cache, "cache", "--prune")
    removed = {r["path"] for r in pruned["removed"]}
    assert removed == stale
    want = {str(old), str(unrecorded), str(killed), str(partial), str(record)}
    assert want <= removed and str(current) not in removed
    assert sum(1 for r in pruned["removed"] if "gone.gguf" in r["why"]) == 4  # graph, plan, 2 compile caches
    assert pruned["freed_bytes"] == sum(r["bytes"] for r in pruned["removed"]) == before["stale_bytes"]
    assert [s["path"] for s in pruned["skipped"]] == [str(writing)] and writing.is_dir()
    assert current.is_dir() and not any((cache / "plans").iterdir())
    assert (
        edge(cache, "cache", "--prune").stdout.strip()
        == f"left {writing.relative_to(cache)}: being written (changed in the last hour)\nnothing to prune"
    )
    after = edge_json(cache, "models")["other_sources"]
    assert [s["path"] for s in after] == [str(tiny.resolve())] and after[0]["labels"] == ["ort exact"]


def _private_copy(cache: Path, name: str) -> Path:
    """The catalog model verified in the shared cache, as pulled into `cache` (a hard link where one can be
    made: removing it there leaves the shared file alone), with its verified marker."""
    pull_named_models([name])
    entry = CATALOG[name]
    shared = SHARED_CACHE / "models" / entry.file
    dest = cache / "models" / entry.file
    dest.parent.mkdir(parents=True)
    try:
        os.link(shared, dest)
    except OSError:
        shutil.copy2(shared, dest)
    marker = shared.name + ".verified.json"
    shutil.copy2(shared.with_name(marker), dest.with_name(marker))
    return dest


@pytest.mark.slow
def test_rm_of_a_catalog_model_removes_its_file_and_what_was_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    file = _private_copy(cache, "smollm2-135m")
    entry = CATALOG["smollm2-135m"]
    monkeypatch.setenv("EDGE_CACHE_DIR", str(cache))
    assert model_path(entry) == file and is_verified(entry)
    run = edge(cache, "run", "smollm2-135m", "Hi", "--backend", "ort", "--max-tokens", "1")
    assert run.returncode == 0, run.stderr
    row = next(r for r in edge_json(cache, "models")["models"] if r["name"] == "smollm2-135m")
    assert (
        row["pulled"]
        and row["bytes_on_disk"] == entry.size + file.with_name(file.name + ".verified.json").stat().st_size
    )
    assert row["labels"] == ["ort fast"] and row["built_bytes"] == tree_bytes(cache / "graphs")

    proc = edge(cache, "rm", "smollm2-135m")
    assert proc.returncode == 0, proc.stderr
    assert not file.exists() and not is_verified(entry) and not any((cache / "graphs").iterdir())
    assert (
        f"removed models/{entry.file} ({entry.size / 1e6:.1f} MB): the smollm2-135m model file" in proc.stdout
    )
    assert proc.stdout.splitlines()[-1] == f"freed {decimal(row['bytes_on_disk'] + row['built_bytes'])}"
    assert (SHARED_CACHE / "models" / entry.file).stat().st_size == entry.size  # the shared cache's stays
    again = edge(cache, "rm", "smollm2-135m")
    assert again.returncode == 0 and again.stdout.startswith("nothing to remove for smollm2-135m")
