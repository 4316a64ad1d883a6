"""Hostile and broken GGUF files: each must end in ModelFormatError, and nothing else, within a second."""

from __future__ import annotations

import os
import re
import struct
import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import pytest

from edge.errors import ModelFormatError
from edge.models.gguf_file import GGUFLimits, open_gguf
from tests.gguf_factory import (
    TINY_METADATA,
    TINY_TENSORS,
    craft_gguf,
    pack_kv,
    pack_string,
    pack_tensor_info,
    write_tiny_gguf,
)

STRING, ARRAY, U8, U32, U64, F32_VALUE = 8, 9, 0, 4, 10, 6
F32, Q8_0 = 0, 8
MAX_SECONDS = 1.0


def header(n_tensors: int, n_kv: int, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def w_info(
    name: str | bytes = "w", dims: tuple[int, ...] = (4,), ggml_type: int = F32, offset: int = 0
) -> bytes:
    return pack_tensor_info(name, dims, ggml_type, offset)


def nested(levels: int) -> bytes:
    """An array value nested `levels` deep around one u8."""
    payload = struct.pack("<IQ", U8, 1) + b"\x01"
    for _ in range(levels - 1):
        payload = struct.pack("<IQ", ARRAY, 1) + payload
    return payload


def alignment_kv(vtype: int, payload: bytes) -> bytes:
    return pack_kv("general.alignment", vtype, payload)


F32x4 = b"\0" * 16  # data of the default one-tensor file


@dataclass(frozen=True)
class Case:
    data: bytes
    match: str  # regex the error message must contain: proves the intended rule fired
    limits: GGUFLimits | None = None


CASES: dict[str, Case] = {
    "empty-file": Case(b"", "truncated"),
    "three-bytes": Case(b"GGU", "truncated"),
    "bad-magic": Case(b"GGML" + craft_gguf()[4:], "not a GGUF file"),
    "bad-magic-short-file": Case(b"\x7fELF\x02\x01", "not a GGUF file"),
    "header-cut-in-counts": Case(header(0, 0)[:20], "truncated"),
    "big-endian": Case(b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian"),
    "version-1": Case(craft_gguf(version=1), "version 1"),
    "version-4": Case(craft_gguf(version=4), "unsupported GGUF version 4"),
    "kv-count-2^63": Case(craft_gguf(n_kv=2**63), "cannot fit"),
    "tensor-count-2^63": Case(craft_gguf(n_tensors=2**63), "cannot fit"),
    "counts-cannot-fit-in-file": Case(craft_gguf(n_kv=1000, n_tensors=1000), "cannot fit"),
    # The file that makes gguf 0.19's reader hang: one key, an array declaring 2^63 elements.
    "array-2^63-elements": Case(
        header(0, 1) + pack_kv("a", ARRAY, struct.pack("<IQ", U8, 2**63)), "2^63|elements"
    ),
    "string-array-2^63-elements": Case(
        header(0, 1) + pack_kv("a", ARRAY, struct.pack("<IQ", STRING, 2**63)), "elements"
    ),
    "array-longer-than-file": Case(
        craft_gguf([pack_kv("a", ARRAY, struct.pack("<IQ", U32, 1 << 20) + b"\0" * 64)]), "only .* left"
    ),
    "nested-arrays-longer-than-file": Case(
        craft_gguf([pack_kv("a", ARRAY, struct.pack("<IQ", ARRAY, 1 << 20))]), "arrays"
    ),
    "key-length-2^64-1": Case(header(0, 1) + struct.pack("<Q", 2**64 - 1) + b"a" * 16, "metadata key #0"),
    "string-value-length-2^62": Case(
        craft_gguf([pack_kv("s", STRING, struct.pack("<Q", 2**62) + b"abc")]), "string in metadata key 's'"
    ),
    "string-element-length-2^63": Case(
        craft_gguf(
            [
                pack_kv(
                    "s", ARRAY, struct.pack("<IQ", STRING, 2) + pack_string("ok") + struct.pack("<Q", 2**63)
                )
            ]
        ),
        "element 1 of metadata key 's'",
    ),
    "unknown-value-type": Case(craft_gguf([pack_kv("x", 13, b"\0" * 8)]), "unknown value type 13"),
    "unknown-value-type-2^32-1": Case(craft_gguf([pack_kv("x", 2**32 - 1, b"\0" * 8)]), "unknown value type"),
    "unknown-array-item-type": Case(
        craft_gguf([pack_kv("x", ARRAY, struct.pack("<IQ", 99, 1) + b"\0" * 8)]), "unknown item type 99"
    ),
    "arrays-nested-4-deep": Case(craft_gguf([pack_kv("x", ARRAY, nested(4))]), "deeper than"),
    "arrays-nested-10000-deep": Case(craft_gguf([pack_kv("x", ARRAY, nested(10_000))]), "deeper than"),
    "duplicate-key": Case(
        craft_gguf([pack_kv("k", U32, b"\1\0\0\0"), pack_kv("k", U32, b"\2\0\0\0")]),
        "duplicate metadata key 'k'",
    ),
    "non-utf8-key": Case(craft_gguf([pack_kv(b"bad\xff\xfe", U32, b"\0" * 4)]), "not valid UTF-8"),
    "non-utf8-tensor-name": Case(craft_gguf(infos=[w_info(b"w\xc3")], data=F32x4), "not valid UTF-8"),
    "alignment-not-power-of-two": Case(
        craft_gguf([alignment_kv(U32, struct.pack("<I", 48))], [w_info()], F32x4), "not a power of two"
    ),
    "alignment-zero": Case(
        craft_gguf([alignment_kv(U32, b"\0" * 4)], [w_info()], F32x4), "not a power of two"
    ),
    "alignment-is-a-string": Case(
        craft_gguf([alignment_kv(STRING, pack_string("32"))], [w_info()], F32x4), "expected UINT32"
    ),
    "alignment-is-u64": Case(
        craft_gguf([alignment_kv(U64, struct.pack("<Q", 32))], [w_info()], F32x4), "expected UINT32"
    ),
    "ggml-type-unknown": Case(craft_gguf(infos=[w_info(ggml_type=9999)], data=F32x4), "GGML type 9999"),
    "ggml-type-removed-q4_2": Case(craft_gguf(infos=[w_info(ggml_type=4)], data=F32x4), "GGML type 4"),
    "n-dims-zero": Case(craft_gguf(infos=[w_info(dims=())], data=F32x4), "0 dimensions"),
    "n-dims-five": Case(craft_gguf(infos=[w_info(dims=(1, 1, 1, 1, 4))], data=F32x4), "5 dimensions"),
    "n-dims-2^32-1": Case(
        craft_gguf(infos=[pack_string("w") + struct.pack("<I", 2**32 - 1) + b"\0" * 40], data=F32x4),
        "4294967295 dimensions",
    ),
    "dim-zero": Case(craft_gguf(infos=[w_info(dims=(4, 0))], data=F32x4), "invalid dimension 0"),
    "dim-negative": Case(craft_gguf(infos=[w_info(dims=(4, 2**63))], data=F32x4), "invalid dimension"),
    "dims-product-overflows-int64": Case(
        craft_gguf(infos=[w_info(dims=(2**32, 2**32))], data=F32x4), "element count overflows"
    ),
    "byte-size-overflows-int64": Case(
        craft_gguf(infos=[w_info(dims=(2**62,))], data=F32x4), "bytes, which overflows"
    ),
    "ne0-not-multiple-of-block": Case(
        craft_gguf(infos=[w_info(dims=(33, 1), ggml_type=Q8_0)], data=b"\0" * 64),
        "not a multiple of the Q8_0 block",
    ),
    "duplicate-tensor-name": Case(
        craft_gguf(infos=[w_info(), w_info(offset=32)], data=b"\0" * 48), "duplicate tensor name 'w'"
    ),
    "tensor-offset-unaligned": Case(
        craft_gguf(infos=[w_info(offset=4)], data=b"\0" * 32), "not a multiple of the"
    ),
    "tensors-overlap": Case(
        craft_gguf(infos=[w_info("a", dims=(16,)), w_info("b", offset=32)], data=b"\0" * 96), "overlaps"
    ),
    "tensor-offset-beyond-file": Case(
        craft_gguf(infos=[w_info(offset=2**40)], data=F32x4), "beyond the end of the 80-byte file"
    ),
    "tensor-data-truncated": Case(craft_gguf(infos=[w_info()], data=F32x4[:10]), "truncated.*6 missing"),
    "tensor-info-cut-in-dims": Case(
        header(1, 0) + w_info(dims=(4, 1, 1, 1))[:-20], "dimensions of tensor 'w'"
    ),
    "metadata-over-limit": Case(
        craft_gguf([pack_kv("s", STRING, pack_string("x" * 200))]),
        "metadata limit",
        GGUFLimits(max_metadata_bytes=100),
    ),
    "string-over-limit": Case(
        craft_gguf([pack_kv("s", STRING, pack_string("x" * 20))]),
        "limit of 10",
        GGUFLimits(max_string_bytes=10),
    ),
    "string-element-over-limit": Case(
        craft_gguf([pack_kv("s", ARRAY, struct.pack("<IQ", STRING, 1) + pack_string("x" * 20))]),
        "limit of 10",
        GGUFLimits(max_string_bytes=10),
    ),
    "array-over-limit": Case(
        craft_gguf([pack_kv("a", ARRAY, struct.pack("<IQ", U8, 5) + b"\0" * 5)]),
        "limit of 4",
        GGUFLimits(max_array_elements=4),
    ),
    "array-objects-over-limit": Case(
        craft_gguf([pack_kv(k, ARRAY, struct.pack("<IQ", STRING, 3) + pack_string("") * 3) for k in "ab"]),
        "metadata key 'b' brings .* past the limit of 5",
        GGUFLimits(max_array_objects=5),
    ),
    "kv-count-over-limit": Case(
        craft_gguf([pack_kv("a", U8, b"\0"), pack_kv("b", U8, b"\0")]), "limit of 1", GGUFLimits(max_kv=1)
    ),
    "tensor-count-over-limit": Case(
        craft_gguf(infos=[w_info("a"), w_info("b", offset=32)], data=b"\0" * 48),
        "limit of 1",
        GGUFLimits(max_tensors=1),
    ),
    "name-over-limit": Case(
        craft_gguf([pack_kv("k" * 20, U8, b"\0")]), "limit of 8", GGUFLimits(max_name_bytes=8)
    ),
}


def assert_rejected(path: Path, match: str, limits: GGUFLimits | None = None) -> ModelFormatError:
    start = time.perf_counter()
    with pytest.raises(ModelFormatError) as excinfo:
        open_gguf(path, limits=limits)
    elapsed = time.perf_counter() - start
    assert elapsed < MAX_SECONDS, f"took {elapsed:.2f} s"
    err = excinfo.value
    assert str(path) in err.message, "the message must name the file"
    assert err.hint, "every rejection tells the user what to do"
    assert re.search(match, err.message), err.message
    return err


@pytest.mark.parametrize("kind", list(CASES))
def test_hostile_file_is_rejected(kind: str, tmp_path: Path) -> None:
    case = CASES[kind]
    path = tmp_path / f"{kind}.gguf"
    path.write_bytes(case.data)
    assert_rejected(path, case.match, case.limits)


def test_the_2_pow_63_array_file_is_tiny() -> None:
    # Reference: a 49-byte file is enough to hang gguf.GGUFReader; it must not need a big file to reject.
    assert len(CASES["array-2^63-elements"].data) == 49


def test_arrays_nested_at_the_depth_limit_parse(tmp_path: Path) -> None:
    path = tmp_path / "n.gguf"
    path.write_bytes(craft_gguf([pack_kv("x", ARRAY, nested(3))]))
    assert open_gguf(path).metadata["x"][0][0].tolist() == [1]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_is_rejected_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    assert_rejected(fifo, "not a regular file")


def test_directory_is_rejected(tmp_path: Path) -> None:
    assert_rejected(tmp_path, "not a regular file")


# --- truncation of the valid tiny file at every section boundary -------------------------------------------

TRUNCATIONS: list[tuple[str, str, str]] = [("header", str(n), "") for n in (4, 8, 16, 23)]
TRUNCATIONS += [("kv", key, where) for key in TINY_METADATA for where in ("key-length", "last-byte")]
TRUNCATIONS += [
    ("tensor-info", name, where) for name in TINY_TENSORS for where in ("name-length", "last-byte")
]
TRUNCATIONS += [("padding", "", where) for where in ("none", "partial")]
TRUNCATIONS += [
    ("data", name, where) for name in TINY_TENSORS for where in ("none", "first-byte", "all-but-one")
]


@pytest.fixture(scope="module")
def tiny_layout(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, dict[tuple[str, str, str], int]]:
    """The tiny file's bytes and, for each truncation id, the length to cut it to (from GGUFReader)."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    reader = gguf.GGUFReader(path)
    cuts: dict[tuple[str, str, str], int] = {("header", str(n), ""): n for n in (4, 8, 16, 23)}
    for key, field in reader.fields.items():
        if not key.startswith("GGUF."):
            end = field.offset + sum(int(p.nbytes) for p in field.parts)
            cuts["kv", key, "key-length"] = field.offset + 3
            cuts["kv", key, "last-byte"] = end - 1
    infos_end = 0
    for t in reader.tensors:
        end = t.field.offset + sum(int(p.nbytes) for p in t.field.parts)
        cuts["tensor-info", t.name, "name-length"] = t.field.offset + 3
        cuts["tensor-info", t.name, "last-byte"] = end - 1
        infos_end = max(infos_end, end)
    assert reader.data_offset - infos_end >= 2, "the tiny file needs padding bytes to cut into"
    cuts["padding", "", "none"] = infos_end
    cuts["padding", "", "partial"] = infos_end + 1
    for t in reader.tensors:
        cuts["data", t.name, "none"] = t.data_offset
        cuts["data", t.name, "first-byte"] = t.data_offset + 1
        cuts["data", t.name, "all-but-one"] = t.data_offset + t.n_bytes - 1
    return path.read_bytes(), cuts


@pytest.mark.parametrize(
    ("section", "name", "where"), [pytest.param(*t, id="-".join(filter(None, t))) for t in TRUNCATIONS]
)
def test_truncated_tiny_file_is_rejected(
    section: str,
    name: str,
    where: str,
    tiny_layout: tuple[bytes, dict[tuple[str, str, str], int]],
    tmp_path: Path,
) -> None:
    raw, cuts = tiny_layout
    path = tmp_path / "cut.gguf"
    path.write_bytes(raw[: cuts[section, name, where]])
    # Data cuts must be reported as truncation, with the expected and present sizes.
    match = r"truncated: .* needs \d+ bytes but the file has \d+" if section in ("padding", "data") else ""
    assert_rejected(path, match)


def test_tiny_file_without_trailing_padding_is_valid(
    tiny_layout: tuple[bytes, dict[tuple[str, str, str], int]], tmp_path: Path
) -> None:
    raw, _ = tiny_layout
    g = open_gguf(write_tiny_gguf(tmp_path / "full.gguf"))
    end = max(t.offset + t.nbytes for t in g.tensors.values())
    assert end < len(raw)
    (tmp_path / "short.gguf").write_bytes(raw[:end])
    assert open_gguf(tmp_path / "short.gguf").tensors == g.tensors


def test_hint_names_the_catalog_model(
    tiny_layout: tuple[bytes, dict[tuple[str, str, str], int]], tmp_path: Path
) -> None:
    from edge.models.catalog import CATALOG

    raw, _ = tiny_layout
    entry = CATALOG["gemma3-270m"]
    path = tmp_path / entry.file
    path.write_bytes(raw[: len(raw) - 40])
    err = assert_rejected(path, "truncated")
    assert f"edge pull {entry.name} --force" in (err.hint or "")
