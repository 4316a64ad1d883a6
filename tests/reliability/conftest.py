"""Shared fixtures of the reliability suite: a tiny real model, a private graph cache, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shared_cache import share_models
from tests.tiny_models import TinySpec, write_tiny_model

EDGE = [sys.executable, "-m", "edge.cli"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama model (2 layers, 320-token SentencePiece vocabulary) llama.cpp loads."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", TinySpec(arch="llama"))


@pytest.fixture
def graph_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Graphs go to a private EDGE_CACHE_DIR, never the user's cache (catalog models: the shared one's)."""
    path = share_models(tmp_path / "edge-cache")
    monkeypatch.setenv("EDGE_CACHE_DIR", str(path))
    yield path


def cli(
    *args: str, stdin: bytes | None = None, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[bytes]:
    base = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    return subprocess.run(
        [*EDGE, *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
        env={**base, **(env or {})},
        cwd=ROOT,
    )


def error_lines(err: str) -> list[str]:
    """stderr less the progress of a graph build (models/build_progress.py: "building ...", "built ...",
    which a first load prints before whatever goes wrong later)."""
    return [x for x in err.strip().splitlines() if not x.startswith(("building ", "building: ", "built "))]


def assert_one_line_error(proc: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    """A CLI failure: exit 1 (not a signal), exactly one `edge: error:` line on stderr (beside a build's
    progress), no traceback."""
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, (proc.returncode, err)
    lines = error_lines(err)
    assert len(lines) == 1 and lines[0].startswith("edge: error:"), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
