"""Private caches (edge_cache, graph_cache, ...) reuse the run's verified catalog models instead of pulling
them again: on CI's empty cache each model is downloaded once per run, not once per test module."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge.models.catalog import CATALOG
from edge.models.store import cache_dir, is_verified, model_path
from tests.shared_cache import SHARED_CACHE


def test_a_private_cache_uses_the_shared_model_files(
    edge_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cache_dir() == edge_cache != SHARED_CACHE
    private = {e.name: model_path(e) for e in CATALOG.values() if is_verified(e)}
    with monkeypatch.context() as mp:
        mp.setenv("EDGE_CACHE_DIR", str(SHARED_CACHE))
        shared = {e.name: model_path(e) for e in CATALOG.values() if is_verified(e)}
    assert private.keys() == shared.keys()  # verified here exactly when verified there
    for name, path in private.items():
        assert path.samefile(shared[name])
    # a model pulled while the private cache is set lands in the shared one (the same folder)
    assert (edge_cache / "models").samefile(SHARED_CACHE / "models")
    # so is llama.cpp's known-answer verdict (devices/native_check.py): one check for the whole run
    assert (edge_cache / "native-check").samefile(SHARED_CACHE / "native-check")
    assert not (edge_cache / "graphs").exists() or not (edge_cache / "graphs").samefile(
        SHARED_CACHE / "graphs"
    )
