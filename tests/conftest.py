"""Fixtures shared by the test packages."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.shared_cache import private_cache


@pytest.fixture(scope="module")
def edge_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Graphs, plans and compiled artifacts of one test module go to a private EDGE_CACHE_DIR, never the
    user's cache; catalog models come from the shared one. Removed after the module."""
    with private_cache(tmp_path_factory) as path, pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE_CACHE_DIR", str(path))
        yield path
