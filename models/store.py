"""Where models live on disk, and turning a MODEL argument (catalog name or path) into a file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

import platformdirs

from edge.errors import ModelNotFoundError
from edge.models.catalog import CATALOG, CatalogEntry, near_names

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


def resolve_model(model: str, *, pull_missing: bool = True, on_progress: PullProgress | None = None) -> Path:
    """A catalog name (pulled on first use), a path to a local .gguf file, or an artifact directory.

    `on_progress(done_bytes, total_bytes, phase)` sees a pull; None shows it on stderr."""
    entry = CATALOG.get(model)
    if entry is not None:
        if is_verified(entry):
            return model_path(entry)
        if not pull_missing:
            raise ModelNotFoundError(f"model {model!r} is not pulled yet", hint=f"run: edge pull {model}")
        from edge.models.pull import pull  # a network step, imported only when needed

        return pull(entry, on_progress=on_progress)
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if (path / "manifest.json").is_file():  # an artifact directory written by `edge convert`
        return path
    if path.exists():
        raise ModelNotFoundError(f"{model!r} is not a regular file", hint="pass a .gguf file")
    names = ", ".join(CATALOG)
    near = near_names(model)
    meant = f"; did you mean {' or '.join(near)}?" if near else ""
    raise ModelNotFoundError(
        f"no model named {model!r} and no such file{meant}",
        hint=f"use a catalog name ({names}) or a path to a .gguf",
    )
