"""A checked safetensors reader: the header's every entry is proven against the file before a byte of a
tensor is read (bounded header, known dtypes, offsets inside the data, sizes equal to dtype x shape, tensors
that neither overlap nor leave holes), so a hostile file is a ModelFormatError, as a hostile GGUF is
(models/gguf_file.py). Tensors are read through a read-only memory map.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge.errors import ModelFormatError

__all__ = ["DTYPES", "FLOAT_DTYPES", "SafetensorsFile", "TensorEntry", "open_safetensors"]

MAX_HEADER = 16 << 20  # the header of a model with thousands of tensors is well under 1 MiB
MAX_RANK = 8
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),  # widened to f32 by `array`
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})  # what a weight may be stored as


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets within the data section (after the header)
    end: int


@dataclass(frozen=True, eq=False)
class SafetensorsFile:
    path: Path
    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    data_offset: int  # where the data section starts in the file

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` as a float32 array (a copy; BF16 and F16 widened exactly)."""
        t = self.tensors.get(name)
        if t is None:
            raise ModelFormatError(f"{self.path.name}: no tensor {name!r}")
        if t.end == t.begin:
            return np.zeros(t.shape, np.float32)
        raw = np.memmap(self.path, np.uint8, "r", self.data_offset + t.begin, (t.end - t.begin,))
        values = raw.view(DTYPES[t.dtype])
        if t.dtype == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        return np.array(values, dtype=np.float32).reshape(t.shape)


def open_safetensors(path: str | Path) -> SafetensorsFile:
    """Read and check `path`'s header; raises ModelFormatError naming the first thing wrong."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ModelFormatError(f"{path.name}: too short for a safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n < 2 or n > MAX_HEADER or n > size - 8:
            raise ModelFormatError(
                f"{path.name}: header length {n} is not within the file ({size} bytes) and {MAX_HEADER}"
            )
        text = fh.read(n)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ModelFormatError(f"{path.name}: the header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ModelFormatError(f"{path.name}: the header is not a JSON object")
    metadata = _metadata(path, header.pop("__metadata__", {}))
    data_size = size - 8 - n
    tensors = {name: _entry(path, name, value, data_size) for name, value in header.items()}
    _check_layout(path, list(tensors.values()), data_size)
    return SafetensorsFile(path, tensors, metadata, 8 + n)


def _metadata(path: Path, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ModelFormatError(f"{path.name}: __metadata__ must map names to strings")
    return dict(value)


def _entry(path: Path, name: str, value: Any, data_size: int) -> TensorEntry:
    where = f"{path.name}: tensor {name!r}"
    if not isinstance(value, dict) or set(value) != {"dtype", "shape", "data_offsets"}:
        raise ModelFormatError(f"{where}: an entry needs exactly dtype, shape and data_offsets")
    dtype, shape, offsets = value["dtype"], value["shape"], value["data_offsets"]
    if dtype not in DTYPES:
        raise ModelFormatError(f"{where}: unknown dtype {dtype!r}", hint=f"known: {', '.join(DTYPES)}")
    if not _ints(shape) or len(shape) > MAX_RANK:
        raise ModelFormatError(f"{where}: shape {shape!r} is not a list of at most {MAX_RANK} sizes")
    if not _ints(offsets) or len(offsets) != 2 or not 0 <= offsets[0] <= offsets[1] <= data_size:
        raise ModelFormatError(f"{where}: data_offsets {offsets!r} lie outside the data ({data_size} bytes)")
    expected = math.prod(shape) * DTYPES[dtype].itemsize
    if offsets[1] - offsets[0] != expected:
        raise ModelFormatError(
            f"{where}: {offsets[1] - offsets[0]} bytes for {dtype} {shape}, which needs {expected}"
        )
    return TensorEntry(name, dtype, tuple(shape), offsets[0], offsets[1])


def _ints(value: Any) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def _check_layout(path: Path, entries: list[TensorEntry], data_size: int) -> None:
    """Tensors tile the data section: sorted by offset, each starts where the previous ended."""
    at = 0
    for t in sorted(entries, key=lambda e: (e.begin, e.end)):
        if t.begin < at:
            raise ModelFormatError(f"{path.name}: tensor {t.name!r} overlaps the one before it")
        if t.begin > at:
            raise ModelFormatError(
                f"{path.name}: {t.begin - at} bytes before tensor {t.name!r} belong to none"
            )
        at = t.end
    if at != data_size:
        raise ModelFormatError(f"{path.name}: {data_size - at} bytes after the last tensor belong to none")
