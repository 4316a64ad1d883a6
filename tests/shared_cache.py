"""One model cache per test run: private caches of graphs and plans share its catalog model files."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edge.models.catalog import CATALOG
from edge.models.resolve import resolve_model
from edge.models.store import cache_dir

# The cache this test run started with (CI: an empty folder under the checkout, see .ci/run). Catalog models
# are pulled into it at most once per run, whatever private caches the tests switch to.
SHARED_CACHE = cache_dir()


# Shared with every private cache: the catalog models, and llama.cpp's known-answer verdicts
# (devices/native_check.py: keyed by build and CPU, so one check serves the whole run)
SHARED_FOLDERS = ("models", "native-check")


def share_models(private: Path) -> Path:
    """Make `private` (a private EDGE_CACHE_DIR) use the shared cache's model folder: catalog models verified
    there are used as they are, and one pulled while the private cache is set lands there too; llama.cpp's
    known-answer verdicts are shared the same way. Graphs, plans and compiled artifacts stay private.
    Returns `private`."""
    private.mkdir(parents=True, exist_ok=True)
    for name in SHARED_FOLDERS:
        shared = SHARED_CACHE / name
        shared.mkdir(parents=True, exist_ok=True)
        link = private / name
        if not link.exists():
            os.symlink(shared, link, target_is_directory=True)
    return private


@contextmanager
def private_cache(factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private cache sharing the catalog models (`share_models`), removed when the block ends: graphs of a
    1.5b model are GBs, and a run that kept every module's would fill a CI disk (it did: ENOSPC mid-run)."""
    path = share_models(factory.mktemp("edge_cache"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)  # the model links are unlinked, not followed


def pull_named_models(args: Iterable[str]) -> None:
    """Pull the catalog models among a CLI's `args` (into the shared cache) before a test runs it: on an empty
    cache (a fresh machine, CI) the CLI's own pull would add its progress lines to the stderr the test reads."""
    for arg in args:
        if arg in CATALOG:
            resolve_model(arg)
