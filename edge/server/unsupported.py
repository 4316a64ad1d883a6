"""The error of a request field whose value edge does not support (a leaf the request models and their helpers
raise)."""

from __future__ import annotations

__all__ = ["UnsupportedValue"]


class UnsupportedValue(ValueError):
    """A known request field holds a value edge does not support (HTTP 400 naming `param`)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
