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
from importlib import metadata
from pathlib import Path

import numpy as np

from edge.devices.base import Decoder
from edge.models.jsonstore import read_json, write_json
from edge.models.store import cache_dir

__all__ = ["rows_invariant"]


def _key(graph: Path, backend: str) -> str:
    from edge.devices.cpu import probe_cpu

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


def _check(decoder: Decoder) -> bool:
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


def rows_invariant(decoder: Decoder, graph: Path, backend: str) -> bool:
    """Run (or recall) the check on a fresh decoder; it is reset afterwards. False when it holds tokens (the
    check would need to discard them)."""
    key = _key(graph, backend)
    known = read_json(_cache_file()).get(key)
    if isinstance(known, bool):
        return known
    if decoder.position != 0:
        return False
    found = _check(decoder)
    with contextlib.suppress(OSError):  # a read-only cache only costs a re-check next time
        write_json(_cache_file(), {**read_json(_cache_file()), key: found})
    return found
