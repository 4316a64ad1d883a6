"""Reading GGUF model files.

TEMPORARY STUB over gguf.GGUFReader (trusted files only); being replaced by a bounds-checked parser.
The public API below is the contract.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: ne[0] (fastest varying) first
    ggml_type: int  # a gguf.GGMLQuantizationType value
    offset: int  # absolute byte offset of the data in the file
    nbytes: int


@dataclass
class GGUFFile:
    path: Path
    version: int
    alignment: int
    metadata: dict[str, Any]  # str | int | float | bool | list[str] | 1-D np.ndarray | list (nested arrays)
    tensors: dict[str, TensorInfo]  # in file order

    def tensor_bytes(self, name: str) -> np.ndarray:
        info = self.tensors[name]
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=info.offset, shape=(info.nbytes,))


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    import gguf

    reader = gguf.GGUFReader(path)
    meta: dict[str, Any] = {}
    for f in reader.fields.values():
        if f.name.startswith("GGUF."):
            continue
        t = f.types[0]
        if t == gguf.GGUFValueType.ARRAY:
            sub = f.types[1] if len(f.types) > 1 else None
            if sub == gguf.GGUFValueType.STRING:
                meta[f.name] = [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
            else:
                meta[f.name] = np.array([f.parts[i][0] for i in f.data])
        elif t == gguf.GGUFValueType.STRING:
            meta[f.name] = bytes(f.parts[f.data[0]]).decode("utf-8", "replace")
        else:
            v = f.parts[f.data[0]][0]
            meta[f.name] = bool(v) if t == gguf.GGUFValueType.BOOL else v.item()
    tensors = {
        t.name: TensorInfo(t.name, tuple(int(x) for x in t.shape), int(t.tensor_type), int(t.data_offset), int(t.n_bytes))
        for t in reader.tensors
    }
    return GGUFFile(Path(path), 3, 32, meta, tensors)
