"""The batch engine's packed past (devices/past_arena.py): after any sequence of ring operations (steps,
wraps, rollbacks, truncation, a copied prefix, a reset), each slot's region equals its ring's bound prefix bit
for bit, and a decode step that writes beyond the bound prefixes copies nothing and feeds the same arrays."""

from __future__ import annotations

import itertools

import numpy as np

from edge.devices.past_arena import STALE, PastArena
from edge.kvcache import RingKVCache
from edge.kvcache.spec import LayerSpec
from edge.kvcache.staging import bound_prefix

# a global layer and a sliding-window one: two kinds, two layouts
LAYERS = [LayerSpec(2, 4, capacity=96), LayerSpec(2, 4, capacity=24, window=16), LayerSpec(2, 4, capacity=96)]
MASKS = {0: 0, 1: 1}  # mask kind -> a layer of it


def _step(cache: RingKVCache, n: int, rng: np.random.Generator) -> None:
    cache.begin(n)
    new = [rng.standard_normal((1, n, 2, 4)).astype(np.float32) for _ in cache.layers]
    cache.commit(new, [x * 2 for x in new])


def _feeds(cache: RingKVCache, grain: int = 8) -> dict[str, np.ndarray]:
    out = {"positions": np.arange(cache.position, cache.position + 1)}
    for i in range(len(LAYERS)):
        b = bound_prefix(cache.kinds[cache.layer_kind[i]].capacity, cache.occupied(i), grain)
        out[f"past_key_{i}"], out[f"past_value_{i}"] = cache.keys[i][:, :b], cache.values[i][:, :b]
    return out


def _check(arena: PastArena, caches: list[RingKVCache]) -> None:
    """Pack `caches` (a step's parts): each part's columns equal its ring's bound prefix, and no two parts'
    columns overlap."""
    feeds = [_feeds(c) for c in caches]
    packed = arena.past(caches, feeds, MASKS)
    for name, (starts, width) in packed.columns.items():
        layer = MASKS[int(name.removeprefix("mask_"))]
        spans = sorted((a, a + f[f"past_key_{layer}"].shape[1]) for a, f in zip(starts, feeds, strict=True))
        assert all(b <= a2 for (_, b), (a2, _) in itertools.pairwise(spans)) and spans[-1][1] <= width
    for i in range(len(LAYERS)):
        starts, width = packed.columns[f"mask_{caches[0].layer_kind[i]}"]
        assert packed.feeds[f"past_key_{i}"].shape[1] == width
        for f, at in zip(feeds, starts, strict=True):
            for kv in ("key", "value"):
                want = f[f"past_{kv}_{i}"]
                got = packed.feeds[f"past_{kv}_{i}"][:, at : at + want.shape[1]]
                np.testing.assert_array_equal(got, want)


def test_regions_follow_their_rings_through_every_operation() -> None:
    rng = np.random.default_rng(0)
    caches = [RingKVCache(LAYERS, sink=2, max_rollback=6) for _ in range(3)]
    arena = PastArena()
    for c in caches:
        _step(c, int(rng.integers(1, 20)), rng)
    for _ in range(300):
        c = caches[int(rng.integers(len(caches)))]
        op = rng.random()
        if op < 0.6:
            _step(c, int(rng.integers(1, 9)), rng)  # past the capacity: the ring wraps
        elif op < 0.8 and c.rollback_limit:
            c.rollback(int(rng.integers(1, c.rollback_limit + 1)))
        elif op < 0.86 and c.truncate_limit:
            c.truncate(int(rng.integers(1, c.truncate_limit + 1)))
        elif op < 0.93:
            src = caches[int(rng.integers(len(caches)))]
            if src is not c and src.position and src.truncate_limit == src.position:
                c.copy_prefix(src, int(rng.integers(1, src.position + 1)))
        else:
            c.reset()
            _step(c, int(rng.integers(1, 9)), rng)
        # a step's parts: often all, else some (a slot still sampling, or idle long enough to lose its region)
        parts = [x for x in caches if rng.random() < 0.7] or [c]
        _check(arena, parts if rng.random() < 0.5 else caches)
    assert arena.layouts < 150  # not laid out anew every step


def test_a_step_past_the_bound_prefixes_copies_nothing() -> None:
    rng = np.random.default_rng(1)
    caches = [RingKVCache(LAYERS[:1], sink=2) for _ in range(2)]
    for c in caches:
        _step(c, 16, rng)
    arena = PastArena()
    one = np.zeros(1, np.int64)
    feeds = [
        {"past_key_0": c.keys[0][:, :16], "past_value_0": c.values[0][:, :16], "positions": one}
        for c in caches
    ]
    first = arena.past(caches, feeds, {0: 0}).feeds
    for c in caches:  # a decode step writes slot 16, beyond the bound prefix [0, 16)
        _step(c, 1, rng)
    copied = arena.copied
    again = arena.past(caches, feeds, {0: 0}).feeds
    assert arena.copied == copied == 2 * 16  # both prefixes once, when laid out
    assert all(again[k] is first[k] for k in first)  # the same arrays: a runner keeps them bound
    caches[0].rollback(1)  # undoes slot 16 only: still nothing to copy
    caches[1].rollback(2)  # restores slot 15, inside the prefix: that column is copied again
    arena.past(caches, feeds, {0: 0})
    assert arena.copied == copied + 1
    assert arena.layouts == 1


def test_a_slot_sitting_out_keeps_its_region_until_stale() -> None:
    rng = np.random.default_rng(2)
    caches = [RingKVCache(LAYERS, sink=2) for _ in range(3)]
    for c in caches:
        _step(c, 10, rng)
    arena = PastArena()
    _check(arena, caches)
    for _ in range(STALE):  # the third sits out: its region stays (masked), nothing is laid out anew
        _check(arena, caches[:2])
    _check(arena, caches)
    assert arena.layouts == 1
    for _ in range(STALE + 1):  # its request ended: the layout drops it once, not every step
        _check(arena, caches[:2])
    assert arena.layouts == 2


def test_per_slot_regions_are_batch_entries_equal_to_their_rings() -> None:
    """For a graph with attention per slot: every region has the same room, the past is fed as [regions, room,
    kvh, hd], and each part's entry (`Packed.regions`) equals its ring's bound prefix through the operations."""
    rng = np.random.default_rng(1)
    caches = [RingKVCache(LAYERS, sink=2, max_rollback=6) for _ in range(3)]
    arena = PastArena(per_slot=True)
    for _ in range(200):
        c = caches[int(rng.integers(len(caches)))]
        if rng.random() < 0.8 or not c.rollback_limit:
            _step(c, int(rng.integers(1, 9)), rng)
        else:
            c.rollback(int(rng.integers(1, c.rollback_limit + 1)))
        parts = [x for x in caches if rng.random() < 0.7] or [c]
        feeds = [_feeds(x) for x in parts]
        packed = arena.past(parts, feeds, MASKS)
        assert len(set(packed.regions)) == len(parts)
        for i in range(len(LAYERS)):
            fed = packed.feeds[f"past_key_{i}"]
            starts, width = packed.columns[f"mask_{parts[0].layer_kind[i]}"]
            assert width == fed.shape[0] * fed.shape[1]  # regions x room, back to back
            for f, r, at in zip(feeds, packed.regions, starts, strict=True):
                assert at == r * fed.shape[1]
                for kv in ("key", "value"):
                    want = f[f"past_{kv}_{i}"][0]
                    np.testing.assert_array_equal(packed.feeds[f"past_{kv}_{i}"][r, : want.shape[0]], want)
