"""Building the kernels: one shared library per source text, compiler and machine, made once with the
machine's C compiler and kept in edge's cache (a few seconds; without a compiler the K-quant path is off and
`kernel_library` says why, so the caller falls back to the lossless graph and says so)."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from edge.errors import BackendUnavailableError
from edge.models.store import cache_dir

__all__ = ["KernelBuild", "kernel_library"]

_LIB = "libedge_kquant.so"
_SOURCES = ("kquant.h", "kernels.c", "kernels_simd.h", "gemm.h", "dispatch.c", "ort_op.c")
_COMMON = (
    "-O3",
    "-fPIC",
    "-std=c11",
    "-fno-strict-aliasing",
    "-Wall",
    "-Wno-unused-function",
    "-Werror=implicit-function-declaration",
)
# one kernels.c object per instruction set: (table name, flags); dispatch.c picks one at run time
_X86_VARIANTS = (
    ("kq_portable", ()),
    ("kq_avx2", ("-mavx2", "-mfma", "-mf16c")),
    ("kq_avx512", ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl")),
    ("kq_avx512vnni", ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")),
)
_OPTIONAL_FLAG = "-mavx512vnni"  # a variant built without it where the compiler does not know it
_BUILD_LOCK = threading.Lock()
_FAILED: BackendUnavailableError | None = None  # a build that failed, not tried again in this process


@dataclass(frozen=True)
class KernelBuild:
    """A built library: its path and how it was made (for `edge devices` and the bench's report)."""

    path: Path
    compiler: str
    variants: tuple[str, ...]


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


def _compiler() -> str:
    named = os.environ.get("CC")
    cc = shutil.which(named) if named else shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        raise BackendUnavailableError(
            "edge's K-quant kernels need a C compiler to build once, and none was found "
            f"({'CC=' + named if named else 'cc, gcc, clang'})",
            hint="install one (Debian/Ubuntu: apt install gcc; macOS: xcode-select --install); until then the "
            "lossless graphs run K-quant files, slower",
        )
    return cc


@lru_cache(maxsize=1)
def _source_text() -> dict[str, bytes]:
    folder = resources.files("edge.devices.kquant") / "csrc"
    return {name: (folder / name).read_bytes() for name in _SOURCES}


def _key(sources: dict[str, bytes]) -> str:
    """The source text, the flags and the machine: a library built once is used without a compiler after."""
    h = hashlib.sha256()
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + sources[name])
    h.update(repr((_COMMON, _X86_VARIANTS)).encode() + platform.machine().encode())
    return h.hexdigest()[:20]


def _compile(cc: str, src: Path, out: Path) -> tuple[str, ...]:
    variants = _X86_VARIANTS if _is_x86() else _X86_VARIANTS[:1]
    objs = []
    for name, flags in variants:
        obj = out / f"kernels_{name}.o"
        cmd = [cc, *_COMMON, *flags, f"-DKQ_NAME={name}", "-c", str(src / "kernels.c"), "-o", str(obj)]
        try:
            _run(cmd)
        except BackendUnavailableError:
            if _OPTIONAL_FLAG not in flags:
                raise
            # a compiler older than VNNI (GCC < 8): the same table, its multiply-adds unfused (what the
            # kernels do without __AVX512VNNI__), so the library and every other variant still build
            _run([c for c in cmd if c != _OPTIONAL_FLAG])
        objs.append(str(obj))
    for name in ("dispatch.c", "ort_op.c"):
        obj = out / name.replace(".c", ".o")
        _run([cc, *_COMMON, "-c", str(src / name), "-o", str(obj)])
        objs.append(str(obj))
    _run([cc, "-shared", "-o", str(out / _LIB), *objs, "-lm", "-lpthread"])
    return tuple(name for name, _ in variants)


def _run(cmd: list[str]) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendUnavailableError(
            f"building edge's K-quant kernels failed: {cmd[0]} could not run ({exc})",
            hint="the lossless graphs run K-quant files meanwhile; set CC to a working C compiler",
        ) from None
    if done.returncode != 0:
        raise BackendUnavailableError(
            f"building edge's K-quant kernels failed ({' '.join(cmd[:2])} ...): {done.stderr.strip()[-600:]}",
            hint="the lossless graphs run K-quant files meanwhile; report this with the compiler's version",
        )


def kernel_library() -> KernelBuild:
    """The built library in the cache as it is now, built if this source and machine have none there (the
    cache may have moved or been emptied since the last call: EDGE_CACHE_DIR, `edge cache --prune`).
    BackendUnavailableError (with what to do) when it must be built and there is no compiler or the build
    fails; a failure is kept for the process (a draft and its target, a server's reloads, do not retry it)."""
    global _FAILED
    if _FAILED is not None:
        raise _FAILED
    sources = _source_text()
    folder = cache_dir() / "kernels" / _key(sources)
    variants = tuple(n for n, _ in (_X86_VARIANTS if _is_x86() else _X86_VARIANTS[:1]))
    lib = folder / _LIB
    with _BUILD_LOCK:
        try:
            if not lib.is_file():
                _build(_compiler(), sources, folder)
        except OSError as exc:  # the cache folder not writable, a disk full
            _FAILED = BackendUnavailableError(
                f"edge's K-quant kernels could not be built into {folder}: {exc}",
                hint="free space or make the cache writable (EDGE_CACHE_DIR sets another)",
            )
            raise _FAILED from None
        except BackendUnavailableError as exc:
            _FAILED = exc
            raise
    try:
        made_by = (folder / "compiler.txt").read_text(errors="replace").strip()
    except OSError:
        made_by = "unknown compiler"
    return KernelBuild(lib, made_by, variants)


def _build(cc: str, sources: dict[str, bytes], folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        work = Path(tmp)
        for name, text in sources.items():
            (work / name).write_bytes(text)
        _compile(cc, work, work)
        version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout
        folder.mkdir(exist_ok=True)
        (folder / "compiler.txt").write_text(f"{cc}: {version.splitlines()[0] if version else '?'}\n")
        # the library last, as the entry's completion mark; another process may have finished first:
        # replacing one complete file by another is atomic
        os.replace(work / _LIB, folder / _LIB)
