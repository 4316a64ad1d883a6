"""A catalog embedding model's zip (pulled and SHA-256-verified like every catalog file) unpacked once into
its folder beside it; the folder's files are checked as they come out (plain relative names, bounded sizes,
the catalog's member hashes) and marked, so a later load trusts the folder only while the files are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path, PurePosixPath

from edge.errors import ChecksumError, ModelFormatError
from edge.models.catalog import CatalogEntry
from edge.models.store import model_path

__all__ = ["unpacked_folder"]

_MARK = ".edge-unpacked.json"
_MAX_MEMBERS = 64
_CHUNK = 1 << 20


def folder_of(entry: CatalogEntry) -> Path:
    return model_path(entry).with_suffix("")


def unpacked_folder(entry: CatalogEntry, archive: Path) -> Path:
    """The folder of `entry`'s verified zip `archive`, unpacked now when it is absent or changed."""
    folder = folder_of(entry)
    if _is_marked(folder):
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        _extract(archive, partial, entry.size * 4)
        for member, sha in entry.members:
            got = _sha256(partial / member)
            if got != sha:
                raise ChecksumError(f"{entry.name}: {member} has sha256 {got}, the catalog says {sha}")
        _mark(partial)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder


def _extract(archive: Path, dest: Path, max_bytes: int) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        if len(infos) > _MAX_MEMBERS or sum(i.file_size for i in infos) > max_bytes:
            raise ModelFormatError(f"{archive.name}: more members or bytes than a model folder holds")
        for info in infos:
            name = PurePosixPath(info.filename)
            if name.is_absolute() or ".." in name.parts or "\\" in info.filename:
                raise ModelFormatError(f"{archive.name}: member {info.filename!r} points outside its folder")
            target = dest.joinpath(*name.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, _CHUNK)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stats(folder: Path) -> dict[str, list[int]]:
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != _MARK:
            st = path.stat()
            out[path.relative_to(folder).as_posix()] = [st.st_size, st.st_mtime_ns]
    return out


def _mark(folder: Path) -> None:
    (folder / _MARK).write_text(json.dumps(_stats(folder)))


def _is_marked(folder: Path) -> bool:
    try:
        return json.loads((folder / _MARK).read_text()) == _stats(folder)
    except (OSError, ValueError):
        return False
