"""Layer specs and slot geometry of the ring-buffer KV cache."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

# ring: keep the sinks + the most recent tokens, evict the oldest; error: raise ContextOverflowError when a
# step would evict a token a later query could attend to; truncate: never evict, admit only what still fits.
OverflowPolicy = Literal["ring", "error", "truncate"]
POLICIES: tuple[str, ...] = get_args(OverflowPolicy)

# The ring's element types: f32, or f16 (half the bytes; K/V rounded to fp16, as llama.cpp's default cache)
KV_DTYPES: tuple[str, ...] = ("f32", "f16")


def kv_numpy_dtype(kv_dtype: str) -> type:
    """numpy's type for one of KV_DTYPES (ValueError for any other name)."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"the KV cache's type must be {' or '.join(KV_DTYPES)}, not {kv_dtype!r}")
    return np.float16 if kv_dtype == "f16" else np.float32


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer's cache: `capacity` slots of [n_kv_heads, head_dim]; `window` for sliding-window layers
    (a token at p sees positions > p - window, itself included), None for global layers."""

    n_kv_heads: int
    head_dim: int
    capacity: int
    window: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_kv_heads", "head_dim", "capacity"):
            if getattr(self, name) < 1:
                raise ValueError(f"LayerSpec.{name} must be >= 1, got {getattr(self, name)}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"LayerSpec.window must be >= 1 or None, got {self.window}")


@dataclass(frozen=True)
class LayerKind:
    """Slot geometry shared by layers: layers of one kind share slot positions and one mask per step.

    Slots [0, sink) hold positions [0, sink) for good; position p >= sink lives in slot
    `sink + (p - sink) % ring`."""

    capacity: int
    window: int | None
    sink: int

    @property
    def ring(self) -> int:
        """Slots that rotate (capacity - sink)."""
        return self.capacity - self.sink

    @property
    def lossless(self) -> bool:
        """True when eviction can never drop a token a later query attends to: a window the ring covers."""
        return self.window is not None and self.ring >= self.window - 1

    def describe(self) -> str:
        where = "global" if self.window is None else f"window={self.window}"
        return f"{where} capacity={self.capacity} sink={self.sink}"
