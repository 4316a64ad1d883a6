"""Valid GGUF files parse exactly: metadata, tensor index, tensor bytes and dequantized values."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize

from edge.errors import ModelFormatError
from edge.models.gguf_file import GGUFFile, GGUFLimits, open_gguf
from tests.gguf_factory import (
    TINY_METADATA,
    TINY_TENSORS,
    craft_gguf,
    pack_kv,
    pack_string,
    pack_tensor_info,
    tiny_tensor_data,
    write_tiny_gguf,
)


def assert_same_value(got: Any, want: Any, where: str) -> None:
    """Equal values of the same Python / numpy type (1 == True == 1.0 would hide type bugs)."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), where
        assert got.ndim == 1 and got.dtype == want.dtype, f"{where}: {got.dtype} != {want.dtype}"
        assert np.array_equal(got, want), where
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same_value(g, w, f"{where}[{i}]")
    else:
        assert type(got) is type(want) and got == want, f"{where}: {got!r} != {want!r}"


def assert_agrees_with_reader(g: GGUFFile, path: Path, skip: tuple[str, ...] = ()) -> None:
    """Metadata and tensor index equal what gguf.GGUFReader (trusted input only) reads from `path`."""
    reader = gguf.GGUFReader(path)
    fields = {k: f for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(fields) == list(g.metadata)
    for key, f in fields.items():
        if key in skip:
            continue
        mine, main = g.metadata[key], f.types[0]
        if main == GGUFValueType.ARRAY and f.types[-1] != GGUFValueType.STRING:
            want = np.concatenate([f.parts[i] for i in f.data])
            assert mine.dtype == want.dtype and np.array_equal(mine, want), key
        else:
            assert mine == f.contents(), key
            if main == GGUFValueType.BOOL:
                assert type(mine) is bool, key
    assert list(g.tensors) == [t.name for t in reader.tensors]
    for t in reader.tensors:
        info = g.tensors[t.name]
        assert info.shape == tuple(int(d) for d in t.shape), t.name
        assert (info.ggml_type, info.offset, info.nbytes) == (int(t.tensor_type), t.data_offset, t.n_bytes)
    assert g.data_offset == reader.data_offset
    assert g.alignment == reader.alignment


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_metadata_round_trips_exactly(tiny: Path) -> None:
    g = open_gguf(tiny)
    assert (g.path, g.version, g.alignment) == (tiny, 3, 32)
    assert list(g.metadata) == list(TINY_METADATA)
    for key, want in TINY_METADATA.items():
        assert_same_value(g.metadata[key], want, key)


def test_tensor_index_bytes_and_values(tiny: Path) -> None:
    g = open_gguf(tiny)
    assert list(g.tensors) == list(TINY_TENSORS)
    for name, (qtype, values) in TINY_TENSORS.items():
        info = g.tensors[name]
        written = tiny_tensor_data(name)
        assert info.shape == tuple(reversed(values.shape))
        assert info.ggml_type == qtype
        assert info.offset % g.alignment == 0 and info.offset >= g.data_offset
        assert info.nbytes == written.nbytes
        assert g.tensor_bytes(name).tobytes() == written.tobytes()
        got = g.tensor_array(name)
        assert got.dtype == np.float32 and got.shape == values.shape
        want = values if qtype == GGMLQuantizationType.F32 else dequantize(written, qtype)
        np.testing.assert_array_equal(got, want.reshape(values.shape))
        # and close to the source values, so the shape / row order is right, not just the bytes
        tol = {GGMLQuantizationType.F32: 0, GGMLQuantizationType.F16: 1e-3}.get(qtype, 0.3)
        np.testing.assert_allclose(got, values, atol=tol)


def test_agrees_with_gguf_reader_on_tiny_file(tiny: Path) -> None:
    # GGUFReader flattens nested arrays, so that one key is checked by the round-trip test only.
    assert_agrees_with_reader(open_gguf(tiny), tiny, skip=("test.nested",))


def test_custom_alignment(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "a.gguf", alignment=128)
    g = open_gguf(path)
    assert g.alignment == 128 and g.metadata["general.alignment"] == 128
    assert g.data_offset % 128 == 0
    assert all(t.offset % 128 == 0 for t in g.tensors.values())
    assert_agrees_with_reader(g, path, skip=("test.nested",))
    for name in TINY_TENSORS:
        assert g.tensor_bytes(name).tobytes() == tiny_tensor_data(name).tobytes()


def test_version_2_is_accepted(tiny: Path, tmp_path: Path) -> None:
    raw = bytearray(tiny.read_bytes())
    raw[4:8] = struct.pack("<I", 2)
    (tmp_path / "v2.gguf").write_bytes(raw)
    g = open_gguf(tmp_path / "v2.gguf")
    assert g.version == 2 and g.tensors == open_gguf(tiny).tensors


def test_hand_made_edge_cases(tmp_path: Path) -> None:
    """Empty arrays, no tensors, and invalid UTF-8 in a value (kept byte-exact via surrogateescape)."""
    kvs = [
        pack_kv("empty.strings", 9, struct.pack("<IQ", 8, 0)),
        pack_kv("empty.floats", 9, struct.pack("<IQ", 6, 0)),
        pack_kv("empty.nested", 9, struct.pack("<IQ", 9, 0)),
        pack_kv("raw", 8, pack_string(b"ok\xff\xfe")),
        pack_kv("raw.list", 9, struct.pack("<IQ", 8, 1) + pack_string(b"\xc3")),
    ]
    path = tmp_path / "edge.gguf"
    path.write_bytes(craft_gguf(kvs))
    g = open_gguf(path)
    assert g.metadata["empty.strings"] == [] and g.metadata["empty.nested"] == []
    assert g.metadata["empty.floats"].dtype == np.float32 and g.metadata["empty.floats"].size == 0
    assert g.metadata["raw"].encode("utf-8", "surrogateescape") == b"ok\xff\xfe"
    assert g.metadata["raw.list"][0].encode("utf-8", "surrogateescape") == b"\xc3"
    assert g.tensors == {}


def test_integer_tensor_and_unpadded_last_tensor(tmp_path: Path) -> None:
    # The data section may end right after the last tensor (writers pad it, but need not).
    data = np.arange(-3, 3, dtype=np.int16)
    path = tmp_path / "i16.gguf"
    path.write_bytes(craft_gguf(infos=[pack_tensor_info("t", [3, 2], 25, 0)], data=data.tobytes()))
    g = open_gguf(path)
    np.testing.assert_array_equal(g.tensor_array("t"), data.reshape(2, 3).astype(np.float32))


def test_limits_are_frozen_and_applied(tiny: Path) -> None:
    lim = GGUFLimits(max_tensors=3)
    with pytest.raises(AttributeError):
        lim.max_tensors = 10  # type: ignore[misc]
    with pytest.raises(ModelFormatError, match="limit"):
        open_gguf(tiny, limits=lim)
    assert len(open_gguf(tiny, limits=GGUFLimits(max_tensors=4)).tensors) == 4


CATALOG_FILES = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b"]


@pytest.mark.slow
@pytest.mark.parametrize("name", CATALOG_FILES)
def test_catalog_file_agrees_with_gguf_reader(name: str) -> None:
    from edge.models.catalog import CATALOG
    from edge.models.resolve import resolve_model
    from edge.models.store import model_path

    path = model_path(CATALOG[name])
    if not path.is_file():
        path = resolve_model(name)
    start = time.perf_counter()
    g = open_gguf(path)
    elapsed = time.perf_counter() - start
    # Measured ~0.1 s; the bound leaves room for a loaded CI machine.
    assert elapsed < 2.0, f"parsing {path.name} took {elapsed:.2f} s"
    assert_agrees_with_reader(g, path)
    first = next(iter(g.tensors))
    assert g.tensor_array(first).dtype == np.float32


def test_a_file_opened_again_is_parsed_again_only_when_it_changed(tmp_path: Path) -> None:
    """open_gguf keeps its last parses (a CLI run opens a model three times); a reuse needs the same size and a
    byte-identical header, so an in-place rewrite is seen even with the same size, inode and timestamps."""
    import os

    path = write_tiny_gguf(tmp_path / "m.gguf")
    a, b = open_gguf(path), open_gguf(path)
    assert a is not b and a.metadata == b.metadata and a.tensors == b.tensors
    a.metadata["test.u8"] = 7
    assert open_gguf(path).metadata["test.u8"] == 255  # copies, not the kept parse
    st = os.stat(path)
    data = bytearray(path.read_bytes())
    key = b"general.architecture"
    at = data.index(key) + len(key) + 4 + 8  # the key, its value type, the string's length
    value = bytes(data[at : at + 5])
    data[at : at + 5] = value[::-1]  # same size, another architecture name
    with open(path, "r+b") as f:  # in place: the same inode
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_ino == st.st_ino and os.stat(path).st_mtime_ns == st.st_mtime_ns
    assert open_gguf(path).metadata["general.architecture"] == value[::-1].decode()
    data[4:8] = struct.pack("<I", 1)  # a version the reader refuses, still the same size
    path.write_bytes(data)
    with pytest.raises(ModelFormatError, match="version 1"):
        open_gguf(path)
