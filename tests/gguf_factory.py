"""Tiny valid GGUF files for tests, written with `gguf.GGUFWriter` (the reference writer).

    from tests.gguf_factory import write_tiny_gguf, TINY_METADATA, TINY_TENSORS
    path = write_tiny_gguf(tmp_path / "tiny.gguf")

The file holds every metadata value type (scalars, a string, string / numeric / bool arrays, a nested
array) and four tensors of types F32, F16, Q8_0 and Q4_0. `TINY_METADATA` is what a reader must return for
its metadata (keys in file order, values typed as `models.gguf_file` returns them); `TINY_TENSORS` maps each
tensor name to its GGML type and the float32 values it was made from (numpy shape, i.e. reversed GGUF
shape); quantized tensors hold `gguf.quants.quantize` of those values.

For files GGUFWriter will not write (empty arrays, hostile layouts), `craft_gguf` assembles raw bytes from
`pack_kv` / `pack_tensor_info` records.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.quants import quantize

TINY_ARCH = "llama"

# key -> (value type, value as written, array item type or None, value as read back)
_KV: list[tuple[str, GGUFValueType, Any, GGUFValueType | None, Any]] = [
    ("general.architecture", GGUFValueType.STRING, TINY_ARCH, None, TINY_ARCH),
    ("test.u8", GGUFValueType.UINT8, 255, None, 255),
    ("test.i8", GGUFValueType.INT8, -128, None, -128),
    ("test.u16", GGUFValueType.UINT16, 65535, None, 65535),
    ("test.i16", GGUFValueType.INT16, -32768, None, -32768),
    ("test.u32", GGUFValueType.UINT32, 4_000_000_000, None, 4_000_000_000),
    ("test.i32", GGUFValueType.INT32, -2_000_000_000, None, -2_000_000_000),
    ("test.u64", GGUFValueType.UINT64, 2**64 - 1, None, 2**64 - 1),
    ("test.i64", GGUFValueType.INT64, -(2**63), None, -(2**63)),
    ("test.f32", GGUFValueType.FLOAT32, 0.5, None, 0.5),
    ("test.f64", GGUFValueType.FLOAT64, 1e-300, None, 1e-300),
    ("test.bool_true", GGUFValueType.BOOL, True, None, True),
    ("test.bool_false", GGUFValueType.BOOL, False, None, False),
    ("test.string", GGUFValueType.STRING, "héllo, ✓ wörld", None, "héllo, ✓ wörld"),
    ("test.empty_string", GGUFValueType.STRING, "", None, ""),
    (
        "tokenizer.ggml.tokens",
        GGUFValueType.ARRAY,
        ["<s>", "</s>", "a", "", "▁b", "日本"],
        GGUFValueType.STRING,
        ["<s>", "</s>", "a", "", "▁b", "日本"],
    ),
    ("test.arr_u8", GGUFValueType.ARRAY, [0, 1, 255], GGUFValueType.UINT8, np.array([0, 1, 255], np.uint8)),
    ("test.arr_i16", GGUFValueType.ARRAY, [-5, 7], GGUFValueType.INT16, np.array([-5, 7], np.int16)),
    (
        "test.arr_u32",
        GGUFValueType.ARRAY,
        [1, 2**32 - 1],
        GGUFValueType.UINT32,
        np.array([1, 2**32 - 1], np.uint32),
    ),
    ("test.arr_i32", GGUFValueType.ARRAY, [-1, 0, 3], GGUFValueType.INT32, np.array([-1, 0, 3], np.int32)),
    ("test.arr_i64", GGUFValueType.ARRAY, [-(2**40)], GGUFValueType.INT64, np.array([-(2**40)], np.int64)),
    ("test.arr_u64", GGUFValueType.ARRAY, [2**63], GGUFValueType.UINT64, np.array([2**63], np.uint64)),
    (
        "test.arr_f32",
        GGUFValueType.ARRAY,
        [0.25, -1.5, 3.0],
        GGUFValueType.FLOAT32,
        np.array([0.25, -1.5, 3.0], np.float32),
    ),
    (
        "test.arr_f64",
        GGUFValueType.ARRAY,
        [1e100, -2.0],
        GGUFValueType.FLOAT64,
        np.array([1e100, -2.0], np.float64),
    ),
    (
        "test.arr_bool",
        GGUFValueType.ARRAY,
        [True, False, True],
        GGUFValueType.BOOL,
        np.array([True, False, True], np.bool_),
    ),
    (
        "test.nested",
        GGUFValueType.ARRAY,
        [[1, 2], [3], ["x", "y"]],
        None,  # inner arrays: INT32, INT32, STRING (GGUFWriter infers them)
        [np.array([1, 2], np.int32), np.array([3], np.int32), ["x", "y"]],
    ),
]

TINY_METADATA: dict[str, Any] = {key: read for key, _t, _v, _s, read in _KV}


def _values(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# name -> (GGML type, float32 source values in numpy order); ne[0] (the last numpy axis) of Q8_0 / Q4_0 is a
# multiple of their 32-element block.
TINY_TENSORS: dict[str, tuple[GGMLQuantizationType, np.ndarray]] = {
    "token_embd.weight": (GGMLQuantizationType.F32, _values((2, 3, 4), 1)),
    "output_norm.weight": (GGMLQuantizationType.F16, _values((5,), 2)),
    "blk.0.attn_q.weight": (GGMLQuantizationType.Q8_0, _values((3, 64), 3)),
    "blk.0.ffn_up.weight": (GGMLQuantizationType.Q4_0, _values((2, 32), 4)),
}


def tiny_tensor_data(name: str) -> np.ndarray:
    """The array handed to GGUFWriter for `name`: the values cast or quantized to the tensor's type."""
    qtype, values = TINY_TENSORS[name]
    return quantize(values, qtype)


def write_tiny_gguf(path: str | os.PathLike[str], *, alignment: int | None = None) -> Path:
    """Write the tiny GGUF to `path` (a file path) and return it; `alignment` sets `general.alignment`.

    With `alignment`, the key `general.alignment` (UINT32) is added after the others in TINY_METADATA.
    """
    path = Path(path)
    w = GGUFWriter(path, TINY_ARCH)
    for key, vtype, value, sub_type, _ in _KV:
        if key != "general.architecture":  # GGUFWriter adds it itself, first
            w.add_key_value(key, value, vtype, sub_type)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    for name, (qtype, _) in TINY_TENSORS.items():
        data = tiny_tensor_data(name)
        w.add_tensor(name, data, raw_dtype=qtype if data.dtype == np.uint8 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# Hand-made GGUF bytes, for files GGUFWriter refuses to write (empty arrays, hostile layouts).
def pack_string(s: str | bytes) -> bytes:
    """A GGUF string: u64 byte length, then the bytes."""
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def pack_kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    """One metadata pair; `payload` is the value's encoding after its u32 type."""
    return pack_string(key) + struct.pack("<I", vtype) + payload


def pack_tensor_info(name: str | bytes, dims: Sequence[int], ggml_type: int, offset: int) -> bytes:
    """One tensor-info record; dims in GGUF order (ne[0] first), offset relative to the data section."""
    return (
        pack_string(name)
        + struct.pack("<I", len(dims))
        + struct.pack(f"<{len(dims)}Q", *dims)
        + struct.pack("<IQ", ggml_type, offset)
    )


def craft_gguf(
    kvs: Sequence[bytes] = (),
    infos: Sequence[bytes] = (),
    data: bytes = b"",
    *,
    alignment: int = 32,
    version: int = 3,
    n_kv: int | None = None,
    n_tensors: int | None = None,
) -> bytes:
    """A GGUF file image: header (counts default to len(kvs), len(infos)), records, padding, data."""
    head = b"GGUF" + struct.pack(
        "<IQQ", version, len(infos) if n_tensors is None else n_tensors, len(kvs) if n_kv is None else n_kv
    )
    body = head + b"".join(kvs) + b"".join(infos)
    return body + b"\0" * (-len(body) % alignment) + data
