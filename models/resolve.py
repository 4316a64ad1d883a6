"""A MODEL argument (catalog name, .gguf path or artifact directory) as a file, a catalog model pulled on first
use. Apart from store (where models live) so that pull, which writes there, does not import its own caller."""

from __future__ import annotations

from pathlib import Path

from edge.errors import ModelNotFoundError
from edge.models.catalog import CATALOG, lookup, near_names
from edge.models.store import PullProgress, is_verified, model_path

__all__ = ["resolve_model"]


def resolve_model(model: str, *, pull_missing: bool = True, on_progress: PullProgress | None = None) -> Path:
    """A catalog name (pulled on first use), a path to a local .gguf file, or an artifact directory.

    `on_progress(done_bytes, total_bytes, phase)` sees a pull; None shows it on stderr."""
    entry = lookup(model)
    if entry is not None:
        if is_verified(entry):
            return model_path(entry)
        if not pull_missing:
            raise ModelNotFoundError(f"model {model!r} is not pulled yet", hint=f"run: edge pull {model}")
        from edge.models.pull import pull  # a network step (and rich's progress bars): only when needed

        return pull(entry, on_progress=on_progress)
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if (path / "manifest.json").is_file():  # an artifact directory written by `edge convert`
        return path
    if path.exists():
        raise ModelNotFoundError(f"{model!r} is not a regular file", hint="pass a .gguf file")
    names = ", ".join(CATALOG)
    near = near_names(model)
    meant = f"; did you mean {' or '.join(near)}?" if near else ""
    raise ModelNotFoundError(
        f"no model named {model!r} and no such file{meant}",
        hint=f"use a catalog name ({names}) or a path to a .gguf",
    )
