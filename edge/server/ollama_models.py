"""What Ollama's API says about a model (`/api/tags`, `/api/show`, `/api/ps`): names with tags, details read
from the GGUF's metadata or the catalog, the context the server runs it with.

Ollama names a model `name:tag`; edge serves one build per name, so `NAME` and `NAME:latest` are the model
and any other tag is a clear 404 (never a different build silently)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from edge.errors import ModelNotFoundError
from edge.model import Model
from edge.server.registry import Registry

__all__ = ["details", "model_info", "ollama_name", "resolve", "summary", "untagged"]

TAG = "latest"


def ollama_name(name: str) -> str:
    return f"{name}:{TAG}"


def untagged(name: str) -> str:
    """An Ollama-style name without its tag (`qwen2.5-coder-0.5b:latest`: `qwen2.5-coder-0.5b`); edge has one
    build per name, so any tag but `latest` is a 404 saying so (never a different build silently)."""
    base, sep, tag = name.rpartition(":")
    if not (sep and base and "/" not in tag and "\\" not in tag):  # a colon of a path's drive is no tag
        return name
    if tag != TAG:
        raise ModelNotFoundError(
            f"the model {name!r} is not here: edge has one build per name, tagged {TAG!r}",
            hint=f"use {base!r} or {ollama_name(base)!r}; GET /api/tags lists the models",
        )
    return base


def resolve(name: str, registry: Registry) -> str:
    """A request's Ollama-style name as the registry's (`qwen2.5-coder-0.5b:latest`: `qwen2.5-coder-0.5b`)."""
    if not name:
        raise ModelNotFoundError("model is required", hint="GET /api/tags lists the models served here")
    name = untagged(name)
    if name not in registry.names():
        raise ModelNotFoundError(
            f"the model {name!r} does not exist on this server", hint="GET /api/tags lists the ones it serves"
        )
    return name


def _size_label(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}" if unit == "B" else f"{round(n / scale)}{unit}"
    return str(n)


def _quant(file_type: Any) -> str:
    import gguf

    try:
        return gguf.LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
    except (TypeError, ValueError):
        return "unknown"


def details(model: Model | None, arch: str) -> dict[str, Any]:
    """Ollama's `details`: format, family, parameter size and quantization (known once a model is loaded)."""
    out: dict[str, Any] = {"parent_model": "", "format": "gguf", "family": arch, "families": [arch]}
    if model is not None:
        meta = model.gguf.metadata
        n_params = sum(_count(t.shape) for t in model.gguf.tensors.values())
        out["parameter_size"] = str(meta.get("general.size_label") or _size_label(n_params))
        out["quantization_level"] = _quant(meta.get("general.file_type"))
    return out


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def model_info(model: Model) -> dict[str, Any]:
    """The GGUF's scalar metadata (general.* and the architecture's keys), the context length being the one
    this server runs the model with: the most a prompt and its answer may take here."""
    meta = model.gguf.metadata
    arch = str(meta.get("general.architecture", "unknown"))
    info: dict[str, Any] = {"general.architecture": arch}
    for key, value in meta.items():
        if key.startswith(("general.", f"{arch}.")) and isinstance(value, (int, float, str, bool)):
            info[key] = value
    info["general.parameter_count"] = sum(_count(t.shape) for t in model.gguf.tensors.values())
    info[f"{arch}.context_length"] = model.decoder.n_ctx
    return info


def _modified(path: Path | None) -> str:
    when = path.stat().st_mtime if path is not None and path.exists() else 0.0
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).isoformat().replace("+00:00", "Z")


def summary(name: str, registry: Registry) -> dict[str, Any]:
    """One model as `/api/tags` lists it: a loaded one from its file, a pulled one from the catalog."""
    from edge.models.catalog import CATALOG
    from edge.models.store import model_path

    sched = registry.loaded().get(name)
    model = None if sched is None else sched.replicas[0]
    entry = CATALOG.get(name)
    if model is not None:
        path: Path | None = Path(model.path)
        arch = str(model.gguf.metadata.get("general.architecture", "unknown"))
    else:
        path = model_path(entry) if entry is not None else None
        arch = entry.arch if entry is not None else "unknown"
    size = path.stat().st_size if path is not None and path.exists() else 0
    digest = entry.sha256 if entry is not None else ""
    return {
        "name": ollama_name(name),
        "model": ollama_name(name),
        "modified_at": _modified(path),
        "size": size,
        "digest": digest,
        "details": details(model, arch),
    }
