"""Whether a decoder's rows really are batch-invariant on this machine.

The staged graph's claim (kvcache/staging.py) rests on kernel behaviour measured on one CPU and one ONNX Runtime
build: MLAS computes a matmul row alike for any row count >= 2, and the int8 MatMulNBits rows alike for any
count. Another instruction set or runtime version may pick other kernels, so the claim is checked by running
the decoder once per (graph, CPU, runtime version): a short prompt, then four tokens one at a time and the
same four in one forward; the rows must be equal bit for bit. The answer is cached (devices/invariance.json in
edge's cache), so a model pays the ~10 forwards once per machine.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Protocol

import numpy as np

from edge.models.store import cache_dir

__all__ = ["rows_invariant"]


class _Forward(Protocol):
    vocab_size: int

    @property
    def position(self) -> int: ...

    def forward(self, tokens: list[int], *, last_only: bool = False) -> np.ndarray: ...

    def reset(self) -> None: ...


def _key(graph: Path, backend: str) -> str:
    from edge.devices.discovery import probe_cpu

    st = graph.stat()
    dist = {"ort": "onnxruntime", "openvino": "openvino"}.get(backend, backend)
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = "?"
    parts = [str(graph.resolve()), str(st.st_size), str(st.st_mtime_ns), backend, version, probe_cpu().model]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _cache_file() -> Path:
    return cache_dir() / "devices" / "invariance.json"


def _load() -> dict[str, bool]:
    try:
        data = json.loads(_cache_file().read_text(encoding="utf-8"))
        return {str(k): bool(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError, TypeError):
        return {}  # missing or corrupt: checked again


def _save(key: str, value: bool) -> None:
    with contextlib.suppress(OSError):  # a read-only cache only costs a re-check next time
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {**_load(), key: value}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".invariance.")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)


def _check(decoder: _Forward) -> bool:
    vocab = decoder.vocab_size
    ids = [3 + (7 + 7919 * i) % max(1, vocab - 3) for i in range(9)]
    try:
        decoder.forward(ids[:5], last_only=True)
        single = np.stack([decoder.forward([t])[-1] for t in ids[5:]])
        decoder.reset()
        decoder.forward(ids[:5], last_only=True)
        batched = decoder.forward(ids[5:])
    finally:
        decoder.reset()
    return bool(np.array_equal(single, batched))


def rows_invariant(decoder: _Forward, graph: Path, backend: str) -> bool:
    """Run (or recall) the check on a fresh decoder; it is reset afterwards. False when it holds tokens (the
    check would need to discard them)."""
    key = _key(graph, backend)
    known = _load().get(key)
    if known is not None:
        return known
    if decoder.position != 0:
        return False
    found = _check(decoder)
    _save(key, found)
    return found
