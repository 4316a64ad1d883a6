"""The contract every backend implements (see docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Decoder(Protocol):
    vocab_size: int
    position: int  # tokens held in the KV cache
    n_ctx: int  # tokens the KV cache can hold
    backend: str  # e.g. "llamacpp"
    device: str  # e.g. "cpu"

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Logits [len(tokens), vocab] (or [1, vocab] with last_only); appends the tokens to the KV cache."""
        ...

    def rollback(self, n: int) -> None:
        """Forget the last n tokens (speculative rejection, cancelled turns)."""
        ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


def rollback_limit(decoder: Decoder) -> int | None:
    """Tokens `decoder.rollback` can always undo; None: no limit. A backend with a bounded undo log (the
    ring-buffer KV of GraphDecoder) publishes it as `max_rollback`; llama.cpp's KV cache has none."""
    limit = getattr(decoder, "max_rollback", None)
    return None if limit is None else int(limit)
