"""Dropping a mapped weight file's pages: the bytes never change, only residency does (devices/mapped.py), and
OpenVINO's runner holds none of its source weights after the inference that repacked them."""

from __future__ import annotations

import mmap
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edge.devices.mapped import (
    _read_only_shared,
    drop_mapped_pages,
    dropping_mapped_pages,
    mapped_resident,
    mapped_sources,
)
from edge.devices.registry import DecoderOptions, open_decoder, runnable_backends
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise and /proc: Linux only")

SIZE = 4 << 20


def _file(path: Path) -> bytes:
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return data


def test_drop_unmaps_pages_and_keeps_the_bytes(tmp_path: Path) -> None:
    data = _file(tmp_path / "w.bin")
    sources = mapped_sources([tmp_path / "w.bin"])
    with open(tmp_path / "w.bin", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m[:] == data  # every page read: resident
        assert mapped_resident(sources) >= SIZE * 3 // 4
        assert drop_mapped_pages(sources) >= SIZE
        assert mapped_resident(sources) < SIZE // 4
        assert m[:] == data  # read again from the file


def test_reclaiming_while_the_mapping_may_change_keeps_the_bytes(tmp_path: Path) -> None:
    """MADV_PAGEOUT, used while a runtime may unmap its sources: it reclaims the clean file pages and would
    never zero an anonymous mapping that took over the range."""
    data = _file(tmp_path / "w.bin")
    sources = mapped_sources([tmp_path / "w.bin"])
    with open(tmp_path / "w.bin", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert m[:] == data
        if drop_mapped_pages(sources, unmapping=True) == 0:
            pytest.skip("this kernel has no MADV_PAGEOUT (Linux < 5.4): the reclaiming drop is a no-op")
        assert mapped_resident(sources) < SIZE // 4
        assert m[:] == data


def test_only_the_named_read_only_shared_files(tmp_path: Path) -> None:
    _file(tmp_path / "a.bin")
    other = _file(tmp_path / "b.bin")
    with (
        open(tmp_path / "a.bin", "rb") as fa,
        open(tmp_path / "b.bin", "rb") as fb,
        mmap.mmap(fa.fileno(), 0, access=mmap.ACCESS_COPY) as private,
        mmap.mmap(fb.fileno(), 0, access=mmap.ACCESS_READ) as unnamed,
    ):
        private[0] = (private[0] + 1) % 256  # a copy-on-write page: dropping it would lose the write
        written = private[0]
        assert unnamed[:] == other
        before = mapped_resident(mapped_sources([tmp_path / "b.bin"]))
        drop_mapped_pages(mapped_sources([tmp_path / "a.bin"]))
        assert private[0] == written
        assert mapped_resident(mapped_sources([tmp_path / "b.bin"])) == before


def test_dropping_while_a_block_runs(tmp_path: Path) -> None:
    data = _file(tmp_path / "w.bin")
    sources = mapped_sources(folders=[tmp_path])
    with open(tmp_path / "w.bin", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        with dropping_mapped_pages(sources, every_s=0.01):
            assert m[:] == data
            # the background drops, not only the one at the end
            deadline = time.monotonic() + 5
            while mapped_resident(sources) >= SIZE // 4 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert mapped_resident(sources) < SIZE // 4
        assert mapped_resident(sources) < SIZE // 4


@pytest.mark.skipif("openvino" not in runnable_backends(), reason="openvino does not import")
@pytest.mark.usefixtures("edge_cache")
@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_openvino_keeps_no_source_weights(tmp_path: Path, edge_cache: Path, precision: str) -> None:
    path = write_tiny_model(tmp_path / "tiny.gguf", TinySpec(seed=3))
    sources = mapped_sources(folders=[edge_cache / "graphs"])
    for _ in range(2):  # the first load compiles and writes the blob, the second imports it
        dec = open_decoder(
            "openvino", path, "cpu", DecoderOptions(n_ctx=64, n_threads=1, precision=precision)
        )
        try:
            assert _read_only_shared(sources)  # OpenVINO maps its source (the blob)
            first = dec.forward([1, *range(300, 310)])
            assert mapped_resident(sources) == 0  # the repacking run dropped what it read
            for t in range(4):  # small constants read in place fault back in, and read the same bytes
                dec.forward([310 + t])
            dec.reset()
            np.testing.assert_array_equal(dec.forward([1, *range(300, 310)]), first)
        finally:
            dec.close()
