"""Model files for the reliability tests: tiny models (tests/tiny_models.py) rewritten with lying metadata,
and the byte offsets of every section of a GGUF file (to cut it there)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

DROP = object()  # an override value that removes the key


def field_value(field: Any) -> tuple[Any, GGUFValueType, GGUFValueType | None]:
    vtype = GGUFValueType(field.types[0])
    if vtype == GGUFValueType.ARRAY:
        sub = GGUFValueType(field.types[1])
        if sub == GGUFValueType.STRING:
            return [bytes(field.parts[i]) for i in field.data], vtype, sub
        return [field.parts[i][0].item() for i in field.data], vtype, sub
    if vtype == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]), vtype, None
    return field.parts[field.data[0]][0].item(), vtype, None


def rewrite_gguf(
    src: Path,
    dst: Path,
    overrides: Mapping[str, Any] = {},
    *,
    tensor_shapes: Mapping[str, tuple[int, ...]] = {},
    extra_tensors: Mapping[str, np.ndarray] = {},
) -> Path:
    """Copy a GGUF with some metadata replaced: a value (typed like the original, or with an explicit
    (value, GGUFValueType[, item type]) tuple), or DROP; a key the file lacks is added (a tuple). `tensor_shapes`
    relabels tensors (numpy order) with another shape of the same byte size; `extra_tensors` are added."""
    reader = GGUFReader(src)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    w = GGUFWriter(dst, arch)
    seen = set()
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        seen.add(key)
        value, vtype, sub = field_value(field)
        if key in overrides:
            new = overrides[key]
            if new is DROP:
                continue
            if isinstance(new, tuple):
                value, vtype, *rest = new
                sub = rest[0] if rest else None
            else:
                value = new
        w.add_key_value(key, value, vtype, sub)
    for key, new in overrides.items():
        if key not in seen and new is not DROP:
            value, vtype, *rest = new
            w.add_key_value(key, value, vtype, rest[0] if rest else None)
    for t in reader.tensors:
        data = np.asarray(t.data)
        qtype = gguf.GGMLQuantizationType(t.tensor_type)
        shape = tensor_shapes.get(t.name)
        if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(t.name, data.reshape(shape) if shape else data.copy())
        else:
            raw_shape = shape or tuple(int(d) for d in reversed(t.shape))
            w.add_tensor(t.name, data.copy(), raw_shape=raw_shape, raw_dtype=qtype)
    for name, arr in extra_tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def section_cuts(path: Path) -> dict[str, int]:
    """Lengths to cut a valid GGUF to: inside and at the end of every header field, metadata pair and tensor
    record, in the alignment padding, and inside every tensor's data (located with gguf.GGUFReader)."""
    reader = GGUFReader(path)
    cuts: dict[str, int] = {f"header-{n}": n for n in (0, 3, 4, 7, 8, 15, 16, 23)}
    records = [(f"kv-{k}", f) for k, f in reader.fields.items() if not k.startswith("GGUF.")]
    records += [(f"tensor-info-{t.name}", t.field) for t in reader.tensors]
    infos_end = 0
    for name, field in records:
        end = field.offset + sum(int(p.nbytes) for p in field.parts)
        cuts[f"{name}-start"] = field.offset
        cuts[f"{name}-in-length"] = field.offset + 3
        cuts[f"{name}-last-byte"] = end - 1
        infos_end = max(infos_end, end)
    if reader.data_offset > infos_end:
        cuts["padding"] = infos_end + (reader.data_offset - infos_end) // 2
    for t in reader.tensors:
        cuts[f"data-{t.name}-start"] = int(t.data_offset)
        cuts[f"data-{t.name}-last-byte"] = int(t.data_offset + t.n_bytes - 1)
    return cuts
