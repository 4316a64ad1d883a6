"""The packed past of a batch step, kept from one step to the next (devices/batch.py).

A packed step feeds the slots' bound ring prefixes as one past per layer. Concatenating them afresh every step
copied every slot's whole past each time: the 0.5b with 4 slots 600 tokens deep moved 58 MB a step, 5.7 to
12 ms of a 34 to 40 ms step (measured with the engine's pack timed apart from the graph's run), growing with
depth.

The arena keeps that concatenation. Each slot has a region of its own with room to grow; a region is refreshed
from the slot's ring only where the ring wrote since (RingKVCache.take_written: the slots [lo, hi)) or where
the bound prefix grew, so a staged decode step copies nothing (its new token lies in the staging window or
beyond the bound prefix; an unstaged one's, once the prefix covers it, one column; a wrapped ring's, the slot
it overwrote), and a region always equals its ring's bound prefix bit for bit. A region's columns past its
prefix, and the regions of slots not in a step, are masked (`Packed.columns`: the masks place each part).

For a graph with attention per slot (models/transformer.BuildOptions.slot_axis) every region of a layout has
the same room, so the past is fed as [regions, room, kvh, hd] (`per_slot`): a slot's rows attend over their
own region (`Packed.regions`), whose columns past the prefix are masked; a region of a slot not in a step is
a batch entry whose rows are not read back.

The layout is made anew (every region copied once) when a slot without a region joins a step, a prefix
outgrows its region, or a slot sat out `STALE` steps in a row (its request ended: its columns would cost every
step). A slot that misses a step or two (still sampling) keeps its region. Layouts reuse one buffer per layer
that only grows (a fresh one costs its page faults: ~100 ms for the 0.5b's 4 x 600 tokens), in small pages
(kvcache/pages.py): only the columns copied in become resident.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edge.kvcache import RingKVCache
from edge.kvcache.pages import small_page_zeros

__all__ = ["HEADROOM", "STALE", "Packed", "PastArena"]

HEADROOM = 128  # columns a region holds beyond its prefix and its step's tokens: four staging windows
STALE = 16  # steps in a row a slot may sit out before the layout drops its region


@dataclass(frozen=True)
class Packed:
    feeds: dict[str, np.ndarray]  # past_key_i / past_value_i for every layer (the arena's: read only)
    columns: dict[str, tuple[tuple[int, ...], int]]  # per mask input: each part's first column, the width
    regions: tuple[int, ...] = ()  # each part's region (per_slot: its batch entry)


class PastArena:
    """One batch engine's packed past (used by its thread alone)."""

    def __init__(self, *, per_slot: bool = False) -> None:
        self.per_slot = per_slot  # regions of one size, fed as [regions, room, kvh, hd] (module docstring)
        self._layout: list[RingKVCache] = []  # a region each, in this order
        self._absent: list[int] = []  # per region, the steps in a row its slot sat out
        self._caps: dict[int, list[int]] = {}  # per cache kind, each region's columns
        self._offsets: dict[int, list[int]] = {}
        self._valid: dict[int, list[int]] = {}  # per cache kind, each region's columns equal to its ring's
        self._backing: list[tuple[np.ndarray, np.ndarray]] = []  # per layer, flat K and V buffers
        self._k: list[np.ndarray] = []
        self._v: list[np.ndarray] = []
        self._feeds: dict[str, np.ndarray] = {}  # the layout's past_key_i / past_value_i (the arrays above)
        self._layers_of: dict[int, list[int]] = {}  # per cache kind, its layers
        self.copied = 0  # ring columns copied in (per region and cache kind, all its layers), for tests
        self.layouts = 0  # layouts made

    def past(
        self,
        caches: Sequence[RingKVCache],
        feeds: Sequence[Mapping[str, np.ndarray]],
        mask_layer: Mapping[int, int],
    ) -> Packed:
        """The packed past of a step whose parts are `feeds` (built against `caches`, in that order), and
        where each part's past lies for the graph's masks (`mask_layer`: mask kind -> a layer of it)."""
        kind_of = caches[0].layer_kind
        if not self._layers_of:
            for i, ck in enumerate(kind_of):
                self._layers_of.setdefault(ck, []).append(i)
        first = {ck: layers[0] for ck, layers in self._layers_of.items()}
        bounds = {ck: [int(f[f"past_key_{i}"].shape[1]) for f in feeds] for ck, i in first.items()}
        places = self._place(caches, feeds, bounds)
        try:
            for cache, j, lengths in zip(caches, places, zip(*bounds.values(), strict=True), strict=True):
                written = cache.take_written()
                for ck, length in zip(bounds, lengths, strict=True):
                    self._refresh(cache, j, ck, written[ck], length)
        except BaseException:
            self._layout = []  # what was taken is lost: the next step lays out (and copies) anew
            raise
        columns = {}
        for k, i in mask_layer.items():
            starts = self._offsets[kind_of[i]]
            columns[f"mask_{k}"] = (tuple(starts[j] for j in places), int(self._k[i].shape[1]))
        return Packed(self._feeds, columns, tuple(places))

    def _refresh(self, cache: RingKVCache, j: int, ck: int, written: tuple[int, int], length: int) -> None:
        """Region j of kind ck equals the ring's slots [0, length) after: the slots the ring wrote since
        (`written`, [lo, hi)) and those past what the region held are copied in."""
        valid, (lo, hi) = self._valid[ck][j], written
        spans = [(lo, min(hi, valid, length)), (valid, length)]
        if spans[0][1] >= spans[1][0]:  # they touch: one copy
            spans = [(min(lo, valid), length)]
        at = self._offsets[ck][j]
        for a, b in spans:
            if a < b:
                for i in self._layers_of[ck]:
                    self._k[i][:, at + a : at + b] = cache.keys[i][:, a:b]
                    self._v[i][:, at + a : at + b] = cache.values[i][:, a:b]
                self.copied += b - a
        self._valid[ck][j] = length

    def _place(
        self,
        caches: Sequence[RingKVCache],
        feeds: Sequence[Mapping[str, np.ndarray]],
        bounds: Mapping[int, list[int]],
    ) -> list[int]:
        """Each part's region, laying out anew where needed (see the module docstring)."""
        where = {id(c): j for j, c in enumerate(self._layout)}
        places = [where.get(id(c), -1) for c in caches]
        self._absent = [0 if j in places else n + 1 for j, n in enumerate(self._absent)]
        fits = -1 not in places and all(
            length <= self._caps[ck][j]
            for ck, ls in bounds.items()
            for j, length in zip(places, ls, strict=True)
        )
        if fits and max(self._absent, default=0) <= STALE:
            return places
        kept = [(c, j) for j, c in enumerate(self._layout) if 0 < self._absent[j] <= STALE]
        layout = [*caches, *(c for c, _ in kept)]
        # a region's room: its prefix, this step's tokens (a prompt's next chunk), and HEADROOM
        steps = [int(f["positions"].shape[0]) for f in feeds]
        caps = {
            ck: [n + s + HEADROOM for n, s in zip(ls, steps, strict=True)]
            + [self._valid[ck][j] + HEADROOM for _, j in kept]
            for ck, ls in bounds.items()
        }
        self._lay_out(layout, caps)
        return list(range(len(caches)))

    def _lay_out(self, layout: list[RingKVCache], caps: dict[int, list[int]]) -> None:
        kinds, specs = layout[0].kinds, layout[0].layers
        self._layout, self._absent = layout, [0] * len(layout)
        self.layouts += 1
        for ck, cs in caps.items():
            self._caps[ck] = [min(c, kinds[ck].capacity) for c in cs]
            if self.per_slot:
                self._caps[ck] = [max(self._caps[ck])] * len(cs)
            self._offsets[ck] = [int(x) for x in np.cumsum([0, *self._caps[ck][:-1]])]
            # nothing copied yet: every region is filled by its first step
            self._valid[ck] = [0] * len(layout)
        self._k, self._v, self._feeds = [], [], {}
        for i, ck in enumerate(layout[0].layer_kind):
            shape = (1, sum(self._caps[ck]), specs[i].n_kv_heads, specs[i].head_dim)
            size = int(np.prod(shape))
            k, v = self._buffers(i, size, layout[0].dtype)
            self._k.append(k[:size].reshape(shape))
            self._v.append(v[:size].reshape(shape))
            fed = (len(layout), self._caps[ck][0], *shape[2:]) if self.per_slot else shape
            self._feeds[f"past_key_{i}"] = self._k[i].reshape(fed)
            self._feeds[f"past_value_{i}"] = self._v[i].reshape(fed)

    def _buffers(self, i: int, size: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Layer i's flat K and V buffers of at least `size` elements (grown by a quarter when too small).
        Zeros: a masked column still meets the value matmul (0 x NaN would be NaN); columns a region does not
        fill hold zeros or an older layout's K/V, all finite."""
        while len(self._backing) <= i:
            self._backing.append((np.zeros(0, dtype), np.zeros(0, dtype)))
        k, v = self._backing[i]
        if k.size < size:
            # NOTE: small pages, resident only where a region's prefix is copied: a slot joining 3,000 tokens
            # deep made 4 regions' buffers (per slot: 4 x its room) fault in huge pages, 1.0 s of one step
            grown = size + size // 4
            self._backing[i] = k, v = small_page_zeros((grown,), dtype), small_page_zeros((grown,), dtype)
        return k, v
