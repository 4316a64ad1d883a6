"""Text shipped with edge: the default evaluation text, also the source of benchmark prompts."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from edge.errors import EdgeError

__all__ = ["read_text"]


def read_text(path: str | Path | None = None) -> str:
    """The text at `path`, or the shipped `eval.txt` (our own prose plus some Python) when None."""
    if path is None:
        return resources.files(__name__).joinpath("eval.txt").read_text(encoding="utf-8")
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeError(f"cannot read text file {path}: {exc}", hint="pass a readable UTF-8 file") from None
