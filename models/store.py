"""Where models live on disk: the cache folder, a catalog model's file and its verified marker (models.resolve
turns a MODEL argument into a file, pulling it when needed)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

import platformdirs

from edge.models.catalog import CatalogEntry

# What a pull reports (models.pull): (done_bytes, total_bytes, phase); phase is "download" while the file
# arrives, then "verified" once, when its SHA-256 matched the catalog's.
PullProgress: TypeAlias = Callable[[int, int, str], None]


def cache_dir() -> Path:
    """Models are cache: re-creatable from PyPI. EDGE_CACHE_DIR overrides the platform default."""
    root = os.environ.get("EDGE_CACHE_DIR")
    return Path(root) if root else Path(platformdirs.user_cache_dir("edge", appauthor=False))


def model_path(entry: CatalogEntry) -> Path:
    return cache_dir() / "models" / entry.file


def file_identity(path: Path) -> dict[str, str | int]:
    """What a derived cache entry (graph, plan, compile cache) records of the file it was built from, the same
    facts its key holds: `edge rm` and `edge cache --prune` find a file's entries, or those of a file since
    removed or changed, without rebuilding keys (devices/cache.py)."""
    st = path.stat()
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def write_verified_marker(path: Path, sha256: str) -> None:
    st = path.stat()
    _marker(path).write_text(json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))


def is_verified(entry: CatalogEntry) -> bool:
    """True when the assembled file is present and unchanged since its SHA-256 was checked."""
    path = model_path(entry)
    try:
        mark = json.loads(_marker(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return (
        isinstance(mark, dict)
        and mark.get("sha256") == entry.sha256
        and mark.get("size") == st.st_size
        and mark.get("mtime_ns") == st.st_mtime_ns
    )
