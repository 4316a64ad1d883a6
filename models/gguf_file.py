"""Reading GGUF model files safely.

The header, metadata and tensor-info sections are parsed here with explicit bounds checks rather than with
`gguf.GGUFReader`, which trusts declared lengths (a 2^63-element array makes it hang or allocate without
bound). Every declared count or length is checked against the bytes left in the file (and against
`GGUFLimits`) before anything proportional to it is allocated, so time and memory stay bounded by the
file's size on any input, and every malformed file ends in `ModelFormatError`.

Layout (little-endian; versions 2 and 3 share it): magic "GGUF", u32 version, u64 n_tensors, u64 n_kv,
n_kv x (string key, u32 type, value), n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type,
u64 offset relative to the data section), padding to `general.alignment`, then the tensor data.
A string is a u64 byte length and that many UTF-8 bytes; an array is u32 item type, u64 count, items.
"""

from __future__ import annotations

import hashlib
import itertools
import mmap
import os
import stat
import struct
import threading
from collections.abc import Container
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from edge.errors import ModelFormatError

__all__ = ["GGUFFile", "GGUFLimits", "TensorInfo", "open_gguf"]


@dataclass(frozen=True)
class GGUFLimits:
    """Safety limits; the defaults are far above any real model (Gemma 3's vocab has 262k strings)."""

    max_metadata_bytes: int = 1 << 30  # whole KV section
    max_kv: int = 1 << 20
    max_tensors: int = 1 << 20
    max_string_bytes: int = 64 << 20  # one string value
    max_name_bytes: int = 64 << 10  # one metadata key or tensor name
    max_array_elements: int = 1 << 24  # one array (each level of a nested one)
    max_array_depth: int = 3  # 1 = a flat array; 2 = an array of arrays; ...
    # Array strings and inner arrays, all keys together: each is a Python object of ~50+ bytes, so this
    # bounds memory where the byte limits alone would allow ~7x the file's size.
    max_array_objects: int = 1 << 24


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
    data_offset: int = 0  # absolute offset of the tensor data section
    _mm: np.memmap | None = field(default=None, init=False, repr=False, compare=False)

    def tensor_bytes(self, name: str) -> np.ndarray:
        """The tensor's raw bytes (uint8, read-only, memory-mapped)."""
        info = self.tensors[name]
        return self._map()[info.offset : info.offset + info.nbytes]

    def tensor_array(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32, numpy shape = reversed GGUF shape (ne[n-1], ..., ne[0])."""
        from gguf.quants import dequantize

        info = self.tensors[name]
        qtype = GGMLQuantizationType(info.ggml_type)
        raw = self.tensor_bytes(name)
        # dequantize works row-wise on the last axis: hand it [rows, bytes per row].
        rows = 1
        for d in info.shape[1:]:
            rows *= d
        plain = _PLAIN_TENSOR_DTYPES.get(info.ggml_type)
        try:
            if plain is not None:  # integer and F64 tensors: gguf-py has no dequantize for these
                out = raw.view(plain).astype(np.float32)
            else:
                out = dequantize(raw.reshape(rows, info.nbytes // rows), qtype)
        except NotImplementedError as e:
            raise ModelFormatError(
                f"{self.path}: tensor {name!r} has type {qtype.name}, which gguf-py cannot dequantize",
                hint="use a model quantized with a common type (F32, F16, BF16, Q8_0, Q4_0, Q4_K, ...)",
            ) from e
        return np.asarray(out, dtype=np.float32).reshape(tuple(reversed(info.shape)))

    def _map(self) -> np.memmap:
        if self._mm is None:
            end = max((t.offset + t.nbytes for t in self.tensors.values()), default=0)
            size = os.stat(self.path).st_size
            # A file shrunk since parsing would SIGBUS on access instead of raising.
            if size < end:
                raise _truncated(self.path, end, size, "tensor data")
            self._mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._mm


# GGUF metadata value types.
_STRING, _ARRAY = 8, 9
_NUMERIC: dict[int, tuple[str, np.dtype[Any]]] = {
    0: ("UINT8", np.dtype("<u1")),
    1: ("INT8", np.dtype("<i1")),
    2: ("UINT16", np.dtype("<u2")),
    3: ("INT16", np.dtype("<i2")),
    4: ("UINT32", np.dtype("<u4")),
    5: ("INT32", np.dtype("<i4")),
    6: ("FLOAT32", np.dtype("<f4")),
    7: ("BOOL", np.dtype("<u1")),
    10: ("UINT64", np.dtype("<u8")),
    11: ("INT64", np.dtype("<i8")),
    12: ("FLOAT64", np.dtype("<f8")),
}
_STRUCT = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<B"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
_PLAIN_TENSOR_DTYPES: dict[int, np.dtype[Any]] = {
    int(GGMLQuantizationType.I8): np.dtype("<i1"),
    int(GGMLQuantizationType.I16): np.dtype("<i2"),
    int(GGMLQuantizationType.I32): np.dtype("<i4"),
    int(GGMLQuantizationType.I64): np.dtype("<i8"),
    int(GGMLQuantizationType.F64): np.dtype("<f8"),
}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_INT64_MAX = (1 << 63) - 1
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset
_MAX_DIMS = 4  # GGML_MAX_DIMS
_DEFAULT_ALIGNMENT = 32
# Types llama.cpp removed keep an enum value but have no usable block layout.
_QUANT_SIZES: dict[int, tuple[int, int]] = {
    int(t): (b, s) for t, (b, s) in GGML_QUANT_SIZES.items() if b > 0 and s > 0
}

# `edge pull NAME --force` below is specialised to the model's name when the file is a catalog model.
_PULL = "`edge pull NAME --force`"
_HINT_CORRUPT = f"the file is corrupt or not a GGUF model; if it came from `edge pull`, run {_PULL}"
_HINT_TRUNCATED = f"the file was cut short (an interrupted download?); run {_PULL} or re-download it"
_HINT_LIMIT = (
    "this exceeds a safety limit of edge's GGUF reader; if the model is genuine, "
    "pass larger limits: open_gguf(path, limits=GGUFLimits(...))"
)
_HINT_CONVERT = "convert the model again with a current llama.cpp (convert_hf_to_gguf.py)"


def _truncated(path: Path, need: int, size: int, what: str) -> ModelFormatError:
    return ModelFormatError(
        f"{path}: file is truncated: {what} needs {need} bytes "
        f"but the file has {size} ({need - size} missing)",
        hint=_HINT_TRUNCATED,
    )


class _Parser:
    """A cursor over the mapped file; `end` is the read bound (file size, or the metadata budget)."""

    def __init__(self, buf: mmap.mmap, path: Path, size: int, limits: GGUFLimits) -> None:
        self.buf = buf
        self.path = path
        self.size = size
        self.limits = limits
        self.pos = 0
        self.end = size
        self.objects_left = limits.max_array_objects

    def fail(self, what: str, at: int, hint: str = _HINT_CORRUPT) -> ModelFormatError:
        return ModelFormatError(f"{self.path}: {what} (at byte {at})", hint=hint)

    def overrun(self, what: str, at: int, need: int) -> ModelFormatError:
        left = self.size - at
        if need <= left:  # fits in the file: only the metadata budget stops it
            return self.fail(
                f"{what} needs {need} bytes, beyond the {self.limits.max_metadata_bytes}-byte metadata limit",
                at,
                _HINT_LIMIT,
            )
        # A length beyond the whole file is more likely corruption than a short download; say both.
        return self.fail(
            f"{what} needs {need} bytes but only {left} are left in the {self.size}-byte file: "
            "it is truncated or corrupt",
            at,
            _HINT_CORRUPT if need > self.size else _HINT_TRUNCATED,
        )

    def take(self, n: int, what: str) -> int:
        """Advance over n bytes and return where they start."""
        at = self.pos
        if n > self.end - at:
            raise self.overrun(what, at, n)
        self.pos = at + n
        return at

    def u32(self, what: str) -> int:
        return int(_U32.unpack_from(self.buf, self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(_U64.unpack_from(self.buf, self.take(8, what))[0])

    def name(self, what: str) -> str:
        """A key or tensor name: bounded by max_name_bytes and required to be valid UTF-8."""
        at = self.pos
        n = self.u64(f"length of {what}")
        if n > self.limits.max_name_bytes:
            raise self.fail(
                f"{what} is {n} bytes long, more than the limit of {self.limits.max_name_bytes}",
                at,
                _HINT_LIMIT if n <= self.end - self.pos else _HINT_CORRUPT,
            )
        start = self.take(n, what)
        try:
            return self.buf[start : start + n].decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8: {self.buf[start : start + n][:64]!r}", at) from None

    def string(self, where: str) -> str:
        at = self.pos
        n = self.u64(f"string length in {where}")
        if n > self.limits.max_string_bytes:
            raise self.fail(
                f"string in {where} is {n} bytes long, more than the limit of {self.limits.max_string_bytes}",
                at,
                _HINT_LIMIT if n <= self.end - self.pos else _HINT_CORRUPT,
            )
        start = self.take(n, f"string in {where}")
        # Values keep invalid UTF-8 byte-exact (s.encode("utf-8", "surrogateescape") gives the bytes back):
        # some vocabularies hold partial byte sequences, and a tokenizer must not lose them.
        return self.buf[start : start + n].decode("utf-8", "surrogateescape")

    def string_array(self, n: int, where: str) -> list[str]:
        # The hot loop of a model load (262k vocab strings for Gemma 3): locals only, one bound check each.
        buf, p, end = self.buf, self.pos, self.end
        max_len = self.limits.max_string_bytes
        unpack = _U64.unpack_from
        out: list[str] = []
        append = out.append
        for i in range(n):
            if end - p < 8:
                self.pos = p
                raise self.overrun(f"length of element {i} of {where}", p, 8)
            (ln,) = unpack(buf, p)
            p += 8
            if ln > max_len or ln > end - p:
                self.pos = p
                if ln > max_len:
                    raise self.fail(
                        f"element {i} of {where} is a {ln}-byte string, more than the limit of {max_len}",
                        p - 8,
                        _HINT_LIMIT if ln <= end - p else _HINT_CORRUPT,
                    )
                raise self.overrun(f"element {i} of {where}", p - 8, ln)
            q = p + ln
            append(buf[p:q].decode("utf-8", "surrogateescape"))
            p = q
        self.pos = p
        return out

    def value(self, vtype: int, where: str, at: int) -> Any:
        if vtype == _STRING:
            return self.string(where)
        if vtype == _ARRAY:
            return self.array(where, 1)
        st = _STRUCT.get(vtype)
        if st is None:
            raise self.fail(f"{where} has unknown value type {vtype}", at)
        (v,) = st.unpack_from(self.buf, self.take(st.size, where))
        return bool(v) if vtype == 7 else v

    def count_objects(self, n: int, where: str, at: int) -> None:
        if n > self.objects_left:
            raise self.fail(
                f"{where} brings the number of strings and arrays inside metadata arrays past the limit "
                f"of {self.limits.max_array_objects}",
                at,
                _HINT_LIMIT,
            )
        self.objects_left -= n

    def array(self, where: str, depth: int) -> Any:
        lim = self.limits
        at = self.pos
        itype = self.u32(f"array item type of {where}")
        n = self.u64(f"array length of {where}")
        if n > lim.max_array_elements:
            fits = n <= self.end - self.pos
            raise self.fail(
                f"{where} is an array of {n} elements, more than the limit of {lim.max_array_elements}",
                at,
                _HINT_LIMIT if fits else _HINT_CORRUPT,
            )
        if itype in _NUMERIC:
            dt = _NUMERIC[itype][1]
            start = self.take(n * dt.itemsize, f"array data of {where} ({n} x {_NUMERIC[itype][0]})")
            arr = np.frombuffer(self.buf, dtype=dt, count=n, offset=start).copy()
            return arr != 0 if itype == 7 else arr
        if itype == _STRING:
            if n * 8 > self.end - self.pos:  # each string takes at least its 8-byte length
                raise self.overrun(f"array of {n} strings in {where}", self.pos, n * 8)
            self.count_objects(n, where, at)
            return self.string_array(n, where)
        if itype == _ARRAY:
            if depth >= lim.max_array_depth:
                raise self.fail(f"{where} nests arrays deeper than the limit of {lim.max_array_depth}", at)
            if n * 12 > self.end - self.pos:  # each inner array takes at least type + count
                raise self.overrun(f"array of {n} arrays in {where}", self.pos, n * 12)
            self.count_objects(n, where, at)
            return [self.array(where, depth + 1) for _ in range(n)]
        raise self.fail(f"{where} is an array of unknown item type {itype}", at)


def open_gguf(path: str | os.PathLike[str], *, limits: GGUFLimits | None = None) -> GGUFFile:
    """Parse a GGUF file's header, metadata and tensor index; raise ModelFormatError on any defect.

    Tensor data is not read here; `tensor_bytes` maps it on demand. A missing or unreadable file raises
    the usual OSError.
    """
    p = Path(path)
    try:
        parsed = _PARSED.open(p, limits or GGUFLimits())
    except ModelFormatError as e:
        e.hint = _name_the_model(p, e.hint)
        raise
    # a copy per caller: one may add to its metadata; the parsed values themselves are shared
    return replace(parsed, path=p, metadata=dict(parsed.metadata), tensors=dict(parsed.tensors))


class _ParsedFiles:
    """The last few parses in this process. A CLI run opens its model in several places (the request,
    --backend auto's choice, the load) and a 262k-string vocabulary takes ~0.2 s to parse. A parse is reused
    only for the same file size and limits and a byte-identical header (everything the parse read: its SHA-256
    is checked again, ~100x cheaper than parsing), so a file rewritten in place is parsed again however close
    its timestamps; a defective file raises and is never kept."""

    KEEP = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, GGUFLimits], tuple[int, bytes, GGUFFile]] = {}

    @staticmethod
    def _digest_of(p: Path, size: int, n: int) -> bytes | None:
        with open(p, "rb") as f:
            if os.fstat(f.fileno()).st_size != size:
                return None
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _header_digest(buf, n)

    def open(self, p: Path, limits: GGUFLimits) -> GGUFFile:
        st = os.stat(p)
        if not stat.S_ISREG(st.st_mode):
            return _open(p, limits)[0]  # which refuses it (a FIFO would block the digest's read too)
        key = (str(p.resolve()), limits)
        with self._lock:
            known = self._entries.get(key)
        if known is not None and known[0] == st.st_size:
            try:
                same = self._digest_of(p, st.st_size, known[2].data_offset) == known[1]
            except (OSError, ValueError):
                same = False
            if same:
                return known[2]
        parsed, size, digest = _open(p, limits)
        with self._lock:
            self._entries.pop(key, None)
            self._entries[key] = (size, digest, parsed)
            while len(self._entries) > self.KEEP:
                self._entries.pop(next(iter(self._entries)))
        return parsed


_PARSED = _ParsedFiles()


def _header_digest(buf: mmap.mmap, n: int) -> bytes:
    """SHA-256 of the first n bytes (a parse's header: metadata and tensor index), hashed in place."""
    with memoryview(buf) as view:
        return hashlib.sha256(view[:n]).digest()


def _open(p: Path, limits: GGUFLimits) -> tuple[GGUFFile, int, bytes]:
    """The parse, the file size it saw and the SHA-256 of the header bytes it read (one mapping for all)."""
    if not stat.S_ISREG(os.stat(p).st_mode):  # a FIFO or device would block or never end
        raise ModelFormatError(f"{p}: not a regular file", hint="pass a .gguf model file")
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 24:
            head = f.read(4)
            if len(head) == 4 and head != b"GGUF":
                raise ModelFormatError(
                    f"{p}: not a GGUF file (starts with {head!r}, expected b'GGUF')", hint=_HINT_CORRUPT
                )
            raise _truncated(p, 24, size, "the GGUF header")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            parsed = _parse(_Parser(buf, p, size, limits))
            return parsed, size, _header_digest(buf, parsed.data_offset)


def _name_the_model(path: Path, hint: str | None) -> str | None:
    from edge.models.catalog import CATALOG  # same layer; only needed on the error path

    names = [e.name for e in CATALOG.values() if e.file == path.name]
    return hint.replace("NAME", names[0]) if hint and names else hint


def _parse(r: _Parser) -> GGUFFile:
    """Header, metadata, tensor index, then the data ranges, each checked against the file and the limits."""
    version, n_tensors, n_kv = _header(r)
    metadata, alignment = _metadata(r, n_kv)
    tensors: dict[str, TensorInfo] = {}
    for i in range(n_tensors):
        info = _tensor_info(r, i, alignment, tensors)
        tensors[info.name] = info
    data_offset = -(-r.pos // alignment) * alignment
    _check_data_ranges(r, tensors, data_offset, alignment)
    absolute = {
        name: TensorInfo(t.name, t.shape, t.ggml_type, data_offset + t.offset, t.nbytes)
        for name, t in tensors.items()
    }
    return GGUFFile(r.path, version, alignment, metadata, absolute, data_offset)


def _header(r: _Parser) -> tuple[int, int, int]:
    """Magic, version, tensor and metadata counts: (version, n_tensors, n_kv)."""
    lim, buf = r.limits, r.buf
    magic = buf[0:4]
    if magic != b"GGUF":
        raise r.fail(f"not a GGUF file (starts with {magic!r}, expected b'GGUF')", 0)
    r.pos = 4
    version = r.u32("version")
    if version & 0xFFFF == 0 and int.from_bytes(buf[4:8], "big") in (1, 2, 3):
        raise r.fail("big-endian GGUF is not supported", 4, "use a little-endian (standard) GGUF file")
    if version == 1:
        raise r.fail("GGUF version 1 is obsolete and not supported", 4, _HINT_CONVERT)
    if version not in (2, 3):
        raise r.fail(f"unsupported GGUF version {version} (supported: 2, 3)", 4, _HINT_CONVERT)
    n_tensors = r.u64("tensor count")
    n_kv = r.u64("metadata count")
    # Counts the file cannot hold are corruption; plausible ones may still exceed a limit.
    if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_INFO_BYTES > r.size - r.pos:
        raise r.fail(
            f"declares {n_kv} metadata pairs and {n_tensors} tensors, "
            f"which cannot fit in a {r.size}-byte file",
            8,
        )
    if n_tensors > lim.max_tensors:
        raise r.fail(
            f"declares {n_tensors} tensors, more than the limit of {lim.max_tensors}", 8, _HINT_LIMIT
        )
    if n_kv > lim.max_kv:
        raise r.fail(f"declares {n_kv} metadata pairs, more than the limit of {lim.max_kv}", 16, _HINT_LIMIT)
    return version, n_tensors, n_kv


def _metadata(r: _Parser, n_kv: int) -> tuple[dict[str, Any], int]:
    """The metadata pairs, read against the smaller of the file end and the metadata budget, and the
    alignment (general.alignment, else the default)."""
    r.end = min(r.size, r.pos + r.limits.max_metadata_bytes)
    metadata: dict[str, Any] = {}
    alignment = _DEFAULT_ALIGNMENT
    for i in range(n_kv):
        at = r.pos
        key = r.name(f"metadata key #{i}")
        if key in metadata:
            raise r.fail(f"duplicate metadata key {key!r}", at)
        tat = r.pos
        vtype = r.u32(f"value type of metadata key {key!r}")
        metadata[key] = r.value(vtype, f"metadata key {key!r}", tat)
        if key == "general.alignment":
            if vtype != 4:
                raise r.fail(f"general.alignment has value type {vtype}, expected UINT32 (4)", tat)
            alignment = metadata[key]
            if alignment == 0 or alignment & (alignment - 1):
                raise r.fail(f"general.alignment is {alignment}, not a power of two", tat)
    r.end = r.size
    return metadata, alignment


def _tensor_info(r: _Parser, i: int, alignment: int, seen: Container[str]) -> TensorInfo:
    """Tensor #i of the index: name (not one of `seen`), shape, type and data offset (relative to the data
    section), checked."""
    at = r.pos
    name = r.name(f"name of tensor #{i}")
    if name in seen:
        raise r.fail(f"duplicate tensor name {name!r}", at)
    what = f"tensor {name!r}"
    dat = r.pos
    n_dims = r.u32(f"dimension count of {what}")
    if not 1 <= n_dims <= _MAX_DIMS:
        raise r.fail(f"{what} has {n_dims} dimensions (expected 1 to {_MAX_DIMS})", dat)
    dims = struct.unpack_from(f"<{n_dims}Q", r.buf, r.take(8 * n_dims, f"dimensions of {what}"))
    count = 1
    for d in dims:
        if d == 0 or d > _INT64_MAX:
            raise r.fail(f"{what} has an invalid dimension {d} in shape {list(dims)}", dat)
        count *= d
        if count > _INT64_MAX:
            raise r.fail(f"{what} has shape {list(dims)}, whose element count overflows int64", dat)
    tat = r.pos
    ggml_type = r.u32(f"type of {what}")
    if ggml_type not in _QUANT_SIZES:
        raise r.fail(f"{what} has unknown or unsupported GGML type {ggml_type}", tat)
    block, type_size = _QUANT_SIZES[ggml_type]
    tname = GGMLQuantizationType(ggml_type).name
    if dims[0] % block:
        raise r.fail(f"{what} has ne[0] = {dims[0]}, not a multiple of the {tname} block size {block}", dat)
    nbytes = count // block * type_size
    if nbytes > _INT64_MAX:
        raise r.fail(f"{what} would take {nbytes} bytes, which overflows int64", dat)
    oat = r.pos
    rel = r.u64(f"data offset of {what}")
    if rel % alignment:
        raise r.fail(f"{what} has data offset {rel}, not a multiple of the alignment {alignment}", oat)
    return TensorInfo(name, tuple(int(d) for d in dims), ggml_type, rel, nbytes)


def _check_data_ranges(r: _Parser, tensors: dict[str, TensorInfo], data_offset: int, alignment: int) -> None:
    """Data ranges, sorted by offset: each ends before the next begins, the last within the file."""
    by_offset = sorted(tensors.values(), key=lambda t: t.offset)
    for prev, cur in itertools.pairwise(by_offset):
        if prev.offset + prev.nbytes > cur.offset:
            raise r.fail(
                f"data of tensor {prev.name!r} (relative offset {prev.offset}, {prev.nbytes} bytes) overlaps "
                f"tensor {cur.name!r} (relative offset {cur.offset})",
                data_offset + cur.offset,
            )
    if not by_offset:
        return
    last = by_offset[-1]
    need = data_offset + last.offset + last.nbytes
    if need > r.size:
        # Writers lay tensors out back to back (llama.cpp requires it); data ending within that dense
        # layout but past the file's end is a cut-short file, anything further out is corruption.
        dense = sum(-(-t.nbytes // alignment) * alignment for t in by_offset)
        if last.offset + last.nbytes > dense:
            raise r.fail(
                f"data of tensor {last.name!r} ends at byte {need}, beyond the end of the "
                f"{r.size}-byte file and beyond the {dense} bytes its tensors need",
                data_offset + last.offset,
            )
        raise _truncated(r.path, need, r.size, f"the data of tensor {last.name!r}")
