"""`PartitionedDecoder`: a decoder split into ONNX partitions (layer ranges, the last with the head), each on
its own (backend, device), sharing one ring-buffer KV cache.

Per step: token ids -> the numpy embed partition -> partition 0 -> hidden states -> partition 1 -> ... -> logits;
every partition reads the K/V prefixes of its own layers straight from the shared ring buffers (bound by
pointer) and returns its layers' new K/V, committed once after the last partition.

Static-shape artifacts (for NPUs) carry two graphs per partition, "prefill" (a fixed chunk of q tokens) and
"decode" (one token), both over the whole KV capacity: a short last chunk is padded (the ring cache's
`begin(q, n_tokens)` stores only the real tokens; padding sits after them, so causal masking hides it).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from devices.runners import RUNNERS, Runner, RunnerOptions
from edge.errors import ContextOverflowError, DeviceError
from kvcache import LayerSpec, RingKVCache
from models.arch import ArchConfig
from models.store import cache_dir
from models.transformer import layer_kinds

__all__ = ["PartitionGraph", "PartitionedDecoder", "PartitionedOptions", "open_artifact_decoder"]

_SLOT_GRAIN = 32


@dataclass(frozen=True)
class PartitionGraph:
    """One partition: its graph per shape variant ("dynamic", or "prefill" + "decode"), its layers, where it runs."""

    graphs: Mapping[str, Path]
    layers: range
    head: bool
    backend: str = "ort"
    device: str = "cpu"


@dataclass(frozen=True)
class PartitionedOptions:
    capacity: int = 4096  # KV slots of global layers (static graphs: theirs)
    sink: int = 4
    policy: str = "ring"
    prefill_chunk: int = 256  # dynamic graphs; static graphs use their prefill width
    max_rollback: int = 16
    threads: int | None = None
    exact: bool = True


@dataclass
class _Part:
    spec: PartitionGraph
    runners: dict[str, Runner]
    inputs: dict[str, set[str]]  # variant -> graph input names
    outputs: list[str] = field(default_factory=list)


def _graph_inputs(path: Path) -> tuple[set[str], dict[str, list[int | str]]]:
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {
        i.name: [
            d.dim_value if d.HasField("dim_value") else d.dim_param for d in i.type.tensor_type.shape.dim
        ]
        for i in graph.input
    }
    return set(shapes), shapes


def _compile_cache(path: Path) -> Path:
    """A compile cache per graph file (several partitions never share one: ORT writes a fixed file name)."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    path = cache_dir() / "compiled" / hashlib.sha256(key.encode()).hexdigest()[:20]
    path.mkdir(parents=True, exist_ok=True)
    return path


class PartitionedDecoder:
    """`Decoder` over a chain of partitions (see the module docstring)."""

    def __init__(
        self,
        cfg: ArchConfig,
        embed: Callable[[Sequence[int]], np.ndarray],
        partitions: Sequence[PartitionGraph],
        options: PartitionedOptions | None = None,
    ) -> None:
        opts = options or PartitionedOptions()
        self.cfg, self.embed, self.options = cfg, embed, opts
        self.vocab_size = cfg.n_vocab
        covered = [i for p in partitions for i in p.layers]
        if covered != list(range(cfg.n_layer)) or not partitions or not partitions[-1].head:
            raise ValueError("partitions must cover layers 0..n-1 in order, the last one with the head")
        variants = set(partitions[0].graphs)
        self.static = variants == {"prefill", "decode"}
        if not self.static and variants != {"dynamic"}:
            raise ValueError(f"unknown shape variants {sorted(variants)}")
        kinds = layer_kinds(cfg)
        self._kinds = kinds
        self._parts: list[_Part] = []
        static_q, static_cap = None, {}
        for p in partitions:
            if p.backend not in RUNNERS:
                raise DeviceError(
                    f"no graph runner for backend {p.backend!r}", hint=f"use one of {sorted(RUNNERS)}"
                )
            runners, inputs = {}, {}
            for variant, path in p.graphs.items():
                names, shapes = _graph_inputs(path)
                inputs[variant] = names
                if variant == "prefill":
                    static_q = int(shapes["hidden"][1])
                if self.static:
                    for k in (0, 1):
                        if f"mask_{k}" in shapes:
                            static_cap[k] = int(shapes[f"mask_{k}"][3]) - int(shapes["hidden"][1])
                ropts = RunnerOptions(p.device, opts.threads, opts.exact, _compile_cache(path))
                runners[variant] = RUNNERS[p.backend](path, ropts)
            outs = ["logits" if p.head else "hidden_out"]
            outs += [f"new_{n}_{i}" for i in p.layers for n in ("key", "value")]
            self._parts.append(_Part(p, runners, inputs, outs))
        window = cfg.sliding_window
        if self.static:
            cap0 = static_cap.get(0, opts.capacity)
            specs = [
                LayerSpec(cfg.n_head_kv, cfg.head_dim, static_cap.get(1, min(cap0, window or cap0)), window)
                if k
                else LayerSpec(cfg.n_head_kv, cfg.head_dim, cap0, None)
                for k in kinds
            ]
        else:
            specs = [
                LayerSpec(
                    cfg.n_head_kv,
                    cfg.head_dim,
                    min(opts.capacity, window) if k else opts.capacity,
                    window if k else None,
                )
                for k in kinds
            ]
        self._specs, self._static_q = specs, static_q
        self.cache = self._new_cache(opts.sink)
        self._mask_layer = {k: kinds.index(k) for k in sorted(set(kinds))}
        if static_q is not None and static_q > self.cache.max_step:
            raise ValueError(
                f"the static prefill graph takes {static_q} tokens but the KV ring holds {self.cache.max_step} "
                "per step; convert with a smaller --prefill-chunk"
            )
        self.chunk = max(1, min(static_q or opts.prefill_chunk, self.cache.max_step))
        self.backend = "+".join(dict.fromkeys(p.backend for p in partitions))
        self.device = "+".join(dict.fromkeys(p.device for p in partitions))
        limit = self.cache.capacity
        self.n_ctx = (
            cfg.context_length if opts.policy == "ring" or limit is None else min(limit, cfg.context_length)
        )
        self._lock = threading.Lock()
        # time spent in each partition's graph since load (edge bench reports it per partition)
        self.partition_seconds = [0.0] * len(self._parts)

    def _new_cache(self, sink: int) -> RingKVCache:
        o = self.options
        return RingKVCache(self._specs, sink=sink, policy=o.policy, max_rollback=o.max_rollback)  # type: ignore[arg-type]

    @property
    def max_sink(self) -> int:
        """The most tokens `set_sink` pins: half the ring, so the other half still rotates (and a static
        prefill chunk still fits one step)."""
        half = min((s.capacity for s in self._specs if s.window is None), default=0) // 2
        step_room = min(s.capacity for s in self._specs) - (self._static_q or 1)  # max_step >= one step
        return max(self.options.sink, min(half, step_room))

    def set_sink(self, n: int) -> bool:
        """Pin the first n tokens (a chat's system prompt) when the ring wraps, between the default sink and
        `max_sink`. The slot geometry changes, so a change empties the cache; returns whether it changed."""
        n = max(self.options.sink, min(int(n), self.max_sink))
        if n == self.cache.sink:
            return False
        with self._lock:
            self.cache = self._new_cache(n)
            self.chunk = max(1, min(self._static_q or self.options.prefill_chunk, self.cache.max_step))
        return True

    @property
    def position(self) -> int:
        return self.cache.position

    @property
    def max_rollback(self) -> int:
        return self.cache.max_rollback

    @property
    def partitions(self) -> list[PartitionGraph]:
        return [p.spec for p in self._parts]

    def _bound(self, layer: int) -> int:
        cap = self.cache.keys[layer].shape[1]
        if self.static:
            return cap
        used = self.cache.occupied(layer)
        return min(cap, max(_SLOT_GRAIN, -(-used // _SLOT_GRAIN) * _SLOT_GRAIN))

    def _step(self, ids: Sequence[int], last_only: bool) -> np.ndarray:
        n = len(ids)
        if self.static:
            variant, q = ("decode", 1) if n == 1 else ("prefill", self.chunk)
        else:
            variant, q = "dynamic", n
        cache = self.cache
        view = cache.begin(q, n)
        if view.dropped:
            cache.begin(1)
            raise ContextOverflowError(
                f"the KV cache is full at {cache.position} tokens (policy 'truncate')",
                hint="shorten the prompt or use the 'ring' policy",
            )
        padded = list(ids) + [0] * (q - n)
        hidden = self.embed(padded)
        rows = (
            np.arange(q, dtype=np.int64)
            if self.static
            else np.array([n - 1] if last_only else range(n), dtype=np.int64)
        )
        shared: dict[str, np.ndarray] = {"positions": view.positions, "logit_rows": rows}
        for k, layer in self._mask_layer.items():
            shared[f"mask_{k}"] = view.mask_prefix(layer, self._bound(layer))
        new_k: list[np.ndarray] = [np.empty(0)] * self.cfg.n_layer
        new_v = list(new_k)
        logits = np.empty(0)
        for index, part in enumerate(self._parts):
            names = part.inputs[variant]
            feeds = {k: v for k, v in shared.items() if k in names}
            feeds["hidden"] = hidden
            for i in part.spec.layers:
                b = self._bound(i)
                # a slot prefix of a slot-major buffer is contiguous: bound by pointer, no copy
                feeds[f"past_key_{i}"] = cache.keys[i][:, :b]
                feeds[f"past_value_{i}"] = cache.values[i][:, :b]
            t0 = time.perf_counter()
            out = part.runners[variant].run(feeds, part.outputs)
            self.partition_seconds[index] += time.perf_counter() - t0
            for j, i in enumerate(part.spec.layers):
                new_k[i], new_v[i] = out[1 + 2 * j], out[2 + 2 * j]
            if part.spec.head:
                logits = out[0][0]
            else:
                hidden = out[0]
        cache.commit(new_k, new_v)
        if self.static:
            logits = logits[n - 1 : n] if last_only else logits[:n]
        return logits

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        toks = [int(t) for t in tokens]
        if not toks:
            raise ValueError("forward needs at least one token")
        bad = [t for t in toks if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range 0..{self.vocab_size - 1}: {bad[:5]}")
        if self.options.policy != "ring" and self.position + len(toks) > self.n_ctx:
            raise ContextOverflowError(
                f"{self.position} + {len(toks)} tokens exceed the KV cache of {self.n_ctx}",
                hint="raise --ctx-size or use the 'ring' policy",
            )
        with self._lock:
            parts = []
            for start in range(0, len(toks), self.chunk):
                ids = toks[start : start + self.chunk]
                final = start + self.chunk >= len(toks)
                logits = self._step(ids, last_only)
                if final or not last_only:
                    parts.append(logits)
            return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)

    def rollback(self, n: int) -> None:
        with self._lock:
            self.cache.rollback(n)

    def reset(self) -> None:
        with self._lock:
            self.cache.reset()

    def close(self) -> None:
        for part in self._parts:
            for runner in part.runners.values():
                runner.close()


def open_artifact_decoder(
    path: Path,
    placements: str | Sequence[tuple[str, str]] = "ort",
    *,
    device: str = "cpu",
    options: PartitionedOptions | None = None,
) -> PartitionedDecoder:
    """A decoder over an artifact directory; `placements` is one backend for every partition or a
    (backend, device) per partition."""
    from models.artifact import open_artifact

    art = open_artifact(path)
    n = len(art.partitions)
    where = [(placements, device)] * n if isinstance(placements, str) else list(placements)
    if len(where) != n:
        raise DeviceError(f"{path.name} has {n} partitions but {len(where)} placements were given")
    graphs = [
        PartitionGraph({v: art.path / f for v, f in p.graphs.items()}, p.layers, p.head, backend=b, device=d)
        for p, (b, d) in zip(art.partitions, where, strict=True)
    ]
    opts = options or PartitionedOptions()
    if art.shapes.static and art.shapes.capacity is not None:
        from dataclasses import replace

        opts = replace(opts, capacity=art.shapes.capacity)
    return PartitionedDecoder(art.config, art.embedder(), graphs, opts)
