"""Fixed-capacity ring-buffer KV cache for static-shape decoder graphs.

Per layer one K and one V buffer [1, capacity, n_kv_heads, head_dim] (slot-major), allocated once and only
ever written in place, so a graph runtime can bind them zero-copy. A step is `begin(q)` -> run the graph on
(past buffers, masks, positions) -> `commit(new_k, new_v)` with the q new tokens' K/V the graph returned. K
arrives already rotated (RoPE at the absolute position), so slot order does not matter; the cache tracks each
slot's position.

NOTE: slot-major so a slot prefix buf[:, :L] is one contiguous block: a runtime binds only the occupied slots
(`occupied()`, `StepView.mask_prefix()`) zero-copy, and decode cost follows the fill, not the capacity.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numpy.typing import DTypeLike

from edge.errors import ContextOverflowError

from .pages import small_page_zeros
from .spec import POLICIES, LayerKind, LayerSpec, OverflowPolicy

GatheredKV = tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]  # per layer K, per layer V
NEG_INF = np.float32(-np.inf)


class RollbackError(ValueError):
    """Rolling back more tokens than the cache holds or than its undo log keeps."""


@dataclass(frozen=True, eq=False)
class StepView:
    """What the graph needs for one step of q tokens (q = the graph's static width).

    Columns [0, n_tokens) are real tokens; the rest is padding the graph computes but `commit` does not store."""

    positions: np.ndarray  # [q] int64 absolute positions (for RoPE); padding continues the count
    layer_kind: tuple[int, ...]  # layer -> index into masks
    n_tokens: int  # tokens commit() will store
    n_requested: int  # tokens asked for; more than n_tokens when policy 'truncate' dropped some
    kinds: tuple[LayerKind, ...]  # the cache's kinds and each one's slot positions at begin() (copies)
    slot_pos: tuple[np.ndarray, ...]

    @cached_property
    def masks(self) -> tuple[np.ndarray, ...]:
        """Per kind [1, 1, q, capacity + q] float32: 0 visible, -inf hidden. Built on first use: a staged
        graph's windowed step builds its own (kvcache/staging.py), and this is on every decode step."""
        return tuple(_mask(k, sp, self.positions) for k, sp in zip(self.kinds, self.slot_pos, strict=True))

    @property
    def q_len(self) -> int:
        return int(self.positions.shape[0])

    @property
    def dropped(self) -> int:
        return self.n_requested - self.n_tokens

    def mask(self, layer: int) -> np.ndarray:
        return self.masks[self.layer_kind[layer]]

    def mask_prefix(self, layer: int, length: int) -> np.ndarray:
        """The mask over past slots [0, length) ++ the q new tokens, [1, 1, q, length + q]; pair it with the
        buffer prefix keys[layer][:, :length] (length = the cache's `occupied(layer)` between begin and commit).
        The full mask itself when length is the capacity, else a new array."""
        mask = self.mask(layer)
        capacity = mask.shape[-1] - self.q_len
        if not 0 <= length <= capacity:
            raise ValueError(f"prefix length must be in [0, {capacity}], got {length}")
        if length == capacity:
            return mask
        return np.concatenate([mask[..., :length], mask[..., capacity:]], axis=-1)


@dataclass(frozen=True)
class _Group:
    """Layers of one kind and one [kvh, hd] stored as one array [n, 1, capacity, kvh, hd] per K and V, so a
    step moves all of them in one numpy call; each layer's buffer is a contiguous view into it."""

    kind: int
    layers: tuple[int, ...]
    k: np.ndarray
    v: np.ndarray


@dataclass
class _Undo:
    """What one commit overwrote, for its last n tokens: per kind the slots and their old positions, per group
    the old K/V [n_layers, n, kvh, hd]. Slots within one commit are distinct, so any suffix restores alone."""

    slots: list[np.ndarray]
    old_pos: list[np.ndarray]
    old_k: list[np.ndarray]
    old_v: list[np.ndarray]

    @property
    def n(self) -> int:
        return int(self.slots[0].shape[0])

    def sliced(self, sl: slice) -> _Undo:
        return _Undo(
            [s[sl] for s in self.slots],
            [p[sl] for p in self.old_pos],
            [k[:, sl] for k in self.old_k],
            [v[:, sl] for v in self.old_v],
        )


def _index(slots: np.ndarray) -> slice | np.ndarray:
    """A slice when the slots are consecutive (no wrap inside the step), else the index array.

    Slots of consecutive positions rise by one except for at most one drop at the wrap (a step is no longer
    than the ring), so comparing the ends is enough."""
    n = int(slots.shape[0])
    if n and int(slots[-1]) - int(slots[0]) == n - 1:
        return slice(int(slots[0]), int(slots[0]) + n)
    return slots


class RingKVCache:
    """Ring-buffer KV cache: fixed capacity per layer, attention sinks, sliding windows, rollback after a wrap.

    `sink` pinned slots apply to global layers; windowed layers take none (a window never reaches them).
    Overflow (`policy`), judged by `room()`: the tokens that can still come in before a commit would evict one a
    later query could attend to (None: never, every layer is a window its ring covers):
      ring      evict the oldest non-sink tokens (StreamingLLM); never refuses a step.
      error     begin() raises ContextOverflowError, state unchanged.
      truncate  never evict: begin() admits only room() tokens (view.n_tokens, 0 when full), the rest of the
                step is padding; the caller ends generation (view.dropped > 0) or left-truncates its prompt up
                front with fits()/room().
    The undo log keeps what the last `max_rollback` tokens overwrote (slot, K, V, position), so rollback(k)
    restores the exact previous state even after the ring wrapped.
    """

    def __init__(
        self,
        layers: Sequence[LayerSpec],
        *,
        sink: int = 4,
        policy: OverflowPolicy = "ring",
        max_rollback: int = 16,
        dtype: DTypeLike = np.float32,
    ) -> None:
        if not layers:
            raise ValueError("RingKVCache needs at least one layer")
        if sink < 0:
            raise ValueError(f"sink must be >= 0, got {sink}")
        if policy not in POLICIES:
            raise ValueError(f"unknown overflow policy {policy!r}; expected one of {', '.join(POLICIES)}")
        if max_rollback < 0:
            raise ValueError(f"max_rollback must be >= 0, got {max_rollback}")
        self._dtype = np.dtype(dtype)
        if self._dtype.kind != "f":
            raise ValueError(f"KV dtype must be a float type, got {self._dtype}")
        self._specs = tuple(layers)
        self._sink = sink
        self._policy: OverflowPolicy = policy
        self._max_rollback = max_rollback

        index: dict[LayerKind, int] = {}
        layer_kind = []
        for i, spec in enumerate(self._specs):
            kind = LayerKind(spec.capacity, spec.window, 0 if spec.window is not None else sink)
            if kind.ring < 1:
                raise ValueError(f"layer {i}: capacity {spec.capacity} must exceed sink {sink}")
            layer_kind.append(index.setdefault(kind, len(index)))
        self._kinds = tuple(index)
        self._layer_kind = tuple(layer_kind)
        bounded = [k.capacity for k in self._kinds if not k.lossless]
        self._limit: int | None = min(bounded) if bounded else None

        members: dict[tuple[int, int, int], list[int]] = {}
        for i, spec in enumerate(self._specs):
            members.setdefault((self._layer_kind[i], spec.n_kv_heads, spec.head_dim), []).append(i)
        self._groups: list[_Group] = []
        k_views: list[np.ndarray] = [np.empty(0)] * len(self._specs)
        v_views = list(k_views)
        for (ki, kvh, hd), idx in members.items():
            shape = (len(idx), 1, self._kinds[ki].capacity, kvh, hd)
            group = _Group(
                ki, tuple(idx), small_page_zeros(shape, self._dtype), small_page_zeros(shape, self._dtype)
            )
            self._groups.append(group)
            for j, layer in enumerate(idx):
                k_views[layer], v_views[layer] = group.k[j], group.v[j]
        self._k, self._v = tuple(k_views), tuple(v_views)
        # the last gather of consecutive slots: (their slices per group, the views returned)
        self._gathered: tuple[tuple[tuple[int, int] | None, ...], GatheredKV] | None = None
        self._slot_pos = tuple(np.full(k.capacity, -1, np.int64) for k in self._kinds)
        self._position = 0
        self._high = 0  # the highest position count reached since the reset: while <= every capacity, no slot
        # was ever written twice, so any tail can be dropped by freeing its slots (truncate)
        self._undo: deque[_Undo] = deque()
        self._undo_tokens = 0
        self._pending: StepView | None = None
        # per kind, the slots [lo, hi) whose K/V changed since the last take_written() (all at first): what a
        # copy of this cache kept elsewhere must refresh (devices/past_arena.py)
        self._written = [(0, k.capacity) for k in self._kinds]
        # a seqlock over what changes positions below `position` (rollback, truncate, copy_prefix, reset, a
        # wrap evicting a position): odd while such a change is under way, and a log of the lowest position
        # each reached: a reader that did not hold the cache still (a sibling slot copying its prefix) sees
        # whether what it read moved (`moved_below`); appending never counts
        self.epoch = 0
        self._depth = 0  # brackets open (changing)
        self._moves: deque[tuple[int, int]] = deque(maxlen=64)  # (epoch, lowest position changed)

    # --- geometry and state -------------------------------------------------------------------------------

    @property
    def layers(self) -> tuple[LayerSpec, ...]:
        return self._specs

    @property
    def kinds(self) -> tuple[LayerKind, ...]:
        return self._kinds

    @property
    def layer_kind(self) -> tuple[int, ...]:
        return self._layer_kind

    @property
    def keys(self) -> tuple[np.ndarray, ...]:
        """Per layer the K buffer [1, capacity, kvh, hd]; bind it (or its prefix [:, :L]), never replace it."""
        return self._k

    @property
    def values(self) -> tuple[np.ndarray, ...]:
        return self._v

    @property
    def policy(self) -> OverflowPolicy:
        return self._policy

    @property
    def sink(self) -> int:
        return self._sink

    @property
    def max_rollback(self) -> int:
        return self._max_rollback

    @property
    def dtype(self) -> np.dtype:
        return self._dtype

    @property
    def position(self) -> int:
        """Tokens committed so far (the next token's absolute position)."""
        return self._position

    @property
    def capacity(self) -> int | None:
        """Tokens the cache holds before an eviction could lose one (the context length); None: unbounded."""
        return self._limit

    @property
    def fill(self) -> int:
        """Occupied slots in the layers that bound the context (the smallest bounded kind, else the largest)."""
        return int(np.count_nonzero(self._slot_pos[self._primary()] >= 0))

    @property
    def max_step(self) -> int:
        """The most tokens one step may carry: a step must not overwrite its own slots."""
        return min(k.ring for k in self._kinds)

    @property
    def rollback_limit(self) -> int:
        """How many tokens rollback() can undo right now."""
        return self._undo_tokens

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._k) + sum(b.nbytes for b in self._v)

    def room(self) -> int | None:
        """Tokens that can still come in without evicting one a later query could attend to; None: unbounded."""
        return None if self._limit is None else max(0, self._limit - self._position)

    def fits(self, n: int) -> bool:
        """Whether n more tokens fit without such an eviction (ring would evict, error raise, truncate drop)."""
        room = self.room()
        return room is None or n <= room

    def positions(self, layer: int = 0) -> np.ndarray:
        """Absolute position held by each slot of a layer [capacity] int64, -1 for empty (a copy)."""
        return self._slot_pos[self._layer_kind[layer]].copy()

    def valid(self, layer: int = 0) -> np.ndarray:
        """Occupied slots of a layer [capacity] bool."""
        return self._slot_pos[self._layer_kind[layer]] >= 0

    def occupied(self, layer_or_kind: int | LayerKind) -> int:
        """Length L of the smallest slot prefix [0, L) holding every occupied slot of a layer (int) or a kind:
        the fill before the ring wraps, the capacity after. Slots [L, capacity) are empty and hidden by every
        mask, so attention over keys[layer][:, :L] with `StepView.mask_prefix(layer, L)` equals attention over
        the whole buffer; between begin() and commit() it is the past the step attends to."""
        kind = (
            layer_or_kind
            if isinstance(layer_or_kind, LayerKind)
            else self._kinds[self._layer_kind[layer_or_kind]]
        )
        if kind not in self._kinds:
            raise ValueError(f"{kind} is not a kind of this cache")
        # Every state equals a fresh cache fed positions [0, position) (rollback restores bit-exactly, truncate
        # and error never evict), and those fill slots [0, position) until the ring wraps.
        return min(self._position, kind.capacity)

    def slots(self, positions: np.ndarray | Sequence[int], layer: int = 0) -> np.ndarray:
        """The slot each absolute position is written to in a layer."""
        return self._slots(self._kinds[self._layer_kind[layer]], np.asarray(positions, np.int64))

    def gather(self, positions: np.ndarray) -> GatheredKV:
        """Per layer the K and V [1, n, kvh, hd] of the slots these consecutive positions map to: views of the
        buffers when the slots are consecutive too, else copies (one numpy take per group). A slot holds whatever
        was last written there, so callers mask what they did not write; read them before the next commit.
        Asked for the same slots again, it returns the same view objects (a runtime then keeps them bound)."""
        pos = np.asarray(positions, np.int64)
        indices = [_index(self._slots(self._kinds[g.kind], pos)) for g in self._groups]
        key = tuple((i.start, i.stop) if isinstance(i, slice) else None for i in indices)
        if self._gathered is not None and self._gathered[0] == key:
            return self._gathered[1]
        k_out: list[np.ndarray] = [np.empty(0)] * len(self._specs)
        v_out = list(k_out)
        for g, index in zip(self._groups, indices, strict=True):
            if isinstance(index, slice):  # [n_layers, 1, n, kvh, hd] views (each layer's part contiguous)
                gk, gv = g.k[:, :, index], g.v[:, :, index]
            else:  # np.take: C-contiguous copies (runtimes bind inputs by pointer)
                gk, gv = g.k.take(index, axis=2), g.v.take(index, axis=2)
            for j, layer in enumerate(g.layers):
                k_out[layer], v_out[layer] = gk[j], gv[j]
        out = (tuple(k_out), tuple(v_out))
        # only views are kept: a copy is of the slots' content now, and they are written at every commit
        self._gathered = (key, out) if None not in key else None
        return out

    # --- the step -----------------------------------------------------------------------------------------

    def begin(self, q_len: int, n_tokens: int | None = None) -> StepView:
        """Start a step of q_len tokens (the graph's static width), the first n_tokens of them real."""
        self._pending = None
        if not 1 <= q_len <= self.max_step:
            raise ValueError(
                f"a step of {q_len} tokens does not fit the ring: at most {self.max_step} per step "
                f"(capacity - sink of the smallest layer); prefill in chunks of at most {self.max_step}"
            )
        n = q_len if n_tokens is None else n_tokens
        if not 0 <= n <= q_len:
            raise ValueError(f"n_tokens must be in [0, {q_len}], got {n_tokens}")
        room = self.room()
        if room is not None and n > room:
            if self._policy == "error":
                raise ContextOverflowError(
                    f"context overflow: {n} new tokens at position {self._position} do not fit the KV cache "
                    f"({self._limit} tokens, {room} left)",
                    hint="shorten the prompt or the number of tokens to generate, raise the context size, "
                    "or use the 'ring' or 'truncate' overflow policy",
                )
            if self._policy == "truncate":
                n = room
        positions = np.arange(self._position, self._position + q_len, dtype=np.int64)
        snapshot = tuple(sp.copy() for sp in self._slot_pos)  # the masks are of this state, built when asked
        requested = q_len if n_tokens is None else n_tokens
        self._pending = StepView(positions, self._layer_kind, n, requested, self._kinds, snapshot)
        return self._pending

    def commit(self, new_k: Sequence[np.ndarray], new_v: Sequence[np.ndarray]) -> None:
        """Store the step's new K/V (per layer [1, q, kvh, hd]) in their slots; padding columns are ignored."""
        view = self._pending
        if view is None:
            raise RuntimeError("commit() without a pending begin()")
        if len(new_k) != len(self._specs) or len(new_v) != len(self._specs):
            raise ValueError(
                f"expected K and V for {len(self._specs)} layers, got {len(new_k)} and {len(new_v)}"
            )
        for i, (spec, k, v) in enumerate(zip(self._specs, new_k, new_v, strict=True)):
            want = (1, view.q_len, spec.n_kv_heads, spec.head_dim)
            if k.shape != want or v.shape != want:
                raise ValueError(f"layer {i}: new K/V shapes {k.shape}, {v.shape}; expected {want}")
        self._pending = None
        n = view.n_tokens
        if n == 0:
            return
        pos = view.positions[:n]
        t = min(n, self._max_rollback)  # only the tail can ever be rolled back
        slots = [self._slots(kind, pos) for kind in self._kinds]
        held = [sp[s] for sp, s in zip(self._slot_pos, slots, strict=True)]  # positions the slots held
        # a position evicted, only where a kind's slots are reused (a decode step before any wrap skips this)
        wraps = any(self._position + n > kind.capacity for kind in self._kinds)
        evicted = [int(h[h >= 0].min()) for h in held if (h >= 0).any()] if wraps else []
        undo = _Undo([s[n - t :] for s in slots], [], [], [])
        undo.old_pos = [h[n - t :] for h in held]
        # the ring wraps: a reader of the evicted positions must see it (moved_below)
        with self.changing(min(evicted)) if evicted else contextlib.nullcontext():
            self._store(slots, undo, new_k, new_v, n, t)
            for sp, s in zip(self._slot_pos, slots, strict=True):
                sp[s] = pos
            self._wrote(slots)
            self._position += n
            self._high = max(self._high, self._position)
        if t:
            self._undo.append(undo)
            self._undo_tokens += t
            self._trim_undo()

    def _store(
        self,
        slots: list[np.ndarray],
        undo: _Undo,
        new_k: Sequence[np.ndarray],
        new_v: Sequence[np.ndarray],
        n: int,
        t: int,
    ) -> None:
        """commit's writes: the new K/V into their slots, what the tail overwrites into the undo record."""
        dsts, tails = [_index(s) for s in slots], [_index(s) for s in undo.slots]
        for g in self._groups:
            dst, tail = dsts[g.kind], tails[g.kind]
            for big, new, old in ((g.k, new_k, undo.old_k), (g.v, new_v, undo.old_v)):
                body = big[:, 0]  # [n_layers, capacity, kvh, hd]
                if t:
                    old.append(body[:, tail].copy())  # NOTE: copy; a slice index would give a view
                if len(g.layers) == 1:
                    body[0][dst] = new[g.layers[0]][0, :n]
                else:
                    body[:, dst] = np.stack([new[i][0, :n] for i in g.layers])

    def rollback(self, k: int) -> None:
        """Forget the last k committed tokens, restoring buffers and positions bit-exactly."""
        if k < 0:
            raise ValueError(f"cannot roll back a negative number of tokens ({k})")
        if k > self._position:
            raise RollbackError(f"cannot roll back {k} tokens: the cache has seen only {self._position}")
        if k > self._undo_tokens:
            raise RollbackError(
                f"cannot roll back {k} tokens: the undo log holds the last {self._undo_tokens} "
                f"(max_rollback={self._max_rollback}); reset() and prefill again, or raise max_rollback"
            )
        self._pending = None
        with self.changing(self._position - k):
            self._undo_last(k)

    def _undo_last(self, k: int) -> None:
        left = k
        while left:
            undo = self._undo[-1]
            j = min(left, undo.n)
            part = undo.sliced(slice(undo.n - j, None))
            for sp, s, old in zip(self._slot_pos, part.slots, part.old_pos, strict=True):
                sp[s] = old
            idxs = [_index(s) for s in part.slots]
            for g, old_k, old_v in zip(self._groups, part.old_k, part.old_v, strict=True):
                g.k[:, 0][:, idxs[g.kind]] = old_k
                g.v[:, 0][:, idxs[g.kind]] = old_v
            self._wrote(part.slots)
            if j == undo.n:
                self._undo.pop()
            else:
                self._undo[-1] = undo.sliced(slice(0, undo.n - j))
            left -= j
        self._position -= k
        self._undo_tokens -= k

    @property
    def truncate_limit(self) -> int:
        """How many of the last tokens truncate() can drop now: all of them while the ring never wrapped since
        the reset (every position still has its own slot), else what the undo log holds."""
        if all(self._high <= kind.capacity for kind in self._kinds):
            return self._position
        return self._undo_tokens

    def truncate(self, k: int) -> None:
        """Forget the last k committed tokens, further back than the undo log where the ring never wrapped:
        their slots are freed (zeroed, unmasked nowhere), so the state equals a fresh prefill of the rest."""
        if k <= self._undo_tokens:
            self.rollback(k)
            return
        if k > self.truncate_limit:
            raise RollbackError(
                f"cannot drop {k} tokens: the ring has wrapped, and its undo log holds the last "
                f"{self._undo_tokens}; reset() and prefill again"
            )
        keep = self._position - k
        with self.changing(keep):
            for g in self._groups:
                freed = self._slot_pos[g.kind] >= keep
                g.k[:, 0][:, freed] = 0
                g.v[:, 0][:, freed] = 0
            for sp in self._slot_pos:
                sp[sp >= keep] = -1
            self._written = [(0, kd.capacity) for kd in self._kinds]
            self._position = keep
            self._pending = None
            self._fresh_undo()

    def copy_prefix(self, src: RingKVCache, n: int) -> None:
        """Hold the first n tokens `src` holds, copied (another sequence with the same prompt prefix: a shared
        system prompt). `src` must have this geometry and must not have wrapped, so its first n positions sit in
        slots 0..n-1; this cache is emptied first. The state equals a prefill of those n tokens."""
        if src.layers != self.layers or src.sink != self.sink:
            raise ValueError("copy_prefix needs two caches of one geometry (layers and sink)")
        if not 0 < n <= src.position or src.truncate_limit != src.position:
            raise RollbackError(
                f"cannot copy {n} tokens from a cache at {src.position} that "
                f"{'has wrapped' if src.truncate_limit != src.position else 'holds fewer'}"
            )
        with self.changing(0):
            self._clear()
            self._high = n  # first: a copy cut short still leaves a cache reset() zeroes
            for mine, theirs in zip(self._groups, src._groups, strict=True):
                mine.k[:, :, :n] = theirs.k[:, :, :n]
                mine.v[:, :, :n] = theirs.v[:, :, :n]
            for sp in self._slot_pos:
                sp[:n] = np.arange(n)
            self._position = n
            self._fresh_undo()

    def _fresh_undo(self) -> None:
        """The undo log a prefill of the tokens held would have left (after a deep truncate or a copy, both
        before any wrap): the last max_rollback positions wrote slots that held nothing, so undoing them
        empties those slots; rollback(max_rollback) keeps working after a later wrap."""
        t = min(self._max_rollback, self._position)
        self._undo.clear()
        self._undo_tokens = 0
        if not t:
            return
        pos = np.arange(self._position - t, self._position, dtype=np.int64)
        slots = [self._slots(kind, pos) for kind in self._kinds]
        old_pos = [np.full(t, -1, np.int64) for _ in self._kinds]
        zeros = [np.zeros((len(g.layers), t, *g.k.shape[3:]), self._dtype) for g in self._groups]
        self._undo.append(_Undo(slots, old_pos, zeros, [z.copy() for z in zeros]))
        self._undo_tokens = t

    def reset(self) -> None:
        """Empty the cache in place (buffers zeroed, so a reset cache equals a fresh one bit for bit)."""
        with self.changing(0):
            self._clear()

    def _clear(self) -> None:
        # only slots [0, _high) were written (all of a kind's once it wrapped): zeroing no further leaves the
        # pages of a deep ring never touched unmapped, so a slot's RSS follows the depth its requests reached
        for g in self._groups:
            end = min(self._high, self._kinds[g.kind].capacity)
            g.k[:, :, :end].fill(0)
            g.v[:, :, :end].fill(0)
        for sp in self._slot_pos:
            sp.fill(-1)
        self._written = [(0, k.capacity) for k in self._kinds]
        self._position = 0
        self._high = 0
        self._undo.clear()
        self._undo_tokens = 0
        self._pending = None

    def moved_below(self, n: int, since: int) -> bool:
        """Whether positions [0, n) may have changed since `epoch` read `since` (maybe from another thread): a
        change was under way then (odd), or one since reached below n; appending never counts."""
        if since % 2:
            return True
        if self.epoch == since:
            return False
        moves = tuple(self._moves)  # one C call: safe beside the owner's thread appending
        if not moves or moves[0][0] > since + 1:
            return True  # the log no longer reaches back that far
        return any(e > since and low < n for e, low in moves)

    def _begin_move(self, low: int) -> None:
        if not self._depth:
            self.epoch += 1  # odd: under way
        self._depth += 1  # a change inside another (copy_prefix inside an owner's bracket) keeps it odd
        self._moves.append((self.epoch, low))

    def _end_move(self) -> None:
        self._depth -= 1
        if not self._depth:
            self.epoch += 1

    @contextlib.contextmanager
    def changing(self, low: int) -> Iterator[None]:
        """A change reaching position `low`: the seqlock's bracket around the cache's own changes, and around
        an owner's change of what the cache stands for (a copied cache published before its ids are recorded:
        devices/batch.py); it ends even where the change raised."""
        self._begin_move(low)
        try:
            yield
        finally:
            self._end_move()

    def take_written(self) -> tuple[tuple[int, int], ...]:
        """Per kind, the slots [lo, hi) whose K/V changed since the last call (lo >= hi: none), and start
        anew: a copy made at the last call is exact outside them."""
        taken = tuple(self._written)
        self._written = [(k.capacity, 0) for k in self._kinds]
        return taken

    def __repr__(self) -> str:
        kinds = "; ".join(f"{self._layer_kind.count(i)}x {k.describe()}" for i, k in enumerate(self._kinds))
        return (
            f"RingKVCache({len(self._specs)} layers [{kinds}], policy={self._policy!r}, position={self._position}, "
            f"fill={self.fill}, capacity={self.capacity}, max_rollback={self._max_rollback}, "
            f"dtype={self._dtype}, {self.nbytes / 2**20:.1f} MiB)"
        )

    # --- internals ----------------------------------------------------------------------------------------

    @staticmethod
    def _slots(kind: LayerKind, pos: np.ndarray) -> np.ndarray:
        return np.where(pos < kind.sink, pos, kind.sink + (pos - kind.sink) % kind.ring)

    def _wrote(self, slots: Sequence[np.ndarray]) -> None:
        for ki, s in enumerate(slots):
            if len(s):
                lo, hi = self._written[ki]
                self._written[ki] = (min(lo, int(s.min())), max(hi, int(s.max()) + 1))

    def _primary(self) -> int:
        bounded = [i for i, k in enumerate(self._kinds) if not k.lossless]
        if bounded:
            return min(bounded, key=lambda i: self._kinds[i].capacity)
        return max(range(len(self._kinds)), key=lambda i: self._kinds[i].capacity)

    def _trim_undo(self) -> None:
        excess = self._undo_tokens - self._max_rollback
        while excess > 0:
            first = self._undo[0]
            if first.n <= excess:
                self._undo.popleft()
                excess -= first.n
                self._undo_tokens -= first.n
            else:
                self._undo[0] = first.sliced(slice(excess, None))
                self._undo_tokens -= excess
                excess = 0


def _mask(kind: LayerKind, slot_pos: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Additive mask [1, 1, q, capacity + q] over (past slots ++ the step's own tokens)."""
    p = positions[:, None]  # [q, 1]
    s = slot_pos[None, :]  # [1, capacity]
    # NOTE: `s >= p - ring` hides the past slots that earlier tokens of this same step overwrite at commit, so
    # a chunk sees exactly what one-token-at-a-time decoding would (sinks + the last `ring` tokens + itself).
    past = (s >= 0) & ((s < kind.sink) | (s >= p - kind.ring))
    d = p - positions[None, :]  # [q, q] distance to each of the step's tokens
    new = d >= 0
    if kind.window is not None:
        past &= s > p - kind.window
        new &= d < kind.window
    visible = np.concatenate([past, new], axis=1)
    return np.where(visible, np.float32(0), NEG_INF).astype(np.float32, copy=False)[None, None]
