"""Checking an ONNX file before a backend opens it: external data must stay inside the model's folder.

An ONNX tensor stored outside the protobuf names its file by a `location` string that runtimes join to the
model's folder. A hostile or corrupt file can point that at `/etc/shadow`, `../../secret`, or a symlink out
of the folder (ONNX's CVE-2024-27318 / CVE-2024-5187 family), or at ranges past the end of the data file.
`check_onnx_file` rejects all of these with ModelFormatError before ONNX Runtime or OpenVINO see the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from edge.errors import ModelFormatError
from edge.models.jsonstore import read_json, write_json

__all__ = ["check_onnx_file", "external_tensors"]

_KEEP = 256  # graphs whose check is remembered (most recent)
_HINT = "the ONNX file is corrupt or hostile; rebuild it (edge convert) or delete it from the cache"


def external_tensors(model: Any) -> Iterator[Any]:
    """Every TensorProto of a ModelProto stored as external data: initializers, Constant attributes and
    sparse tensors, in the main graph, in subgraphs (If / Loop / Scan bodies) and in local functions."""
    from onnx import TensorProto

    def graph_tensors(graph: Any) -> Iterator[Any]:
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        yield from node_tensors(graph.node)

    def node_tensors(nodes: Any) -> Iterator[Any]:
        for node in nodes:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("sparse_tensor"):
                    yield attr.sparse_tensor.values
                    yield attr.sparse_tensor.indices
                for sparse in attr.sparse_tensors:
                    yield sparse.values
                    yield sparse.indices
                if attr.HasField("g"):
                    yield from graph_tensors(attr.g)
                for g in attr.graphs:
                    yield from graph_tensors(g)

    yield from (t for t in graph_tensors(model.graph) if t.data_location == TensorProto.EXTERNAL)
    for func in model.functions:
        yield from (t for t in node_tensors(func.node) if t.data_location == TensorProto.EXTERNAL)


def _unsafe_location(location: str) -> str | None:
    """Why a location string is unacceptable on any platform, or None."""
    if not location:
        return "an empty location"
    if "\0" in location:
        return "a NUL byte in its location"
    for flavour in (PurePosixPath, PureWindowsPath):
        p = flavour(location)
        if p.is_absolute() or p.drive or p.root:
            return "an absolute location"
        if ".." in p.parts:
            return "a location with '..'"
    return None


def check_onnx_file(path: str | os.PathLike[str]) -> frozenset[Path]:
    """Raise ModelFormatError unless `path` parses as ONNX and all its external data lies, in range, in
    regular files inside the folder of `path` (symlinks resolved); the external data files it read.

    A graph of edge's own graph cache that passed is not parsed again while it is byte for byte the same (its
    SHA-256, of the very bytes that were parsed) and each location it names still resolves inside the folder
    to a regular file of the size it had: the offsets and lengths are the same bytes, so they are still in
    range. The record lives in edge's cache, never beside the graph; any other graph (an artifact, a user's
    file) is parsed every time. It spares a run `import onnx` (~1.3 s on 2 cores) and the parse."""
    path = Path(path)
    folder = path.parent.resolve()
    if not path.is_file():  # a FIFO would block the read
        raise ModelFormatError(f"{path}: not a regular file", hint=_HINT)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ModelFormatError(f"{path}: not a readable ONNX file: {exc}", hint=_HINT) from None
    own = _in_graph_cache(path)
    digest = hashlib.sha256(raw).hexdigest()
    known = read_json(_records_file()).get(str(path.resolve())) if own else None
    if isinstance(known, dict) and known.get("sha256") == digest:
        data = _still_in_place(folder, known.get("data"))
        if data is not None:
            return frozenset(data.values())
    found = _parse_and_check(raw, path, folder)
    if own:
        _remember(path, digest, {location: size for location, (_, size) in found.items()})
    return frozenset(target for target, _ in found.values())


def _in_graph_cache(path: Path) -> bool:
    from edge.models.store import cache_dir

    return path.resolve().is_relative_to((cache_dir() / "graphs").resolve())


def _records_file() -> Path:
    from edge.models.store import cache_dir

    return cache_dir() / "onnx-checked.json"


def _remember(path: Path, digest: str, data: dict[str, int]) -> None:
    records = read_json(_records_file())
    records.pop(str(path.resolve()), None)
    records[str(path.resolve())] = {"sha256": digest, "data": data}
    with contextlib.suppress(OSError):  # a read-only cache only costs a parse next time
        write_json(_records_file(), dict(list(records.items())[-_KEEP:]))


def _still_in_place(folder: Path, data: Any) -> dict[str, Path] | None:
    """The record's locations (as the graph writes them) -> their files, if each still resolves inside
    `folder` to a regular file of the size it had."""
    if not isinstance(data, dict):
        return None
    out = {}
    for location, size in data.items():
        target = (folder / str(location)).resolve()
        if _unsafe_location(str(location)) or not target.is_relative_to(folder) or not target.is_file():
            return None
        if target.stat().st_size != size:
            return None
        out[str(location)] = target
    return out


def _parse_and_check(raw: bytes, path: Path, folder: Path) -> dict[str, tuple[Path, int]]:
    """Parse `raw` (the bytes of `path` that were hashed) and check it; its external data locations, as the
    graph writes them, -> the file each resolves to and the size it was checked against."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load_model_from_string(raw)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise ModelFormatError(f"{path}: not a readable ONNX file: {exc}", hint=_HINT) from None
    sizes: dict[Path, int] = {}
    locations: dict[str, Path] = {}
    for tensor in external_tensors(model):
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        what = f"{path}: tensor {tensor.name!r}"
        why = _unsafe_location(location)
        if why is not None:
            raise ModelFormatError(f"{what} has external data at {why} ({location!r})", hint=_HINT)
        target = (folder / location).resolve()
        if not target.is_relative_to(folder):
            raise ModelFormatError(
                f"{what} has external data {location!r} that resolves outside {folder} (to {target})",
                hint=_HINT,
            )
        if target not in sizes:
            if not target.is_file():
                raise ModelFormatError(f"{what} has external data {location!r}, which is missing", hint=_HINT)
            sizes[target] = target.stat().st_size
        locations[location] = target
        try:
            offset, length = int(info.get("offset", 0)), int(info.get("length", -1))
        except ValueError:
            raise ModelFormatError(
                f"{what} has a non-numeric external data offset or length", hint=_HINT
            ) from None
        end = offset + length if length >= 0 else sizes[target]
        if offset < 0 or end < offset or end > sizes[target]:
            raise ModelFormatError(
                f"{what} needs bytes {offset}..{end} of {location!r}, which has {sizes[target]}", hint=_HINT
            )
    return {location: (target, sizes[target]) for location, target in locations.items()}
