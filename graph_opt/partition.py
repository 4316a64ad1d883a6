"""Partition plans: which decoder layers each partition owns (embed runs in numpy before the first; the head
goes with the last). Each partition is built as a standalone graph with explicit hidden-state and KV inputs
and outputs (models/transformer.py's first_layer / last_layer / head), so any backend can run it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["LayerRange", "parse_ranges", "plan_partitions"]


@dataclass(frozen=True)
class LayerRange:
    first: int
    last: int  # exclusive
    head: bool

    def __str__(self) -> str:
        return f"layers {self.first}-{self.last - 1}" + (" + head" if self.head else "")

    def to_dict(self) -> dict[str, object]:
        return {"first_layer": self.first, "last_layer": self.last, "head": self.head}


def plan_partitions(n_layer: int, n: int, layer_bytes: Sequence[int] | None = None) -> list[LayerRange]:
    """n contiguous layer ranges with about equal weight bytes (equal layer counts when sizes are unknown)."""
    if not 1 <= n <= n_layer:
        raise ValueError(f"--partitions must be in 1..{n_layer} (the model has {n_layer} layers), got {n}")
    sizes = list(layer_bytes) if layer_bytes is not None else [1] * n_layer
    if len(sizes) != n_layer:
        raise ValueError("layer_bytes needs one size per layer")
    total, cuts, acc = float(sum(sizes)), [0], 0.0
    for i, s in enumerate(sizes):
        acc += s
        # cut after layer i when the running share passes the next boundary, leaving a layer for each rest
        if len(cuts) < n and acc >= total * len(cuts) / n and n_layer - (i + 1) >= n - len(cuts):
            cuts.append(i + 1)
    while len(cuts) < n:  # degenerate sizes: fill from the end
        cuts.append(cuts[-1] + 1)
    cuts.append(n_layer)
    return [LayerRange(a, b, b == n_layer) for a, b in itertools.pairwise(cuts)]


def parse_ranges(text: str, n_layer: int) -> list[LayerRange]:
    """'0-14,15-29' -> ranges (inclusive ends, contiguous, covering every layer)."""
    out, expect = [], 0
    for part in text.split(","):
        a, _, b = part.strip().partition("-")
        first, last = int(a), int(b or a) + 1
        if first != expect or last <= first:
            raise ValueError(f"partition ranges must be contiguous from 0: {text!r}")
        out.append(LayerRange(first, last, last == n_layer))
        expect = last
    if expect != n_layer:
        raise ValueError(f"partition ranges must end at layer {n_layer - 1}: {text!r}")
    return out
