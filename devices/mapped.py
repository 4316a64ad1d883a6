"""Give memory a runtime has finished with back to the OS: pages of mapped weight files, and the heap.

OpenVINO's CPU plugin maps its source weights (the cached blob, or the ONNX external data) read-only and, on
the first inference, repacks every weight into its own buffers; the mapped pages it read stay resident
(counted in the process's RSS) although only a few small constants are ever read there again. Dropping them (madvise MADV_DONTNEED on a
read-only shared file mapping) only unmaps them: the file and the OS page cache are untouched, and a later
read faults the same bytes back in, so it can never change a result, only cost a page fault.
While the runtime may unmap a source concurrently (compile_model releases the ONNX data it read), the range
read from /proc/self/maps can be unmapped and reused by a new anonymous mapping before the madvise lands, where
MADV_DONTNEED would zero live memory: there MADV_PAGEOUT is used, which reclaims clean file pages (from the page
cache too) and never discards anonymous data.
Linux only; elsewhere every call is a no-op.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

_MADV_DONTNEED = 4
_MADV_PAGEOUT = 21  # Linux 5.4+; EINVAL before, where the call then drops nothing


def release_heap() -> None:
    """Collect reference cycles and return the heap's free pages (glibc's malloc_trim): freed weights or a
    graph build's garbage otherwise stay in the process's RSS. Elsewhere (macOS, Windows, musl): gc alone."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@functools.cache
def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc (musl)
        return None
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise  # type: ignore[no-any-return]


def _read_only_shared(sources: tuple[str, ...]) -> list[tuple[int, int]]:
    """Address ranges of this process's read-only shared mappings of the files `sources` names (a file, or a
    folder ending in "/": every file under it)."""
    out: list[tuple[int, int]] = []
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(maxsplit=5)
        # NOTE: shared and never writable: a private mapping may hold copy-on-write pages that dropping loses
        if len(parts) == 6 and parts[1] == "r--s" and _named(parts[5], sources):
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return out


def _named(mapped: str, sources: tuple[str, ...]) -> bool:
    return any(mapped == s or (s.endswith("/") and mapped.startswith(s)) for s in sources)


def mapped_sources(files: Iterable[Path] = (), folders: Iterable[Path] = ()) -> tuple[str, ...]:
    """The names /proc/self/maps gives `files` and the files under `folders` (resolved paths)."""
    return tuple(str(f.resolve()) for f in files) + tuple(str(d.resolve()) + "/" for d in folders)


def drop_mapped_pages(sources: tuple[str, ...], *, unmapping: bool = False) -> int:
    """Unmap the resident pages of this process's read-only shared mappings of `sources` (see
    `mapped_sources`); the bytes of address space covered. `unmapping`: another thread may unmap them
    meanwhile (reclaim them with MADV_PAGEOUT, see the module docstring)."""
    madvise = _madvise()
    if madvise is None or not sources:
        return 0
    advice = _MADV_PAGEOUT if unmapping else _MADV_DONTNEED
    done = 0
    for lo, hi in _read_only_shared(sources):
        if madvise(lo, hi - lo, advice) == 0:
            done += hi - lo
    return done


def mapped_resident(sources: tuple[str, ...]) -> int:
    """Bytes of `sources` resident in this process (read-only shared mappings; 0 where /proc is absent)."""
    total, counting = 0, False
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return 0
    for line in lines:
        parts = line.split(maxsplit=5)
        if parts and ":" not in parts[0]:  # a mapping's header line; its fields follow
            counting = len(parts) == 6 and parts[1] == "r--s" and _named(parts[5], sources)
        elif counting and parts[0] == "Rss:":
            total += int(parts[1]) * 1024
    return total


@contextlib.contextmanager
def dropping_mapped_pages(
    sources: tuple[str, ...], every_s: float = 0.1, *, unmapping: bool = False
) -> Iterator[None]:
    """While the block runs, drop the mapped pages of `sources` every `every_s` seconds (and once at the end):
    a runtime repacking its weights then never holds the source and the repacked copy at once. `unmapping`: the
    block may unmap sources (a compile), so the drops while it runs reclaim instead (MADV_PAGEOUT); the one at
    the end, when the block has returned, unmaps as usual."""
    if _madvise() is None or not sources:
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            drop_mapped_pages(sources, unmapping=unmapping)

    thread = threading.Thread(target=loop, name="edge-drop-mapped", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        drop_mapped_pages(sources)
