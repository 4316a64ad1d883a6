"""The small JSON files edge keeps in its cache (measured speeds, file hashes, invariance checks, ONNX graphs
already checked): read as {} when absent or damaged, written whole and atomically."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["read_json", "write_json"]


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # absent or damaged: nothing recorded (the next record rewrites it whole)
    return data if isinstance(data, dict) else {}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1)
        os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
