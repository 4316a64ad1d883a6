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
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from edge.devices.base import Capabilities, PartitionInfo
from edge.devices.ring_decoder import RingDecoder
from edge.devices.runners import Runner, RunnerOptions, graph_runner
from edge.errors import DeviceError
from edge.models.arch import ArchConfig
from edge.models.build_progress import opening
from edge.models.jsonstore import write_json
from edge.models.store import cache_dir, file_identity

__all__ = ["PartitionGraph", "PartitionedDecoder", "PartitionedOptions", "open_artifact_decoder"]


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
    precision: str = "exact"  # the runners' (an artifact's weight forms are fixed when it is converted)


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


COMPILED_SOURCE = "edge-source.json"  # in a compile cache: the graph file it is for (store.file_identity)


def compile_cache_dir(path: Path) -> Path:
    """A compile cache per graph file (several partitions never share one: ORT writes a fixed file name)."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    return cache_dir() / "compiled" / hashlib.sha256(key.encode()).hexdigest()[:20]


def _compile_cache(path: Path) -> Path:
    out = compile_cache_dir(path)
    out.mkdir(parents=True, exist_ok=True)
    if not (
        out / COMPILED_SOURCE
    ).is_file():  # what `edge rm` and `edge cache --prune` read (devices/cache.py)
        write_json(out / COMPILED_SOURCE, {"graph": file_identity(path)})
    return out


class PartitionedDecoder(RingDecoder):
    """`Decoder` over a chain of partitions (see the module docstring); the ring, the chunked forward and
    rollback are RingDecoder's."""

    def __init__(
        self,
        cfg: ArchConfig,
        embed: Callable[[Sequence[int]], np.ndarray],
        partitions: Sequence[PartitionGraph],
        options: PartitionedOptions | None = None,
    ) -> None:
        opts = options or PartitionedOptions()
        self.embed, self.options = embed, opts
        covered = [i for p in partitions for i in p.layers]
        if covered != list(range(cfg.n_layer)) or not partitions or not partitions[-1].head:
            raise ValueError("partitions must cover layers 0..n-1 in order, the last one with the head")
        variants = set(partitions[0].graphs)
        self.static = variants == {"prefill", "decode"}
        if not self.static and variants != {"dynamic"}:
            raise ValueError(f"unknown shape variants {sorted(variants)}")
        self._parts: list[_Part] = []
        static_q, static_cap = None, {}
        for p in partitions:
            make_runner = graph_runner(p.backend)
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
                ropts = RunnerOptions(p.device, opts.threads, opts.precision, _compile_cache(path))
                runners[variant] = make_runner(path, ropts)
            outs = ["logits" if p.head else "hidden_out"]
            outs += [f"new_{n}_{i}" for i in p.layers for n in ("key", "value")]
            self._parts.append(_Part(p, runners, inputs, outs))
        self.first_run_costs = any(
            r.prepares_on_first_run for part in self._parts for r in part.runners.values()
        )
        cap0 = static_cap.get(0, opts.capacity) if self.static else opts.capacity
        self._init_ring(
            cfg,
            cap0,
            local_capacity=static_cap.get(1) if self.static else None,
            sink=opts.sink,
            policy=opts.policy,
            max_rollback=opts.max_rollback,
            prefill_chunk=opts.prefill_chunk,
            bind_all=self.static,
            static_q=static_q,
        )
        self.backend = "+".join(dict.fromkeys(p.backend for p in partitions))
        self.device = "+".join(dict.fromkeys(p.device for p in partitions))
        # time spent in each partition's graph since load (edge bench reports it per partition)
        self.partition_seconds = [0.0] * len(self._parts)

    @property
    def partitions(self) -> list[PartitionGraph]:
        return [p.spec for p in self._parts]

    def capabilities(self) -> Capabilities:
        return replace(super().capabilities(), partitions=self)

    def partition_info(self) -> tuple[PartitionInfo, ...]:
        return tuple(PartitionInfo(p.layers, p.head, p.backend, p.device) for p in self.partitions)

    def partition_times(self) -> tuple[float, ...]:
        return tuple(self.partition_seconds)

    def _step(
        self, ids: Sequence[int], last_only: bool, *, window: bool = False, score: bool = True
    ) -> np.ndarray:
        n = len(ids)
        if self.static:
            variant, q = ("decode", 1) if n == 1 else ("prefill", self.chunk)
        else:
            variant, q = "dynamic", n
        cache = self.cache
        view = cache.begin(q, n)
        if view.dropped:
            raise self._overflowed()
        padded = list(ids) + [0] * (q - n)
        hidden = self.embed(padded)
        rows = (
            np.arange(q, dtype=np.int64)
            if self.static
            else np.array([n - 1] if last_only else range(n), dtype=np.int64)
        )
        masks, bound = self._bindings(view)
        shared: dict[str, np.ndarray] = {"positions": view.positions, "logit_rows": rows, **masks}
        new_k: list[np.ndarray] = [np.empty(0)] * self.cfg.n_layer
        new_v = list(new_k)
        logits = np.empty(0)
        for index, part in enumerate(self._parts):
            names = part.inputs[variant]
            feeds = {k: v for k, v in shared.items() if k in names}
            feeds["hidden"] = hidden
            feeds.update(self._past_feeds(part.spec.layers, bound))
            t0 = time.perf_counter()
            out = self._run(part.runners[variant], feeds, part.outputs)
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
    from edge.models.artifact import open_artifact

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
        opts = replace(opts, capacity=art.shapes.capacity)
    places = ", ".join(dict.fromkeys(f"{b} on {d}" for b, d in where))
    with opening(f"{n} partition(s) of {path.name} with {places}"):
        return PartitionedDecoder(art.config, art.embedder(), graphs, opts)
