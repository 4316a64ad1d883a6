"""The backends, registered once: `BACKENDS` maps a name to everything edge knows of it (its discovery probe, how
to open a `Decoder` on a model file, its graph runner, its memory estimate). Adding a backend is one entry;
discovery, placement, the fallback order, the CLI and the planner read their names from here.

Each factory imports its SDK inside itself, so a missing SDK only disables that backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge.devices.base import Decoder
from edge.devices.memory import MemoryEstimate, MemoryEstimator, graph_memory, llamacpp_memory
from edge.devices.precision import PRECISIONS, check_f32_kv, check_kv_dtype, check_precision, kv_dtype_for
from edge.devices.probes import BackendStatus, probe_coreml, probe_llamacpp, probe_openvino, probe_ort
from edge.devices.runners import GRAPH_RUNNERS, Runner, RunnerOptions, graph_runner
from edge.errors import BackendUnavailableError
from edge.models.checked import CheckedModel, as_checked

__all__ = [
    "BACKENDS",
    "PRECISIONS",
    "Backend",
    "DecoderOptions",
    "check_precision",
    "estimate_memory",
    "graph_runner",
    "open_decoder",
    "require_backend",
    "runnable_backends",
]


@dataclass(frozen=True)
class DecoderOptions:
    n_ctx: int = 4096
    n_threads: int | None = None  # None: the backend's default (physical cores)
    precision: str = "fast"  # fast | exact (llama.cpp has one precision; it ignores this)
    # False: the runtime's threads sleep between runs instead of spinning (a draft model taking turns with
    # its target in one process: spinning threads of one session slow the other's next run)
    spin: bool = True
    # the decoder will be split into slots (`edge serve --parallel N`): the own graphs attend per slot
    # (devices/graph_decoder.GraphOptions.slot_axis)
    slots: bool = False
    kv_dtype: str = "auto"  # the KV cache's type: auto | f32 | f16 (devices/precision.kv_dtype_for)

    def __post_init__(self) -> None:
        check_precision(self.precision)
        check_kv_dtype(self.kv_dtype)


BackendFactory = Callable[[CheckedModel, str, DecoderOptions], Decoder]
RunnerFactory = Callable[[Path, RunnerOptions], Runner]


def _llamacpp(model: CheckedModel, device: str, opts: DecoderOptions) -> Decoder:
    from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
    from edge.devices.native_check import llamacpp_config

    # an `edge convert` artifact: llama.cpp runs the GGUF it was converted from, checked as any other
    source = model.source()
    # the configuration that passed its known-answer check here (a child process, once per build and CPU)
    config = llamacpp_config()
    lopts = LlamaCppOptions(
        n_ctx=opts.n_ctx,
        n_threads=opts.n_threads,
        device=device,
        extra_bufts=config.extra_bufts,
        kv_dtype=kv_dtype_for(opts.kv_dtype, "llamacpp", device, opts.precision),
    )
    return LlamaCppDecoder(source, lopts)


def _graph(backend: str) -> BackendFactory:
    def factory(model: CheckedModel, device: str, opts: DecoderOptions) -> Decoder:
        from edge.devices.graph_decoder import GraphDecoder, GraphOptions

        if model.artifact is not None:  # `edge convert` output: its partitions, all on this backend
            from edge.devices.partitioned import PartitionedOptions, open_artifact_decoder

            check_f32_kv(opts.kv_dtype, f"{model.path.name} (an edge convert artifact)")
            popts = PartitionedOptions(capacity=opts.n_ctx, threads=opts.n_threads, precision=opts.precision)
            return open_artifact_decoder(model.path, backend, device=device, options=popts)
        kv_dtype = kv_dtype_for(opts.kv_dtype, backend, device, opts.precision)
        graph = GraphOptions(
            backend=backend,
            device=device,
            capacity=opts.n_ctx,
            threads=opts.n_threads,
            precision=opts.precision,
            spin=opts.spin,
            slot_axis=opts.slots,
            kv_dtype=kv_dtype,
        )
        return GraphDecoder(model.gguf, graph)

    return factory


@dataclass(frozen=True)
class Backend:
    """Everything edge knows of one backend."""

    name: str
    probe: Callable[[], BackendStatus]  # discovery: its version and usable devices, or why it is unavailable
    open: BackendFactory | None = None  # a whole-model Decoder on a file; None: discovered, no Decoder yet
    memory: MemoryEstimator | None = None  # what `open` takes, asked before it runs (required with `open`)
    runner: RunnerFactory | None = None  # compiles and runs edge's own graph partitions (devices/runners.py)

    @property
    def runnable(self) -> bool:
        return self.open is not None


# In fallback order: a model whose device failed goes to the first of these that opens on the CPU.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("llamacpp", probe_llamacpp, _llamacpp, llamacpp_memory),
        Backend("ort", probe_ort, _graph("ort"), graph_memory, GRAPH_RUNNERS["ort"]),
        Backend("openvino", probe_openvino, _graph("openvino"), graph_memory, GRAPH_RUNNERS["openvino"]),
        Backend("coreml", probe_coreml),  # edge convert --target coreml; prediction needs macOS
    )
}


def runnable_backends() -> tuple[str, ...]:
    """The backends that can run a model in this version, in fallback order."""
    return tuple(name for name, b in BACKENDS.items() if b.runnable)


def require_backend(backend: str) -> Backend:
    """A runnable backend; any other name is an error naming the runnable ones."""
    entry = BACKENDS.get(backend)
    if entry is None or not entry.runnable:
        runnable = ", ".join(runnable_backends())
        what = "is unknown" if entry is None else "has no Decoder in this version of edge"
        raise BackendUnavailableError(
            f"backend {backend!r} {what}; runnable backends: {runnable}", hint=f"use one of: {runnable}"
        )
    return entry


def estimate_memory(
    backend: str,
    model: CheckedModel | Path,
    n_ctx: int,
    options: DecoderOptions | None = None,
    device: str = "cpu",
) -> MemoryEstimate | None:
    """What `backend` takes for `model` with `n_ctx` tokens of KV (in the type `options` give it on `device`);
    None for an `edge convert` artifact (its partitions are not sized here)."""
    model = as_checked(model)
    entry = require_backend(backend)
    if entry.memory is None or model.artifact is not None:
        return None
    opts = options or DecoderOptions()
    return entry.memory(model.gguf, n_ctx, kv_dtype_for(opts.kv_dtype, backend, device, opts.precision))


def open_decoder(
    backend: str,
    model: CheckedModel | str | Path,
    device: str = "cpu",
    options: DecoderOptions | None = None,
) -> Decoder:
    """Open `backend` on `model`: checked already (models/checked.py), or a path checked here, so nothing
    native reads a file the checks have not passed. The memory check is the caller's (`estimate_memory`,
    which devices.planned.resolve_request runs before anything is allocated)."""
    entry = require_backend(backend)
    assert entry.open is not None  # require_backend returns runnable ones only
    return entry.open(as_checked(model), device, options or DecoderOptions())
