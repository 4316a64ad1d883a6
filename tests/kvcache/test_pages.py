"""A ring's buffers: zeroed, writable, and resident only where written (kvcache/pages.py)."""

from __future__ import annotations

import mmap
import re
import sys

import numpy as np
import pytest

from edge.kvcache.pages import small_page_zeros
from edge.kvcache.ring import RingKVCache
from edge.kvcache.spec import LayerSpec

linux = pytest.mark.skipif(sys.platform != "linux", reason="huge pages and /proc/self/smaps are Linux's")


def _resident_kib(arr: np.ndarray) -> int:
    """Rss of the mappings arr's bytes lie in (/proc/self/smaps; advice can split one into several)."""
    lo = arr.__array_interface__["data"][0]
    hi, total, inside = lo + arr.nbytes, 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            span = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if span:
                inside = int(span[1], 16) < hi and lo < int(span[2], 16)
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def test_zeroed_and_writable() -> None:
    a = small_page_zeros((3, 1, 1000, 2, 64), np.float32)
    assert a.shape == (3, 1, 1000, 2, 64) and a.dtype == np.float32 and a.flags.writeable
    assert a.flags.c_contiguous and not a.any()
    a[1, 0, 5] = 7.0
    assert a.sum() == 7.0 * 128
    tiny = small_page_zeros((4,), np.float16)
    assert tiny.dtype == np.float16 and not tiny.any()


@linux
def test_a_short_write_keeps_the_rest_unmapped() -> None:
    # 24 layers of 6,144 slots (the 0.5b's ring at --ctx-size 6144): 32 slots written per layer, 16 KiB each
    a = small_page_zeros((24, 1, 6144, 2, 64), np.float32)
    before = _resident_kib(a)  # (the kernel may merge the mapping with a neighbour's: count the growth)
    a[:, :, :32] = 1.0
    page = mmap.PAGESIZE // 1024
    # a layer's 16 KiB in small pages (one more where it straddles); a huge page each would be 48 MiB
    assert _resident_kib(a) - before <= 24 * (-(-16 // page) + 1) * page


@linux
def test_a_reset_ring_stays_small() -> None:
    cache = RingKVCache([LayerSpec(n_kv_heads=2, head_dim=64, capacity=4096)] * 4)
    before = _resident_kib(cache.keys[0])
    for _ in range(3):  # each reset zeroes what was written, never the whole capacity
        cache.begin(10)
        ones = [np.ones((1, 10, 2, 64), np.float32)] * 4
        cache.commit(ones, ones)
        assert cache.keys[0][:, :10].all() and cache.position == 10
        cache.reset()
        assert not any(k.any() for k in cache.keys) and not any(v.any() for v in cache.values)
    # 10 slots of 512 bytes: a page or two a layer, K and V (their mappings may be merged into one)
    page = mmap.PAGESIZE // 1024
    assert _resident_kib(cache.keys[0]) - before <= 4 * 2 * 2 * page
