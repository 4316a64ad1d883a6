"""Leaf helpers on token-id histories, shared by the KV session, the generation loop and the drafters (a leaf
module: none of them imports another for these, so their imports stay one-way)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["Fed", "common_prefix", "window_note"]


class Fed(Protocol):
    """What a generation fed its decoder: the prompt (as fed, maybe cut) and the tokens it chose."""

    prompt_ids: list[int]
    token_ids: list[int]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def window_note(dropped: int, kept: int) -> str | None:
    """The one wording, for the CLI, the API and the chat app, of older turns leaving the window."""
    if dropped <= 0:
        return None
    return f"older turns left the window ({dropped} tokens dropped, system prompt's {kept} kept)"
