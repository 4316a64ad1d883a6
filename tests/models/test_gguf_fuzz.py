"""Mutation fuzzing of the tiny GGUF: every mutant must parse cleanly or raise ModelFormatError, fast.

Deterministic for CI: derandomized, no example database.
"""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge.errors import ModelFormatError
from edge.models.gguf_file import open_gguf
from tests.gguf_factory import write_tiny_gguf

FUZZ = settings(
    max_examples=1500,
    deadline=1000,  # ms per example; a parse of this ~2 KB file takes well under 10 ms
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    print_blob=False,
)

# Values that break naive readers when written over a length, count, dimension or offset field.
HUGE_U64 = [2**64 - 1, 2**63, 2**63 - 1, 2**62, 2**40, 2**32, 2**32 - 1, 2**31, 65536, 4096, 0, 1]
HUGE_U32 = [2**32 - 1, 2**31, 65536, 4096, 13, 12, 9, 8, 5, 0]


def _field_offsets(path: Path) -> tuple[bytes, list[int], list[int]]:
    """The tiny file and the offsets of its u64 fields (lengths, counts, dims, offsets) and u32 fields (types,
    n_dims), located with GGUFReader on the valid file."""
    reader = gguf.GGUFReader(path)
    u64: list[int] = []
    u32: list[int] = []
    records = [*reader.fields.values(), *(t.field for t in reader.tensors)]
    for field in records:
        pos = field.offset
        for part in field.parts:
            if part.dtype == np.uint64:
                u64.append(pos)
            elif part.dtype == np.uint32:
                u32.append(pos)
            pos += int(part.nbytes)
    return path.read_bytes(), sorted(set(u64)), sorted(set(u32))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, list[int], list[int]]:
    return _field_offsets(write_tiny_gguf(tmp_path_factory.mktemp("fuzz") / "tiny.gguf"))


def check_outcome(path: Path) -> None:
    """A mutant either fails with ModelFormatError or yields an index whose data is really in the file."""
    try:
        g = open_gguf(path)
    except ModelFormatError as e:
        assert e.hint and str(path) in e.message
        return
    size = path.stat().st_size
    for name, info in g.tensors.items():
        assert g.data_offset <= info.offset and info.offset + info.nbytes <= size
        assert g.tensor_bytes(name).size == info.nbytes
        assert g.tensor_array(name).dtype == np.float32


# One edit: (kind, position (taken modulo the length), argument).
edits = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(0, 7)),
    st.tuples(st.just("byte"), st.integers(0, 1 << 16), st.integers(0, 255)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("delete"), st.integers(0, 1 << 16), st.integers(1, 64)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 16), st.just(0)),
    st.tuples(st.just("u64"), st.integers(0, 1 << 16), st.sampled_from(HUGE_U64) | st.integers(0, 2**64 - 1)),
    st.tuples(st.just("u32"), st.integers(0, 1 << 16), st.sampled_from(HUGE_U32) | st.integers(0, 2**32 - 1)),
)


def mutate(raw: bytes, u64: list[int], u32: list[int], ops: list[tuple[str, int, object]]) -> bytes:
    data = bytearray(raw)
    for kind, where, arg in ops:
        n = max(len(data), 1)
        pos = where % n
        if kind == "flip" and data:
            data[pos] ^= 1 << int(arg)  # type: ignore[call-overload]
        elif kind == "byte" and data:
            data[pos] = int(arg)  # type: ignore[call-overload]
        elif kind == "insert":
            data[pos:pos] = arg  # type: ignore[assignment]
        elif kind == "delete":
            del data[pos : pos + int(arg)]  # type: ignore[call-overload]
        elif kind == "truncate":
            del data[pos:]
        elif kind == "u64":  # over a real u64 field of the original layout (shifted if bytes moved)
            at = u64[where % len(u64)]
            data[at : at + 8] = struct.pack("<Q", arg)
        elif kind == "u32":
            at = u32[where % len(u32)]
            data[at : at + 4] = struct.pack("<I", arg)
    return bytes(data)


@FUZZ
@given(ops=st.lists(edits, min_size=1, max_size=4))
def test_mutants_parse_or_raise_model_format_error(
    ops: list[tuple[str, int, object]], tiny: tuple[bytes, list[int], list[int]], tmp_path: Path
) -> None:
    raw, u64, u32 = tiny
    path = tmp_path / "mutant.gguf"
    path.write_bytes(mutate(raw, u64, u32, ops))
    check_outcome(path)


@FUZZ
@given(fields=st.lists(st.tuples(st.integers(0, 1 << 16), st.sampled_from(HUGE_U64)), min_size=1, max_size=3))
def test_huge_length_fields(
    fields: list[tuple[int, int]], tiny: tuple[bytes, list[int], list[int]], tmp_path: Path
) -> None:
    raw, u64, u32 = tiny
    path = tmp_path / "huge.gguf"
    path.write_bytes(mutate(raw, u64, u32, [("u64", w, v) for w, v in fields]))
    check_outcome(path)
