"""What edge's cache holds, and removing it: `edge models`, `edge rm`, `edge cache [--prune]`.

`cache_dir()` (models/store.py) holds:
  models/FILE, FILE.verified.json  catalog models (models/store.py, models/pull.py; FILE.partial while pulled)
  graphs/KEY/     an own graph per (file, build options): model.onnx(.data), DONE, and the runners' compiled
                  forms beside them (devices/graph_decoder.py)
  plans/KEY/      a device plan's partitions, an `edge convert` artifact with DONE (devices/planned.py)
  compiled/KEY/   a partition graph's compile cache (devices/partitioned.py)
  the rest        small records (device probes, measured speeds, file hashes): "other"
Every writer builds an entry in a temporary (graphs/KEY.RANDOM/, plans/.KEY.RANDOM/, FILE.partial) renamed
into place whole, and records in it the file it came from and its format: a model's entries, or those of a
file since removed, are found by reading the records, not by rebuilding keys. Entries an older edge wrote lack
them ("unrecorded"): --prune removes them (they are rebuilt on use); `edge rm` of a catalog model also finds
its older graphs by file name, which they record.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge.devices.graph_decoder import GRAPH_FORMAT
from edge.devices.partitioned import COMPILED_SOURCE, compile_cache_dir
from edge.devices.planned import PLAN_FORMAT
from edge.errors import EdgeError, ModelInUseError, ModelNotFoundError
from edge.models.catalog import CATALOG, lookup, near_names
from edge.models.jsonstore import read_json
from edge.models.store import cache_dir, model_path

__all__ = ["KINDS", "Entry", "Removal", "entries_of", "prune", "remove_model", "scan", "usage"]

KINDS = ("models", "graphs", "plans", "compiled", "other")
_KEY = re.compile(r"[0-9a-f]{20}")  # an entry's folder name: its key's hash (graphs, plans, compiled)
# A temporary, or an entry without its record yet, changed this recently may be being written by another
# process (a 1.5b graph build writes for minutes): left alone. Older ones are a killed writer's leftovers.
RECENT_S = 3600.0
_OLDER = "built by an older edge (no format recorded)"


@dataclass(frozen=True)
class Entry:
    """A graph, plan or compile cache under the cache, or a temporary left by a writer."""

    kind: str  # graphs | plans | compiled | models (a download's .partial) | other (a record's temporary)
    path: Path
    bytes: int
    model: str | None = None  # resolved path of the file (or artifact folder) it derives from; None: unknown
    model_file: str | None = None  # that file's name (all an older graph records)
    backend: str | None = None  # graphs: the backend it was lowered for
    precision: str | None = None
    stale: str | None = None  # why --prune removes it; None: in use
    busy: bool = False  # being written, maybe: --prune and `edge rm` leave it alone

    @property
    def label(self) -> str:
        """`ort fast`, `plan exact`, `compiled`: what `edge models` lists."""
        if self.kind == "graphs":
            return f"{self.backend or '?'} {self.precision or '?'}" if self.backend else "graph (older edge)"
        if self.kind == "plans":
            return f"plan {self.precision or '?'}"
        return self.kind

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "path": str(self.path),
            "bytes": self.bytes,
            "model": self.model,
            "backend": self.backend,
            "precision": self.precision,
            "stale": self.stale,
            "busy": self.busy,
        }


@dataclass(frozen=True)
class Removal:
    """What `edge rm` or `edge cache --prune` removed (path, bytes, why) and what it left because it was busy."""

    removed: tuple[tuple[Path, int, str], ...]
    skipped: tuple[Entry, ...] = ()

    @property
    def freed(self) -> int:
        return sum(n for _, n, _ in self.removed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cache_dir": str(cache_dir()),
            "freed_bytes": self.freed,
            "removed": [{"path": str(p), "bytes": n, "why": why} for p, n, why in self.removed],
            "skipped": [
                {"path": str(e.path), "why": "being written (changed in the last hour)"} for e in self.skipped
            ],
        }


# -- reading the cache ----------------------------------------------------------------------------------------
def _tree(path: Path) -> tuple[int, float]:
    """(bytes, newest mtime) of a file or a folder's files; links are not followed (nor counted)."""
    try:
        st = path.lstat()
    except OSError:
        return 0, 0.0
    if not path.is_dir() or path.is_symlink():
        return st.st_size, st.st_mtime
    size, newest = 0, st.st_mtime
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                fs = os.lstat(os.path.join(root, name))
                size, newest = size + fs.st_size, max(newest, fs.st_mtime)
    return size, newest


def _children(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())


def _source_state(record: object, what: str) -> str | None:
    """None while the recorded file is as it was; else why the entry is stale (its key can never match again)."""
    if not isinstance(record, Mapping) or not isinstance(record.get("path"), str):
        return _OLDER
    path = Path(record["path"])
    try:
        st = path.stat()
    except OSError:
        return f"its {what} {path} is gone"
    if st.st_size != record.get("size") or st.st_mtime_ns != record.get("mtime_ns"):
        return f"its {what} {path} changed since"
    return None


def _recorded_path(record: object) -> str | None:
    return record["path"] if isinstance(record, Mapping) and isinstance(record.get("path"), str) else None


def _graph(folder: Path, now: float) -> Entry:
    size, newest = _tree(folder)
    done = read_json(folder / "DONE")
    if not _KEY.fullmatch(folder.name) or not done:  # a build in its temporary, or one cut short
        recent = newest > now - RECENT_S
        return Entry("graphs", folder, size, stale=None if recent else "a build cut short", busy=recent)
    fmt, model = done.get("format"), done.get("model")
    stale = _OLDER if fmt is None else _source_state(model, "model")
    if fmt is not None and fmt != GRAPH_FORMAT:
        stale = f"graph format {fmt}; this edge builds format {GRAPH_FORMAT}"
    source = done.get("source")
    return Entry(
        "graphs",
        folder,
        size,
        model=_recorded_path(model),
        model_file=source if isinstance(source, str) else None,
        backend=(done.get("target") or "onnx") if fmt is not None else None,  # onnx: built for no target
        precision=done.get("precision") if fmt is not None else None,
        stale=stale,
    )


def _plan(folder: Path, now: float) -> Entry:
    size, newest = _tree(folder)
    done = read_json(folder / "DONE")
    if folder.name.startswith(".") or not done:  # a conversion in its temporary, or one cut short
        recent = newest > now - RECENT_S
        return Entry("plans", folder, size, stale=None if recent else "a conversion cut short", busy=recent)
    source = read_json(folder / "manifest.json").get("source")  # an older plan's model: its manifest's
    fmt, model = done.get("format"), done.get("model")
    stale = _OLDER if fmt is None else _source_state(model, "model")
    if fmt is not None and fmt != PLAN_FORMAT:
        stale = f"plan format {fmt}; this edge builds format {PLAN_FORMAT}"
    return Entry(
        "plans",
        folder,
        size,
        model=_recorded_path(model) or _recorded_path(source),
        model_file=source.get("file") if isinstance(source, Mapping) else None,
        precision=done.get("precision"),
        stale=stale,
    )


def _compiled(folder: Path, now: float, plans: Mapping[Path, Entry], keyed: Mapping[str, Entry]) -> Entry:
    size, newest = _tree(folder)
    graph = read_json(folder / COMPILED_SOURCE).get("graph")
    path = _recorded_path(graph)
    if path is not None:  # the plan holding that graph, or a user's `edge convert` folder
        owner = plans.get(Path(path).parent)
        stale = _source_state(graph, "graph") or (owner.stale if owner else None)
        model = owner.model if owner else str(Path(path).parent)
        return Entry("compiled", folder, size, model=model, stale=stale)
    owner = keyed.get(folder.name)  # an older edge's: matched by the key of a plan's graph files
    if owner is not None:
        return Entry("compiled", folder, size, model=owner.model, stale=owner.stale)
    recent = newest > now - RECENT_S  # a compile cache is created a moment before its record is written
    return Entry("compiled", folder, size, stale=None if recent else "no record of its graph", busy=recent)


def _temporary(kind: str, path: Path, now: float, why: str) -> Entry:
    size, newest = _tree(path)
    recent = newest > now - RECENT_S
    return Entry(kind, path, size, stale=None if recent else why, busy=recent)


def _plan_graph_keys(plans: list[Entry]) -> dict[str, Entry]:
    keyed = {}
    for plan in plans:
        for graph in plan.path.glob("*.onnx"):
            with contextlib.suppress(OSError):
                keyed[compile_cache_dir(graph).name] = plan
    return keyed


def scan() -> list[Entry]:
    """Every graph, plan and compile cache under the cache, and the writers' temporaries, each with whether it
    is stale (why) or busy."""
    root, now = cache_dir(), time.time()
    plans = [_plan(p, now) for p in _children(root / "plans")]
    by_path = {e.path.resolve(): e for e in plans}  # compile caches record resolved graph paths
    keyed = _plan_graph_keys([e for e in plans if not e.busy])
    out = [_graph(p, now) for p in _children(root / "graphs")] + plans
    out += [_compiled(p, now, by_path, keyed) for p in _children(root / "compiled")]
    models = root / "models"
    out += [_temporary("models", p, now, "a pull cut short") for p in sorted(models.glob("*.partial"))]
    for folder in (root, root / "devices"):  # the small JSON records' temporaries (models/jsonstore.py)
        if folder.is_dir():
            out += [
                _temporary("other", p, now, "a record's write cut short")
                for p in sorted(folder.glob(".*.json.*"))  # write_json's mkstemp(prefix=".NAME.")
                if p.is_file()
            ]
    return out


def usage() -> dict[str, int]:
    """Bytes by kind (KINDS). A models folder linked elsewhere (another disk) is counted where it points."""
    root = cache_dir()
    out = dict.fromkeys(KINDS, 0)
    if not root.is_dir():
        return out
    for child in root.iterdir():
        kind = child.name if child.name in KINDS[:-1] else "other"
        out[kind] += _tree(child.resolve() if kind == "models" else child)[0]
    return out


def entries_of(entries: list[Entry], path: Path, file_name: str | None = None) -> list[Entry]:
    """The entries built from the file (or `edge convert` folder) at `path`; with `file_name`, also the older
    graphs that record only that name (a catalog model's)."""
    target = path.expanduser().resolve()

    def mine(e: Entry) -> bool:
        if e.model is not None:
            p = Path(e.model)
            return p == target or target in p.parents
        return file_name is not None and e.model_file == file_name

    return [e for e in entries if not e.busy and mine(e)]


# -- removing ----------------------------------------------------------------------------------------------
def _delete(path: Path) -> None:
    """Remove a cache file or folder; one already gone (another process) is fine."""
    root = cache_dir()
    if not path.is_relative_to(root):
        raise EdgeError(f"refusing to remove {path}: it is outside the cache {root}")
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise EdgeError(f"cannot remove {path}: {exc.strerror or exc}") from None


def _remove(entries: list[Entry], why: str | None = None) -> list[tuple[Path, int, str]]:
    done = []
    for e in entries:
        _delete(e.path)
        done.append((e.path, e.bytes, why or e.stale or ""))
    return done


@contextlib.contextmanager
def _not_being_pulled(name: str, file: Path) -> Iterator[None]:
    """Holds the pull's lock (models/pull.py) while a model is removed: a pull under way is not undone."""
    lock = file.with_name(file.name + ".lock")
    if not lock.exists():
        yield
        return
    with open(lock, "a") as fh:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory lock
            yield
            return
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ModelInUseError(
                f"{name} is being pulled by another process", hint="run edge rm again when it is done"
            ) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _looks_like_path(arg: str) -> bool:
    return os.sep in arg or "/" in arg or arg.endswith(".gguf") or arg.startswith(("~", "."))


def _unknown(model: str) -> ModelNotFoundError:
    close = near_names(model)
    names = ", ".join(CATALOG)
    hint = (
        f"did you mean {' or '.join(close)}? " if close else ""
    ) + f"catalog: {names}; or a path to a .gguf"
    return ModelNotFoundError(f"no model named {model!r} in the catalog and no such file", hint=hint)


def remove_model(model: str) -> Removal:
    """A catalog model: its file, its verified marker and everything built from it. A path (a .gguf or an
    `edge convert` folder, present or not): only what edge built from it, never the file itself."""
    entries = scan()
    entry = lookup(model)
    if entry is None:
        path = Path(model).expanduser()
        if not path.exists() and not _looks_like_path(model):
            raise _unknown(model)
        return Removal(tuple(_remove(entries_of(entries, path), f"built from {path.name}")))
    file = model_path(entry)
    built = entries_of(entries, file, entry.file)
    with _not_being_pulled(entry.name, file):
        removed = _remove(built, f"built from {entry.name}")
        marker = file.with_name(file.name + ".verified.json")
        for path, why in ((file, f"the {entry.name} model file"), (marker, "its SHA-256 check")):
            if path.exists():
                size = path.stat().st_size
                _delete(path)
                removed.append((path, size, why))
        unpacked = file.with_suffix("")  # an embedding model's folder (models/unpack.py)
        if entry.embedding and unpacked.is_dir():
            size = _tree(unpacked)[0]
            _delete(unpacked)
            removed.append((unpacked, size, "its unpacked folder"))
    return Removal(tuple(removed))


def prune() -> Removal:
    """Remove what nothing can use again: graphs and plans of an older format or of a model gone or changed,
    compile caches of graphs gone, and writers' temporaries left by a killed process. Busy ones stay."""
    entries = scan()
    stale = [e for e in entries if e.stale is not None and not e.busy]
    return Removal(tuple(_remove(stale)), tuple(e for e in entries if e.busy))
