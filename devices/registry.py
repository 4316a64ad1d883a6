"""Backend name -> how to open a `Decoder` on a model file. Adding a backend is one entry in `BACKENDS`.

Each factory imports its SDK inside itself, so a missing SDK only disables that backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edge.devices.base import Decoder
from edge.errors import BackendUnavailableError

__all__ = [
    "BACKENDS",
    "KNOWN_BACKENDS",
    "PRECISIONS",
    "DecoderOptions",
    "check_precision",
    "open_decoder",
    "require_backend",
]

# fast: a backend may quantize activations to int8 (ORT accuracy level 4, OpenVINO's dynamic quantization)
# and keep lower-precision state, as llama.cpp does; exact: fp32 math on the file's own blocks
PRECISIONS = ("fast", "exact")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be fast or exact, not {precision!r}")
    return precision


@dataclass(frozen=True)
class DecoderOptions:
    n_ctx: int = 4096
    n_threads: int | None = None  # None: the backend's default (physical cores)
    precision: str = "fast"  # fast | exact (llama.cpp has one precision; it ignores this)

    def __post_init__(self) -> None:
        check_precision(self.precision)


BackendFactory = Callable[[Path, str, DecoderOptions], Decoder]


def _llamacpp(path: Path, device: str, opts: DecoderOptions) -> Decoder:
    from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
    from edge.models.artifact import is_artifact, open_artifact

    if is_artifact(path):  # an `edge convert` artifact: llama.cpp runs the GGUF it was converted from
        path = open_artifact(path).source_path()
    return LlamaCppDecoder(path, LlamaCppOptions(n_ctx=opts.n_ctx, n_threads=opts.n_threads, device=device))


def _graph(backend: str) -> BackendFactory:
    def factory(path: Path, device: str, opts: DecoderOptions) -> Decoder:
        from edge.devices.graph_decoder import GraphDecoder, GraphOptions
        from edge.models.artifact import is_artifact
        from edge.models.gguf_file import open_gguf

        if is_artifact(path):  # `edge convert` output: its partitions, all on this backend
            from edge.devices.partitioned import PartitionedOptions, open_artifact_decoder

            popts = PartitionedOptions(capacity=opts.n_ctx, threads=opts.n_threads, precision=opts.precision)
            return open_artifact_decoder(path, backend, device=device, options=popts)
        graph = GraphOptions(
            backend=backend,
            device=device,
            capacity=opts.n_ctx,
            threads=opts.n_threads,
            precision=opts.precision,
        )
        return GraphDecoder(open_gguf(path), graph)

    return factory


# Backends that can run a model today.
BACKENDS: dict[str, BackendFactory] = {
    "llamacpp": _llamacpp,
    "ort": _graph("ort"),
    "openvino": _graph("openvino"),
}
# Backends edge knows of (discovery probes them) but has no Decoder for yet.
KNOWN_BACKENDS = ("llamacpp", "ort", "openvino", "coreml")


def require_backend(backend: str) -> BackendFactory:
    """The factory of a runnable backend; any other name is an error naming the runnable ones."""
    factory = BACKENDS.get(backend)
    if factory is None:
        runnable = ", ".join(BACKENDS)
        what = "has no Decoder in this version of edge" if backend in KNOWN_BACKENDS else "is unknown"
        raise BackendUnavailableError(
            f"backend {backend!r} {what}; runnable backends: {runnable}", hint=f"use one of: {runnable}"
        )
    return factory


def open_decoder(
    backend: str, path: str | Path, device: str = "cpu", options: DecoderOptions | None = None
) -> Decoder:
    """Open `backend` on `path` (model file checks are the caller's: see models.gguf_file.open_gguf)."""
    return require_backend(backend)(Path(path), device, options or DecoderOptions())
