"""Backend name -> how to open a `Decoder` on a model file. Adding a backend is one entry in `BACKENDS`.

Each factory imports its SDK inside itself, so a missing SDK only disables that backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from devices.base import Decoder
from edge.errors import BackendUnavailableError

__all__ = ["BACKENDS", "KNOWN_BACKENDS", "DecoderOptions", "open_decoder", "require_backend"]


@dataclass(frozen=True)
class DecoderOptions:
    n_ctx: int = 4096
    n_threads: int | None = None  # None: the backend's default (physical cores)


BackendFactory = Callable[[Path, str, DecoderOptions], Decoder]


def _llamacpp(path: Path, device: str, opts: DecoderOptions) -> Decoder:
    from devices.llamacpp import LlamaCppDecoder, LlamaCppOptions

    return LlamaCppDecoder(path, LlamaCppOptions(n_ctx=opts.n_ctx, n_threads=opts.n_threads, device=device))


# Backends that can run a model today.
BACKENDS: dict[str, BackendFactory] = {"llamacpp": _llamacpp}
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
