"""Ring-buffer KV cache: slots, masks, windows, in-place writes, rollback, overflow policies, attention."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from edge.errors import ContextOverflowError
from edge.kvcache import LayerKind, LayerSpec, RingKVCache, RollbackError, StepView

# --- helpers ------------------------------------------------------------------------------------------------


def pattern(mask: np.ndarray, capacity: int) -> list[str]:
    """A mask [1, 1, q, capacity + q] as rows of 'x' (visible) / '.' (hidden), past | new."""
    rows = []
    for row in mask[0, 0]:
        cells = "".join("x" if m == 0 else "." for m in row)
        rows.append(f"{cells[:capacity]}|{cells[capacity:]}")
    return rows


def new_kv(cache: RingKVCache, q: int, rng: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    ks = [rng.standard_normal((1, q, s.n_kv_heads, s.head_dim)).astype(np.float32) for s in cache.layers]
    vs = [rng.standard_normal((1, q, s.n_kv_heads, s.head_dim)).astype(np.float32) for s in cache.layers]
    return ks, vs


def feed(cache: RingKVCache, n: int, chunk: int = 1, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    while n > 0:
        q = min(chunk, n)
        cache.begin(q)
        cache.commit(*new_kv(cache, q, rng))
        n -= q


def step_with(cache: RingKVCache, ks: list[np.ndarray], vs: list[np.ndarray]) -> None:
    cache.begin(ks[0].shape[1])
    cache.commit(ks, vs)


def snapshot(cache: RingKVCache) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    return (
        [b.copy() for b in cache.keys],
        [b.copy() for b in cache.values],
        [cache.positions(i) for i in range(len(cache.layers))],
    )


def assert_same_state(a: RingKVCache, b: RingKVCache) -> None:
    assert a.position == b.position
    for x, y in zip(snapshot(a), snapshot(b), strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)


def assert_snapshot(cache: RingKVCache, snap: tuple[list[np.ndarray], ...]) -> None:
    for x, y in zip(snapshot(cache), snap, strict=True):
        for u, v in zip(x, y, strict=True):
            np.testing.assert_array_equal(u, v)


G6 = LayerSpec(n_kv_heads=2, head_dim=4, capacity=6)

# --- slots --------------------------------------------------------------------------------------------------


def test_slot_assignment_with_sinks_before_and_after_wrap() -> None:
    cache = RingKVCache([G6], sink=2)  # ring of 4 slots after 2 sinks
    seen = {}
    for n in range(1, 12):
        feed(cache, 1, seed=n)
        seen[n] = cache.positions().tolist()
    assert seen[1] == [0, -1, -1, -1, -1, -1]
    assert seen[6] == [0, 1, 2, 3, 4, 5]
    assert seen[7] == [0, 1, 6, 3, 4, 5]
    assert seen[8] == [0, 1, 6, 7, 4, 5]
    assert seen[10] == [0, 1, 6, 7, 8, 9]
    assert seen[11] == [0, 1, 10, 7, 8, 9]
    assert cache.slots([0, 1, 2, 5, 6, 9, 10, 13]).tolist() == [0, 1, 2, 5, 2, 5, 2, 5]
    assert (cache.position, cache.fill, cache.capacity) == (11, 6, 6)

    chunked = RingKVCache([G6], sink=2)
    feed(chunked, 9, chunk=3)  # the chunk 6, 7, 8 wraps
    assert chunked.positions().tolist() == [0, 1, 6, 7, 8, 5]


def test_no_sinks_and_windowed_layers_take_no_sinks() -> None:
    cache = RingKVCache([G6, LayerSpec(2, 4, 4, window=4)], sink=2)
    feed(cache, 7)
    assert cache.positions(0).tolist() == [0, 1, 6, 3, 4, 5]
    assert cache.positions(1).tolist() == [4, 5, 6, 3]  # plain ring: a window never reaches the sinks
    assert cache.kinds == (LayerKind(6, None, 2), LayerKind(4, 4, 0))
    plain = RingKVCache([G6], sink=0)
    feed(plain, 7)
    assert plain.positions().tolist() == [6, 1, 2, 3, 4, 5]


# --- masks --------------------------------------------------------------------------------------------------


def test_masks_exact_before_and_after_wrap() -> None:
    cache = RingKVCache([G6], sink=2)
    view = cache.begin(3)
    assert view.positions.tolist() == [0, 1, 2]
    assert view.positions.dtype == np.int64
    assert view.mask(0).shape == (1, 1, 3, 9) and view.mask(0).dtype == np.float32
    assert pattern(view.mask(0), 6) == ["......|x..", "......|xx.", "......|xxx"]
    cache.commit(*new_kv(cache, 3, np.random.default_rng(0)))

    assert pattern(cache.begin(2).mask(0), 6) == ["xxx...|x.", "xxx...|xx"]
    feed(cache, 4)  # positions 0..6: slots [0, 1, 6, 3, 4, 5]
    view = cache.begin(2)  # tokens 7, 8; token 7 overwrites slot 3 (position 3), so token 8 must not see it
    assert view.positions.tolist() == [7, 8]
    assert pattern(view.mask(0), 6) == ["xxxxxx|x.", "xxx.xx|xx"]
    assert set(np.unique(view.mask(0)).tolist()) == {0.0, float("-inf")}


def test_masks_windowed_layer() -> None:
    cache = RingKVCache([LayerSpec(1, 2, 4, window=4)], sink=2)
    feed(cache, 5)  # slots [4, 1, 2, 3]
    view = cache.begin(2)  # tokens 5, 6 see positions > p - 4
    assert pattern(view.mask(0), 4) == ["x.xx|x.", "x..x|xx"]

    narrow = RingKVCache([LayerSpec(1, 2, 4, window=2)])
    assert pattern(narrow.begin(3).mask(0), 4) == ["....|x..", "....|xx.", "....|.xx"]


def test_mixed_layer_kinds_share_masks() -> None:
    g, loc = LayerSpec(2, 4, 8), LayerSpec(2, 4, 4, window=3)
    cache = RingKVCache([g, loc, loc, g], sink=1)
    assert cache.kinds == (LayerKind(8, None, 1), LayerKind(4, 3, 0))
    assert cache.layer_kind == (0, 1, 1, 0)
    assert cache.capacity == 8  # the local ring covers its window: it never limits the context
    assert cache.max_step == 4
    feed(cache, 6)
    view = cache.begin(2)
    assert len(view.masks) == 2
    assert view.mask(0).shape == (1, 1, 2, 10) and view.mask(1).shape == (1, 1, 2, 6)
    assert view.mask(1) is view.mask(2) and view.mask(0) is view.mask(3)
    assert cache.positions(1).tolist() == [4, 5, 2, 3]
    assert pattern(view.mask(1), 4) == ["xx..|x.", ".x..|xx"]
    assert pattern(view.mask(0), 8) == ["xxxxxx..|x.", "xxxxxx..|xx"]


# --- in-place writes ----------------------------------------------------------------------------------------


def test_commit_writes_only_the_new_slots() -> None:
    cache = RingKVCache([G6, G6], sink=2)
    rng = np.random.default_rng(1)
    feed(cache, 7)
    for q, n, want in ((3, 2, [3, 4]), (3, 3, [5, 2, 3])):  # padding column not written; then a wrap
        before = snapshot(cache)
        view = cache.begin(q, n_tokens=n)
        ks, vs = new_kv(cache, q, rng)
        cache.commit(ks, vs)
        assert cache.slots(view.positions[:n]).tolist() == want
        for layer in range(2):
            for buf, old, new in ((cache.keys, before[0], ks), (cache.values, before[1], vs)):
                changed = np.flatnonzero(np.any(buf[layer] != old[layer], axis=(0, 2, 3)))
                assert sorted(changed.tolist()) == sorted(want)
                np.testing.assert_array_equal(buf[layer][0, want], new[layer][0, :n])


def test_buffers_are_never_reallocated() -> None:
    cache = RingKVCache([G6, LayerSpec(1, 4, 3, window=3)], sink=2, dtype=np.float16)
    ids = [(id(b), b.ctypes.data) for b in (*cache.keys, *cache.values)]
    bound = [b[...] for b in (*cache.keys, *cache.values)]  # what a runtime holds after binding zero-copy
    assert all(b.dtype == np.float16 and b.flags.c_contiguous for b in bound)
    assert cache.keys[0].shape == (1, 6, 2, 4) and cache.keys[1].shape == (1, 3, 1, 4)
    feed(cache, 13, chunk=1)
    feed(cache, 6, chunk=2, seed=3)
    cache.rollback(5)
    cache.begin(2)  # abandoned step
    cache.reset()
    feed(cache, 9, chunk=3, seed=4)
    assert [(id(b), b.ctypes.data) for b in (*cache.keys, *cache.values)] == ids
    for view, buf in zip(bound, (*cache.keys, *cache.values), strict=True):
        assert np.shares_memory(view, buf)
        np.testing.assert_array_equal(view, buf)


def test_gather_hands_out_the_same_views_for_the_same_slots() -> None:
    """A runtime leaves an input bound while it is fed the same array object (devices/runners.py): gathering
    the same consecutive slots again returns the same views, which show what was written since; slots that
    are not consecutive (a wrap) are copies, made anew every time."""
    cache = RingKVCache([G6, G6], sink=2)
    feed(cache, 3)
    window = np.arange(2, 5)
    k1, v1 = cache.gather(window)
    k2, v2 = cache.gather(window)
    assert all(a is b for a, b in zip((*k1, *v1), (*k2, *v2), strict=True))
    assert all(np.shares_memory(k, buf) for k, buf in zip(k1, cache.keys, strict=True))
    rng = np.random.default_rng(5)
    ks, vs = new_kv(cache, 1, rng)
    step_with(cache, ks, vs)  # position 3 -> slot 3, inside the gathered window
    k3, _ = cache.gather(window)
    assert k3[0] is k1[0]
    np.testing.assert_array_equal(k3[0][0, 1], ks[0][0, 0])
    assert cache.gather(np.arange(3, 6))[0][0] is not k1[0]  # other slots: other views
    feed(cache, 4, seed=6)  # position 8: the ring (slots 2..5) has wrapped
    wrapped = np.arange(5, 8)  # slots 5, 2, 3
    a, b = cache.gather(wrapped)[0][0], cache.gather(wrapped)[0][0]
    assert a is not b and not np.shares_memory(a, cache.keys[0])
    np.testing.assert_array_equal(a, b)


def test_occupied_prefix_before_and_after_wrap() -> None:
    cache = RingKVCache([G6, LayerSpec(2, 4, 4, window=4), G6], sink=2)
    glob, local = cache.kinds
    assert (cache.occupied(0), cache.occupied(1), cache.occupied(glob)) == (0, 0, 0)
    for n in range(1, 10):
        feed(cache, 1, seed=n)
        want = (min(n, 6), min(n, 4), min(n, 6))
        assert tuple(cache.occupied(i) for i in range(3)) == want
        assert (cache.occupied(glob), cache.occupied(local)) == want[:2]
        for i in range(3):  # every occupied slot lies in the prefix, and its last slot is occupied
            valid = cache.valid(i)
            assert valid[: cache.occupied(i)].all() and not valid[cache.occupied(i) :].any()
    cache.rollback(3)  # position 6: the wrapped slots are restored, still all occupied
    assert (cache.occupied(0), cache.occupied(1)) == (6, 4)
    cache.reset()
    feed(cache, 5, chunk=3)
    cache.rollback(2)  # before the wrap: the prefix shrinks with the fill
    assert (cache.occupied(0), cache.occupied(1), cache.fill) == (3, 3, 3)
    with pytest.raises(ValueError, match="not a kind"):
        cache.occupied(LayerKind(5, None, 2))


def test_mask_prefix_is_the_full_mask_without_the_empty_slots() -> None:
    cache = RingKVCache([G6, LayerSpec(2, 4, 4, window=3)], sink=2)
    feed(cache, 3)
    view = cache.begin(2)
    for layer, capacity in ((0, 6), (1, 4)):
        full = view.mask(layer)
        for length in range(capacity + 1):
            prefix = view.mask_prefix(layer, length)
            assert prefix.shape == (1, 1, 2, length + 2) and prefix.dtype == np.float32
            np.testing.assert_array_equal(prefix[..., :length], full[..., :length])
            np.testing.assert_array_equal(prefix[..., length:], full[..., capacity:])
        assert view.mask_prefix(layer, capacity) is full
        with pytest.raises(ValueError, match="prefix length"):
            view.mask_prefix(layer, capacity + 1)
    assert pattern(view.mask_prefix(0, cache.occupied(0)), 3) == ["xxx|x.", "xxx|xx"]


def test_occupied_prefix_of_a_buffer_is_one_contiguous_block() -> None:
    cache = RingKVCache([G6, G6, LayerSpec(1, 4, 3, window=3)], sink=2, dtype=np.float16)
    for n in (0, 2, 3, 5):  # checked at positions 0, 2, 5 (before the wrap) and 10 (after)
        for layer in range(3):
            length = cache.occupied(layer)
            for buf in (cache.keys[layer], cache.values[layer]):
                prefix = buf[:, :length]
                assert prefix.flags.c_contiguous and prefix.ctypes.data == buf.ctypes.data
                assert prefix.nbytes == length * buf[0, 0].nbytes
                assert length == 0 or np.shares_memory(prefix, buf)
        feed(cache, n, seed=n)
    assert (cache.occupied(0), cache.occupied(2)) == (6, 3)


# --- rollback -----------------------------------------------------------------------------------------------


def test_rollback_after_wrap_is_bit_exact() -> None:
    layers = [G6, LayerSpec(2, 4, 3, window=3)]
    cache = RingKVCache(layers, sink=2, max_rollback=8)
    feed(cache, 9, seed=5)  # wrapped
    before = snapshot(cache)
    masks_before = cache.begin(2).masks
    rng = np.random.default_rng(6)
    for q in (3, 1, 2):  # wraps again, overwriting slots the rollback must restore
        step_with(cache, *new_kv(cache, q, rng))
    assert cache.positions(0).tolist() != before[2][0].tolist()
    cache.rollback(6)
    assert cache.position == 9
    assert_snapshot(cache, before)
    for a, b in zip(cache.begin(2).masks, masks_before, strict=True):
        np.testing.assert_array_equal(a, b)

    fresh = RingKVCache(layers, sink=2, max_rollback=8)
    feed(fresh, 9, seed=5)
    assert_same_state(cache, fresh)


def test_rollback_inside_a_chunk_equals_the_shorter_sequence() -> None:
    layers = [LayerSpec(1, 2, 5)]
    rng = np.random.default_rng(7)
    ks, vs = new_kv(RingKVCache(layers), 7, rng)
    cache = RingKVCache(layers, sink=1)
    for lo, hi in ((0, 3), (3, 7)):  # the second chunk wraps
        cache.begin(hi - lo)
        cache.commit([k[:, lo:hi] for k in ks], [v[:, lo:hi] for v in vs])
    cache.rollback(3)
    shorter = RingKVCache(layers, sink=1)
    for t in range(4):
        step_with(shorter, [k[:, t : t + 1] for k in ks], [v[:, t : t + 1] for v in vs])
    assert_same_state(cache, shorter)


def test_speculative_reject_then_continue_equals_never_drafting() -> None:
    layers = [LayerSpec(2, 4, 6)]
    cache, plain = RingKVCache(layers, sink=2), RingKVCache(layers, sink=2)
    feed(cache, 5, seed=1)
    feed(plain, 5, seed=1)
    feed(cache, 4, chunk=4, seed=2)  # draft wraps the ring, then is rejected
    cache.rollback(4)
    feed(cache, 3, seed=3)
    feed(plain, 3, seed=3)
    assert_same_state(cache, plain)


def test_truncate_beyond_the_undo_log_before_a_wrap_equals_the_shorter_sequence() -> None:
    """While no slot was written twice, any tail can be dropped: the state is the shorter sequence's, bit for bit;
    once the ring wraps, truncate reaches only as far as the undo log (rollback)."""
    layers = [LayerSpec(2, 4, 40), LayerSpec(1, 2, 40)]
    cache = RingKVCache(layers, sink=2, max_rollback=3)
    feed(cache, 30, chunk=7, seed=4)
    assert cache.rollback_limit == 3 and cache.truncate_limit == 30
    cache.truncate(25)
    shorter = RingKVCache(layers, sink=2, max_rollback=3)
    feed(shorter, 30, chunk=7, seed=4)  # the same first 5 tokens (the first chunk of 7 cut to 5 below)
    shorter.reset()
    rng = np.random.default_rng(4)
    ks, vs = new_kv(shorter, 7, rng)
    step_with(shorter, [k[:, :5] for k in ks], [v[:, :5] for v in vs])
    assert_same_state(cache, shorter)
    assert cache.rollback_limit == 3  # the undo log a prefill of the 5 kept would have left
    feed(cache, 3, seed=9)
    feed(shorter, 3, seed=9)
    assert_same_state(cache, shorter)

    feed(cache, 40, seed=1)  # wraps: slots now hold other positions
    assert cache.truncate_limit == cache.rollback_limit == 3
    with pytest.raises(RollbackError):
        cache.truncate(4)
    cache.truncate(3)
    assert cache.position == 45


def test_copy_prefix_equals_a_prefill_of_those_tokens() -> None:
    layers = [LayerSpec(2, 4, 40), LayerSpec(1, 2, 40)]
    src = RingKVCache(layers, sink=2)
    feed(src, 21, chunk=7, seed=4)
    dst = RingKVCache(layers, sink=2)
    feed(dst, 9, seed=8)  # whatever it held is emptied
    dst.copy_prefix(src, 14)
    shorter = RingKVCache(layers, sink=2)
    feed(shorter, 14, chunk=7, seed=4)
    assert_same_state(dst, shorter)
    feed(dst, 5, seed=3)
    feed(shorter, 5, seed=3)
    assert_same_state(dst, shorter)

    feed(src, 30, seed=1)  # wrapped: its first positions are gone from their slots
    with pytest.raises(RollbackError):
        dst.copy_prefix(src, 10)
    other = RingKVCache([LayerSpec(2, 4, 48), LayerSpec(1, 2, 40)], sink=2)
    feed(other, 3)
    with pytest.raises(ValueError, match="geometry"):
        dst.copy_prefix(other, 1)


def test_rollback_keeps_its_guarantee_after_a_copy_or_truncate_and_a_wrap() -> None:
    """A copy (or a deep truncate) leaves the undo log a prefill would have: after the ring wraps, rollback of
    max_rollback tokens still restores the state exactly."""
    layers = [LayerSpec(2, 4, 40)]
    src = RingKVCache(layers, sink=2, max_rollback=8)
    feed(src, 18, seed=2)
    copied = RingKVCache(layers, sink=2, max_rollback=8)
    copied.copy_prefix(src, 18)
    truncated = RingKVCache(layers, sink=2, max_rollback=8)
    feed(truncated, 30, seed=2)
    truncated.truncate(12)  # deep: beyond the 8-token undo log
    for cache in (copied, truncated):
        plain = RingKVCache(layers, sink=2, max_rollback=8)
        feed(plain, 18, seed=2)
        assert_same_state(cache, plain)
        assert cache.rollback_limit == plain.rollback_limit == 8
        feed(cache, 25, seed=5)  # wraps
        feed(plain, 25, seed=5)
        cache.rollback(8)
        plain.rollback(8)
        assert_same_state(cache, plain)
        cache.rollback(cache.rollback_limit)
        plain.rollback(plain.rollback_limit)
        assert_same_state(cache, plain)


def test_rollback_limits() -> None:
    cache = RingKVCache([G6], sink=2, max_rollback=3)
    feed(cache, 5)
    assert cache.rollback_limit == 3
    before = snapshot(cache)
    with pytest.raises(RollbackError, match=r"roll back 4 tokens.*max_rollback=3"):
        cache.rollback(4)
    assert_snapshot(cache, before)
    cache.rollback(2)
    assert (cache.position, cache.rollback_limit) == (3, 1)
    with pytest.raises(RollbackError):
        cache.rollback(2)
    cache.rollback(1)
    cache.rollback(0)
    with pytest.raises(RollbackError):
        cache.rollback(1)
    with pytest.raises(ValueError, match="negative"):
        cache.rollback(-1)

    feed(cache, 5, chunk=4)  # one commit larger than the log keeps only its tail
    assert cache.rollback_limit == 3
    cache.reset()
    with pytest.raises(RollbackError, match="seen only 0"):
        cache.rollback(1)
    none = RingKVCache([G6], max_rollback=0)
    feed(none, 2)
    assert none.rollback_limit == 0
    with pytest.raises(RollbackError):
        none.rollback(1)


def test_reset_equals_fresh() -> None:
    cache = RingKVCache([G6], sink=2)
    feed(cache, 9, chunk=2)
    cache.reset()
    assert (cache.position, cache.fill, cache.rollback_limit) == (0, 0, 0)
    assert_same_state(cache, RingKVCache([G6], sink=2))


# --- overflow policies and step limits ----------------------------------------------------------------------


def test_policy_error() -> None:
    cache = RingKVCache([LayerSpec(1, 2, 4), LayerSpec(1, 2, 2, window=3)], sink=1, policy="error")
    feed(cache, 3)
    assert (cache.capacity, cache.room(), cache.fits(1), cache.fits(2)) == (4, 1, True, False)
    before = snapshot(cache)
    with pytest.raises(ContextOverflowError, match=r"2 new tokens at position 3.*4 tokens, 1 left") as err:
        cache.begin(2)
    assert err.value.hint and "policy" in err.value.hint
    assert cache.position == 3
    assert_snapshot(cache, before)
    view = cache.begin(2, n_tokens=1)  # padding does not count
    cache.commit(*new_kv(cache, 2, np.random.default_rng(0)))
    assert (view.n_tokens, cache.position, cache.room(), cache.fill) == (1, 4, 0, 4)
    with pytest.raises(ContextOverflowError):
        cache.begin(1)

    windows_only = RingKVCache([LayerSpec(1, 2, 3, window=3)], policy="error")
    feed(windows_only, 20)  # evicting outside the window loses nothing: never an error
    assert (windows_only.capacity, windows_only.room(), windows_only.fits(10**9)) == (None, None, True)


def test_policy_truncate_never_evicts() -> None:
    cache = RingKVCache([LayerSpec(1, 2, 4)], sink=1, policy="truncate")
    feed(cache, 3)
    view = cache.begin(2)
    assert (view.n_tokens, view.n_requested, view.dropped) == (1, 2, 1)
    cache.commit(*new_kv(cache, 2, np.random.default_rng(0)))
    assert cache.positions().tolist() == [0, 1, 2, 3]
    assert (cache.position, cache.room(), cache.fits(1)) == (4, 0, False)
    before = snapshot(cache)
    view = cache.begin(1)
    assert (view.n_tokens, view.dropped) == (0, 1)
    cache.commit(*new_kv(cache, 1, np.random.default_rng(1)))
    assert cache.position == 4
    assert_snapshot(cache, before)
    cache.rollback(2)
    assert cache.positions().tolist() == [0, 1, -1, -1]


def test_policy_ring_goes_on_forever() -> None:
    cache = RingKVCache([LayerSpec(1, 2, 8)], sink=4)
    feed(cache, 40, chunk=3)
    assert (cache.position, cache.fill, cache.room(), cache.fits(1)) == (40, 8, 0, False)
    assert sorted(cache.positions().tolist()) == [0, 1, 2, 3, 36, 37, 38, 39]


def test_step_and_argument_errors() -> None:
    cache = RingKVCache([G6], sink=2)
    with pytest.raises(ValueError, match="at most 4 per step"):
        cache.begin(5)
    with pytest.raises(ValueError):
        cache.begin(0)
    with pytest.raises(ValueError, match="n_tokens"):
        cache.begin(2, n_tokens=3)
    with pytest.raises(RuntimeError, match="begin"):
        cache.commit(*new_kv(cache, 1, np.random.default_rng(0)))
    cache.begin(2)
    with pytest.raises(ValueError, match="expected"):
        cache.commit(*new_kv(cache, 1, np.random.default_rng(0)))
    cache.commit(*new_kv(cache, 2, np.random.default_rng(0)))  # the step is still pending after a bad commit
    assert cache.position == 2
    with pytest.raises(ValueError, match="capacity 2 must exceed sink 2"):
        RingKVCache([LayerSpec(1, 2, 2)], sink=2)
    with pytest.raises(ValueError, match="policy"):
        RingKVCache([G6], policy="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        RingKVCache([G6], dtype=np.int8)
    with pytest.raises(ValueError):
        LayerSpec(0, 4, 6)
    with pytest.raises(ValueError):
        LayerSpec(1, 4, 6, window=0)


def test_repr() -> None:
    cache = RingKVCache([G6, LayerSpec(2, 4, 4, window=4)], sink=2)
    feed(cache, 3)
    text = repr(cache)
    assert "2 layers" in text and "policy='ring'" in text and "position=3" in text and "window=4" in text


# --- attention through the cache ----------------------------------------------------------------------------


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Reference attention, slot-major: q [n, H, hd], k/v [m, kvh, hd] (GQA), mask [n, m] -> [n, H, hd]."""
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, axis=1).astype(np.float64), np.repeat(v, rep, axis=1).astype(np.float64)
    s = np.einsum("nhd,mhd->hnm", q.astype(np.float64), k) / np.sqrt(q.shape[-1]) + mask
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    return np.einsum("hnm,mhd->nhd", w / w.sum(axis=-1, keepdims=True), v)


def full_mask(n: int, visible: Callable[[int, int], bool]) -> np.ndarray:
    return np.array([[0.0 if visible(i, j) else -np.inf for j in range(n)] for i in range(n)])


def through_cache(cache: RingKVCache, q: np.ndarray, k: np.ndarray, v: np.ndarray, chunk: int) -> np.ndarray:
    """Run one layer's attention for a whole sequence chunk by chunk through the cache (static chunk width).

    Each chunk attends over the whole buffer and, as a graph binding only the occupied slots would, over the
    prefix keys[0][:, :occupied] with mask_prefix; both must agree."""
    n, outs = q.shape[0], []
    for lo in range(0, n, chunk):
        real = min(chunk, n - lo)
        pad = ((0, chunk - real), (0, 0), (0, 0))
        qc, kc, vc = (np.pad(x[lo : lo + real], pad) for x in (q, k, v))
        view = cache.begin(chunk, n_tokens=real)
        kk = np.concatenate([cache.keys[0][0], kc], axis=0)
        vv = np.concatenate([cache.values[0][0], vc], axis=0)
        out = attend(qc, kk, vv, view.mask(0)[0, 0])[:real]
        length = cache.occupied(0)
        kp = np.concatenate([cache.keys[0][0, :length], kc], axis=0)
        vp = np.concatenate([cache.values[0][0, :length], vc], axis=0)
        np.testing.assert_allclose(
            attend(qc, kp, vp, view.mask_prefix(0, length)[0, 0])[:real], out, rtol=1e-12, atol=1e-12
        )
        outs.append(out)
        cache.commit([kc[None]], [vc[None]])
    return np.concatenate(outs, axis=0)


def qkv(n: int, heads: int = 4, kvh: int = 2, hd: int = 8, seed: int = 0) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(
        rng.standard_normal(s).astype(np.float32) for s in ((n, heads, hd), (n, kvh, hd), (n, kvh, hd))
    )


def test_attention_before_wrap_equals_causal_attention() -> None:
    q, k, v = qkv(10)
    want = attend(q, k, v, full_mask(10, lambda i, j: j <= i))
    for chunk in (1, 3, 4):
        cache = RingKVCache([LayerSpec(2, 8, 16)], sink=2)
        np.testing.assert_allclose(through_cache(cache, q, k, v, chunk), want, rtol=1e-5, atol=1e-6)


def test_attention_with_window_equals_windowed_attention() -> None:
    q, k, v = qkv(14, seed=1)
    want = attend(q, k, v, full_mask(14, lambda i, j: i - 4 < j <= i))
    for capacity, chunk in ((4, 1), (4, 3), (3, 3), (6, 5)):  # capacity window-1 suffices; the ring wraps
        cache = RingKVCache([LayerSpec(2, 8, capacity, window=4)])
        np.testing.assert_allclose(through_cache(cache, q, k, v, chunk), want, rtol=1e-5, atol=1e-6)


def test_attention_after_wrap_is_sinks_plus_recent_for_any_chunking() -> None:
    q, k, v = qkv(15, seed=2)
    sink, capacity = 2, 6  # every token sees the 2 sinks, the last 4 tokens before it, and itself
    want = attend(q, k, v, full_mask(15, lambda i, j: j <= i and (j < sink or j >= i - (capacity - sink))))
    for chunk in (1, 2, 4):
        cache = RingKVCache([LayerSpec(2, 8, capacity)], sink=sink)
        np.testing.assert_allclose(through_cache(cache, q, k, v, chunk), want, rtol=1e-5, atol=1e-6)


# --- randomized: begin/commit/rollback/reset vs a list with the same eviction rule --------------------------

CONFIGS = [
    {"layers": (LayerSpec(1, 2, 6), LayerSpec(2, 3, 6)), "sink": 2, "policy": "ring", "max_rollback": 3},
    {
        "layers": (LayerSpec(2, 2, 5), LayerSpec(1, 3, 3, window=3), LayerSpec(2, 2, 5)),
        "sink": 1,
        "policy": "ring",
        "max_rollback": 5,
        "dtype": np.float16,
    },
    {
        "layers": (LayerSpec(1, 2, 4, window=6),),
        "sink": 0,
        "policy": "ring",
        "max_rollback": 4,
    },  # lossy window
    {
        "layers": (LayerSpec(1, 2, 6), LayerSpec(1, 2, 3, window=4)),
        "sink": 2,
        "policy": "error",
        "max_rollback": 4,
    },
    {
        "layers": (LayerSpec(1, 2, 5), LayerSpec(1, 2, 2, window=3)),
        "sink": 1,
        "policy": "truncate",
        "max_rollback": 2,
    },
    {"layers": (LayerSpec(1, 2, 3, window=2),), "sink": 0, "policy": "error", "max_rollback": 3},
    {"layers": (LayerSpec(1, 2, 4, window=6),), "sink": 0, "policy": "truncate", "max_rollback": 6},
]


def ref_sink(spec: LayerSpec, sink: int) -> int:
    return 0 if spec.window is not None else sink


def ref_limit(cfg: dict) -> int | None:
    """Tokens held before eviction could drop one a later query needs: global layers and windows wider than
    their ring are bounded by their capacity."""
    bounded = [
        s.capacity
        for s in cfg["layers"]
        if s.window is None or s.capacity - ref_sink(s, cfg["sink"]) < s.window - 1
    ]
    return min(bounded) if bounded else None


def ref_held(positions: list[int], spec: LayerSpec, sink: int) -> list[int]:
    """Feed positions into a list one at a time; past `capacity`, drop the oldest non-sink one."""
    s = ref_sink(spec, sink)
    held: list[int] = []
    for p in positions:
        held.append(p)
        if len(held) > spec.capacity:
            held.remove(next(x for x in held if x >= s))
    return held


class CacheMachine(RuleBasedStateMachine):
    @initialize(index=st.integers(0, len(CONFIGS) - 1))
    def setup(self, index: int) -> None:
        self.cfg = CONFIGS[index]
        self.cache = RingKVCache(**self.cfg)
        self.buffer_ids = [b.ctypes.data for b in (*self.cache.keys, *self.cache.values)]
        self.history: list[
            tuple[list[np.ndarray], list[np.ndarray]]
        ] = []  # per token per layer K, V [kvh, hd]
        self.undoable = 0
        self.rng = np.random.default_rng(index)

    def expected_mask(self, layer: int, view: StepView, slot_pos: np.ndarray) -> np.ndarray:
        spec, start = self.cfg["layers"][layer], len(self.history)
        rows = []
        for i, p in enumerate(view.positions.tolist()):
            # what one-at-a-time decoding would hold when token i comes: the past, then the step's earlier tokens
            held = set(ref_held(list(range(start + i)), spec, self.cfg["sink"])) | {p}
            if spec.window is not None:
                held = {x for x in held if x > p - spec.window}
            past = [s >= 0 and s in held for s in slot_pos.tolist()]
            new = [j <= i and x in held for j, x in enumerate(view.positions.tolist())]
            rows.append(past + new)
        return np.where(np.array(rows), 0.0, -np.inf)[None, None]

    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        q = data.draw(st.integers(1, self.cache.max_step), label="q")
        n = data.draw(st.integers(0, q), label="n_tokens")
        limit, start = ref_limit(self.cfg), len(self.history)
        room = None if limit is None else max(0, limit - start)
        if room is not None and n > room and self.cfg["policy"] == "error":
            with pytest.raises(ContextOverflowError):
                self.cache.begin(q, n)
            return
        accepted = n if room is None or n <= room or self.cfg["policy"] == "ring" else room
        slot_pos = [self.cache.positions(i) for i in range(len(self.cfg["layers"]))]
        view = self.cache.begin(q, n)
        assert (view.n_tokens, view.positions.tolist()) == (accepted, list(range(start, start + q)))
        for layer in range(len(self.cfg["layers"])):
            np.testing.assert_array_equal(view.mask(layer), self.expected_mask(layer, view, slot_pos[layer]))
            # slots past occupied() are hidden, so the prefix mask is the full one without them
            length, capacity = self.cache.occupied(layer), slot_pos[layer].shape[0]
            assert np.all(view.mask(layer)[..., length:capacity] == -np.inf)
            np.testing.assert_array_equal(
                view.mask_prefix(layer, length),
                np.concatenate([view.mask(layer)[..., :length], view.mask(layer)[..., capacity:]], axis=-1),
            )
        ks, vs = new_kv(self.cache, q, self.rng)
        self.cache.commit(ks, vs)
        for t in range(accepted):
            self.history.append(([k[0, t] for k in ks], [v[0, t] for v in vs]))
        self.undoable = min(self.undoable + accepted, self.cfg["max_rollback"])

    @rule(data=st.data())
    def abandon_step(self, data: st.DataObject) -> None:
        q = data.draw(st.integers(1, self.cache.max_step), label="q")
        try:
            self.cache.begin(q, 0)
        except ContextOverflowError:  # pragma: no cover - n_tokens=0 always fits
            raise AssertionError("an empty step overflowed") from None

    @rule(data=st.data())
    def rollback(self, data: st.DataObject) -> None:
        # mostly rollbacks within the log (speculative rejections), sometimes past it
        within = st.integers(0, min(self.undoable + 1, len(self.history) + 1))
        k = data.draw(st.one_of(within, within, st.integers(0, len(self.history) + 1)), label="k")
        if k > self.undoable:
            with pytest.raises(RollbackError):
                self.cache.rollback(k)
            return
        if k and self.cache.fill < len(self.history):
            event("rollback after a wrap")
        self.cache.rollback(k)
        del self.history[len(self.history) - k :]
        self.undoable -= k

    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        if data.draw(st.integers(0, 3), label="rare") != 0:  # rarely, so sequences grow past a wrap
            return
        self.cache.reset()
        self.history.clear()
        self.undoable = 0

    @invariant()
    def matches_reference(self) -> None:
        cache, sink = self.cache, self.cfg["sink"]
        assert cache.position == len(self.history)
        assert cache.rollback_limit == self.undoable
        limit = ref_limit(self.cfg)
        assert cache.room() == (None if limit is None else max(0, limit - len(self.history)))
        assert [b.ctypes.data for b in (*cache.keys, *cache.values)] == self.buffer_ids
        for layer, spec in enumerate(self.cfg["layers"]):
            held = ref_held(list(range(len(self.history))), spec, sink)
            pos = cache.positions(layer)
            assert sorted(pos[pos >= 0].tolist()) == held
            valid, length = cache.valid(layer), cache.occupied(layer)
            assert not valid[length:].any() and (length == 0 or valid[length - 1])  # the smallest such prefix
            assert cache.occupied(cache.kinds[cache.layer_kind[layer]]) == length
            for slot, p in enumerate(pos.tolist()):
                if p >= 0:
                    ks, vs = self.history[p]
                    np.testing.assert_array_equal(cache.keys[layer][0, slot], ks[layer].astype(cache.dtype))
                    np.testing.assert_array_equal(cache.values[layer][0, slot], vs[layer].astype(cache.dtype))
        # Bit-exact, empty slots included: a fresh cache fed the same tokens one by one.
        fresh = RingKVCache(**self.cfg)
        for ks, vs in self.history:
            step_with(fresh, [k[None, None] for k in ks], [v[None, None] for v in vs])
        assert_same_state(cache, fresh)


CacheMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_cache_machine = CacheMachine.TestCase


def test_moved_below_says_which_changes_reached_the_positions_read() -> None:
    """What a reader that did not hold the cache still (a sibling slot copying a prefix) learns: appends never
    count; a rollback counts below where it rolled back to; a reset counts everywhere; a log that no longer
    reaches back to the reader's epoch counts as moved."""
    cache = RingKVCache([LayerSpec(n_kv_heads=2, head_dim=4, capacity=256)], max_rollback=4)
    feed(cache, 40)
    since = cache.epoch
    feed(cache, 3)
    assert not cache.moved_below(40, since)
    cache.rollback(2)  # back to 41
    assert not cache.moved_below(41, since) and cache.moved_below(42, since)
    since = cache.epoch
    cache.truncate(30)  # to 11, past the undo log: the freed slots are zeroed
    assert cache.moved_below(12, since) and not cache.moved_below(11, since)
    since = cache.epoch
    cache.reset()
    assert cache.moved_below(1, since)
    since = cache.epoch
    for _ in range(70):  # more changes than the log keeps
        feed(cache, 1)
        cache.rollback(1)
    assert cache.moved_below(0, since)
    since = cache.epoch
    cache._begin_move(5)  # a change under way when the reader looks: whatever it reads may be torn
    assert cache.moved_below(1, cache.epoch)
    cache._end_move()


def test_a_wrap_evicting_a_position_counts_as_a_move() -> None:
    cache = RingKVCache([LayerSpec(n_kv_heads=2, head_dim=4, capacity=16)], sink=2)
    feed(cache, 16)
    since = cache.epoch
    feed(cache, 1)  # slot 2 (position 2) is overwritten by position 16
    assert cache.moved_below(3, since) and not cache.moved_below(2, since)


def test_written_slots_are_a_range_per_kind() -> None:
    cache = RingKVCache([LayerSpec(n_kv_heads=2, head_dim=4, capacity=16)], sink=2)
    assert cache.take_written() == ((0, 16),)  # a new cache: everything
    feed(cache, 16)
    cache.take_written()
    feed(cache, 2)  # wraps: positions 16, 17 go to slots 2, 3
    assert cache.take_written() == ((2, 4),) and cache.take_written() == ((16, 0),)
