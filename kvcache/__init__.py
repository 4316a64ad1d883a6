"""KV caches for static-shape decoder graphs (numpy only)."""

from .ring import NEG_INF, RingKVCache, RollbackError, StepView
from .spec import POLICIES, LayerKind, LayerSpec, OverflowPolicy

__all__ = [
    "NEG_INF",
    "POLICIES",
    "LayerKind",
    "LayerSpec",
    "OverflowPolicy",
    "RingKVCache",
    "RollbackError",
    "StepView",
]
