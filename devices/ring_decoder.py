"""What every `Decoder` over edge's own graphs shares: the ring-buffer KV cache and its geometry (sinks,
chunking, which slots to bind), the forward loop over chunks, rollback / reset, and turning a backend's
failure mid-run into a typed `DeviceError`. `GraphDecoder` (one whole-model graph) and `PartitionedDecoder`
(a chain of partitions, maybe on several devices) differ only in `_step`: how one chunk runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from edge.devices.base import Capabilities, KVFill
from edge.devices.runners import Runner
from edge.errors import ContextOverflowError, DeviceError, EdgeError
from edge.kvcache import LayerSpec, RingKVCache, StepView
from edge.kvcache.spec import kv_numpy_dtype
from edge.kvcache.staging import bound_prefix, split_windows, windowed
from edge.models.arch import ArchConfig
from edge.models.transformer import layer_kinds

__all__ = ["SLOT_GRAIN", "RingDecoder", "RingGeometry"]

SLOT_GRAIN = 32


class RingGeometry(Protocol):
    """A whole-model ring's geometry as options give it (GraphOptions has these fields): what a graph
    decoder, its batch slots and a phase split's ring are made with."""

    capacity: int
    sink: int
    policy: str
    max_rollback: int
    prefill_chunk: int
    static_shapes: bool
    kv_dtype: str


class RingDecoder:
    """Base of the graph decoders; a subclass sets its runners, then calls `_init_ring` and defines `_step`."""

    backend: str
    device: str
    vocab_size: int
    staged: bool = False  # the graph has staged attention (kvcache/staging.py); subclasses set it
    first_run_costs: bool = False  # a runner prepares its kernels on the first runs; subclasses set it
    weights_read: int | None = None  # Capabilities.weights_read; graph decoders set it from their graphs

    def _init_ring(
        self,
        cfg: ArchConfig,
        capacity: int,
        *,
        local_capacity: int | None = None,
        sink: int,
        policy: str,
        max_rollback: int,
        prefill_chunk: int,
        bind_all: bool,
        static_q: int | None = None,
        kv_dtype: str = "f32",
    ) -> None:
        """KV slots: `capacity` for global layers, `local_capacity` (default: the window, at most `capacity`)
        for sliding-window ones. `bind_all`: every KV slot is bound each step (static shapes); `static_q`: the
        fixed width of a static prefill graph, which then sets the chunk."""
        self.cfg, self.vocab_size = cfg, cfg.n_vocab
        window = cfg.sliding_window
        local = local_capacity if local_capacity is not None else min(capacity, window or capacity)
        self._kinds = kinds = layer_kinds(cfg)
        self._specs = [
            LayerSpec(cfg.n_head_kv, cfg.head_dim, local, window)
            if k
            else LayerSpec(cfg.n_head_kv, cfg.head_dim, capacity, None)
            for k in kinds
        ]
        # where each graph mask input comes from: the first layer of that kind
        self._mask_layer = {k: kinds.index(k) for k in sorted(set(kinds))}
        self._policy, self._max_rollback, self._default_sink = policy, max_rollback, sink
        self._prefill_chunk, self._bind_all, self._static_q = prefill_chunk, bind_all, static_q
        kv_numpy_dtype(kv_dtype)  # an unknown type stops here
        self.kv_dtype = kv_dtype  # the ring's element type: f32 | f16 (a phase split's halves must agree)
        self.cache = self._new_cache(sink)
        # past-prefix views per (layer, slots), of this cache (see _past_feeds)
        self._views: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._views_of: RingKVCache | None = None
        if static_q is not None and static_q > self.cache.max_step:
            raise ValueError(
                f"the static prefill graph takes {static_q} tokens but the KV ring holds {self.cache.max_step} "
                "per step; convert with a smaller --prefill-chunk"
            )
        self._set_chunk()
        limit = self.cache.capacity
        self.n_ctx = (
            cfg.context_length if policy == "ring" or limit is None else min(limit, cfg.context_length)
        )
        self._lock = threading.Lock()

    def _init_ring_of(self, cfg: ArchConfig, geometry: RingGeometry) -> None:
        """`_init_ring` with a whole-model geometry (static shapes bind every slot)."""
        g = geometry
        self._init_ring(
            cfg,
            g.capacity,
            sink=g.sink,
            policy=g.policy,
            max_rollback=g.max_rollback,
            prefill_chunk=g.prefill_chunk,
            bind_all=g.static_shapes,
            kv_dtype=g.kv_dtype,
        )

    def _new_cache(self, sink: int) -> RingKVCache:
        return RingKVCache(
            self._specs,
            sink=sink,
            policy=self._policy,  # type: ignore[arg-type]
            max_rollback=self._max_rollback,
            dtype=kv_numpy_dtype(self.kv_dtype),
        )

    def _set_chunk(self) -> None:
        self.chunk = max(1, min(self._static_q or self._prefill_chunk, self.cache.max_step))

    # -- geometry ------------------------------------------------------------------------------------
    @property
    def max_sink(self) -> int:
        """The most tokens `set_sink` pins: half the ring, so the other half still rotates (and one step, a
        static prefill chunk included, still fits)."""
        half = min((s.capacity for s in self._specs if s.window is None), default=0) // 2
        step_room = min(s.capacity for s in self._specs) - (self._static_q or 1)
        return max(self._default_sink, min(half, step_room))

    def set_sink(self, n: int) -> bool:
        """Pin the first n tokens (a chat's system prompt) when the ring wraps, between the default sink and
        `max_sink`. The slot geometry changes, so a change empties the cache; returns whether it changed."""
        n = max(self._default_sink, min(int(n), self.max_sink))
        if n == self.cache.sink:
            return False
        with self._lock:
            self.cache = self._new_cache(n)
            self._set_chunk()
        return True

    def _bound_slots(self, layer: int) -> int:
        """Past slots to bind for a layer: all of them for static shapes, else the occupied prefix rounded up
        (decode reads what is filled, not the capacity; rounding keeps shapes from churning)."""
        cap = self.cache.keys[layer].shape[1]
        if self._bind_all:
            return cap
        return bound_prefix(cap, self.cache.occupied(layer), SLOT_GRAIN)

    def _bindings(self, view: StepView) -> tuple[dict[str, np.ndarray], dict[int, int]]:
        """A step's mask feeds, and the past slots bound per layer kind (worked out once per kind)."""
        bound = {k: self._bound_slots(layer) for k, layer in self._mask_layer.items()}
        masks = {f"mask_{k}": view.mask_prefix(layer, bound[k]) for k, layer in self._mask_layer.items()}
        return masks, bound

    def _past_feeds(self, layers: Iterable[int], bound: Mapping[int, int]) -> dict[str, np.ndarray]:
        """past_key_i / past_value_i for the layers: a slot prefix of a slot-major buffer is contiguous, so
        they are bound by pointer, no copy. The same prefix is fed as the same view object (a runner leaves
        an input bound while it is fed the same array)."""
        cache, feeds = self.cache, {}
        if self._views_of is not cache:
            self._views, self._views_of = {}, cache
        for i in layers:
            b = bound[self._kinds[i]]
            pair = self._views.get((i, b))
            if pair is None:
                pair = self._views[(i, b)] = (cache.keys[i][:, :b], cache.values[i][:, :b])
            feeds[f"past_key_{i}"], feeds[f"past_value_{i}"] = pair
        return feeds

    # -- running -------------------------------------------------------------------------------------
    def _run(
        self, runner: Runner | None, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]
    ) -> list[np.ndarray]:
        """One graph run; a backend failure (device lost, driver error) becomes a DeviceError, nothing
        committed to the KV."""
        if runner is None:
            raise DeviceError("the graph decoder is closed", hint="load the model again")
        try:
            return runner.run(feeds, outputs)
        except EdgeError:
            raise
        except Exception as exc:
            raise DeviceError(
                f"{runner.backend} failed on {runner.device} at position {self.cache.position}: "
                f"{type(exc).__name__}: {exc}",
                hint="reset() and retry, or load the model again (on another device)",
            ) from exc

    def _overflowed(self) -> ContextOverflowError:
        self.cache.begin(1)  # abandon the step; nothing was written
        return ContextOverflowError(
            f"the KV cache is full at {self.cache.position} tokens (policy 'truncate')",
            hint="shorten the prompt or use the 'ring' policy",
        )

    def _step(
        self, ids: Sequence[int], last_only: bool, *, window: bool = False, score: bool = True
    ) -> np.ndarray:
        """One chunk; logits of its last token (last_only) or of all. `window`: the staged graph's windowed layout
        (only decoders with `staged` get True); score=False: the caller drops the logits (a prompt's earlier
        chunks), so a graph may skip its head (logits [0, vocab])."""
        raise NotImplementedError

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        toks = [int(t) for t in tokens]
        if not toks:
            raise ValueError("forward needs at least one token")
        bad = [t for t in toks if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range 0..{self.vocab_size - 1}: {bad[:5]}")
        if self._policy != "ring" and self.position + len(toks) > self.n_ctx:
            raise ContextOverflowError(
                f"{self.position} + {len(toks)} tokens exceed the KV cache of {self.n_ctx}",
                hint="raise --ctx-size or use the 'ring' policy",
            )
        with self._lock:
            window = self.staged and windowed(len(toks))
            # staged: a short forward is also cut at window ends (kvcache/staging.py)
            cuts = split_windows(self.position, len(toks)) if window else [(0, len(toks))]
            parts = []
            for start, end in cuts:
                while start < end:  # each piece sized when it is cut: a slot's depends on its siblings
                    stop = min(start + self._piece_tokens(end - start), end)
                    final = stop == len(toks)
                    logits = self._step(
                        toks[start:stop], last_only, window=window, score=final or not last_only
                    )
                    if final or not last_only:
                        parts.append(logits)
                    start = stop
            return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def _piece_tokens(self, left: int) -> int:
        """The most tokens the next piece of a forward carries, `left` to go: the chunk (a batch slot: less
        beside streaming siblings, devices/step_loop.chunk_for)."""
        return self.chunk

    @property
    def position(self) -> int:
        return self.cache.position

    @property
    def max_rollback(self) -> int:
        """Tokens rollback() can always undo: the ring's undo log keeps only this many (speculation caps k)."""
        return self.cache.max_rollback

    def capabilities(self) -> Capabilities:
        return Capabilities(
            max_rollback=self.max_rollback,
            sinks=self,
            staged=self.staged,
            first_run_costs=self.first_run_costs,
            truncation=self,
            weights_read=self.weights_read,
        )

    def rollback_reach(self) -> int:
        """`Truncation`: how far rollback reaches now (any depth while the ring has not wrapped)."""
        return self.cache.truncate_limit

    def kv_fill(self) -> KVFill:
        cache, dtype = self.cache, self.kv_dtype
        if not cache.capacity:  # every layer holds its whole window: nothing ever wraps
            return KVFill(cache.position, self.n_ctx, cache.position, ring=False, dtype=dtype)
        return KVFill(
            cache.position, int(cache.capacity), cache.fill, ring=True, sink=cache.sink, dtype=dtype
        )

    def rollback(self, n: int) -> None:
        with self._lock:
            self.cache.truncate(n)  # the undo log where it reaches, else (no wrap yet) the freed slots

    def reset(self) -> None:
        with self._lock:
            self.cache.reset()
