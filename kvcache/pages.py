"""Zeroed buffers whose pages become resident only where they are written, in small pages.

numpy advises huge pages (MADV_HUGEPAGE) for every large array on Linux, so the first write into a ring's
buffer maps 2 MiB, not 4 KiB. A ring holds one [capacity, kvh, hd] block per layer and a short request writes
the first few slots of each: measured on the 0.5b (24 layers, 6,144 slots), a 32-token answer made 96 MiB of
each slot's 144 MiB ring resident, where its K/V is 1.2 MiB. Here the pages are small, so a slot's RSS follows
the depth its requests reach (decode reads the ring once per step in order; the TLB misses of small pages did
not show in the step time: docs/performance.md).
"""

from __future__ import annotations

import contextlib
import math
import mmap

import numpy as np
from numpy.typing import DTypeLike

_ADVICE = getattr(mmap, "MADV_NOHUGEPAGE", None)  # Linux only; elsewhere nothing advises huge pages


def small_page_zeros(shape: tuple[int, ...], dtype: DTypeLike) -> np.ndarray:
    """np.zeros(shape, dtype), backed by an anonymous mapping advised against huge pages where the OS has
    them (its pages are the kernel's zero page until written). The array keeps the mapping alive."""
    dt = np.dtype(dtype)
    size = math.prod(shape) * dt.itemsize
    if _ADVICE is None or size < mmap.PAGESIZE:
        return np.zeros(shape, dt)
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    # a kernel built without transparent huge pages refuses the advice (EINVAL): its pages are small anyway
    with contextlib.suppress(OSError):
        buf.madvise(_ADVICE)
    return np.frombuffer(buf, dt).reshape(shape)
