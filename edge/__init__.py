"""edge: run large language models on the CPU, iGPU and NPU in front of you.

The Python API (docs/api.md)::

    import edge

    with edge.load("smollm2-135m") as model:
        print(model.generate("Why is the sky blue?").text)

`import edge` stays light: the engine and the backends load on first use of a name below.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from edge.api import load
    from edge.embed import EmbeddingModel, load_embedder
    from edge.errors import (
        BackendUnavailableError,
        ContextOverflowError,
        DeviceError,
        DeviceLostError,
        EdgeError,
        GenerationCancelled,
        GrammarError,
        InsufficientMemoryError,
        ModelFormatError,
        ModelNotFoundError,
        PlanError,
        ThinkingError,
        ToolError,
    )
    from edge.grammar import Grammar
    from edge.logprobs import TokenLogprob
    from edge.model import Model, Result, Stream
    from edge.options import GenerateOptions
    from edge.reasoning import Thinking
    from edge.server import serve
    from edge.session import KVState
    from edge.tools import ToolCall

# public name -> module that defines it (imported lazily by __getattr__)
_LAZY = {
    "load": "edge.api",
    "load_embedder": "edge.embed",
    "EmbeddingModel": "edge.embed",
    "Model": "edge.model",
    "Stream": "edge.model",
    "GenerateOptions": "edge.options",
    "Result": "edge.model",
    "KVState": "edge.session",
    "serve": "edge.server",  # imports the server's stack (Starlette, uvicorn) only when used
    "EdgeError": "edge.errors",
    "ModelFormatError": "edge.errors",
    "ModelNotFoundError": "edge.errors",
    "DeviceError": "edge.errors",
    "DeviceLostError": "edge.errors",
    "PlanError": "edge.errors",
    "BackendUnavailableError": "edge.errors",
    "ContextOverflowError": "edge.errors",
    "GenerationCancelled": "edge.errors",
    "GrammarError": "edge.errors",
    "Grammar": "edge.grammar",
    "ToolError": "edge.errors",
    "Thinking": "edge.reasoning",
    "ThinkingError": "edge.errors",
    "ToolCall": "edge.tools",
    "TokenLogprob": "edge.logprobs",
    "InsufficientMemoryError": "edge.errors",
}

__all__ = [
    "BackendUnavailableError",
    "ContextOverflowError",
    "DeviceError",
    "DeviceLostError",
    "EdgeError",
    "EmbeddingModel",
    "GenerateOptions",
    "GenerationCancelled",
    "Grammar",
    "GrammarError",
    "InsufficientMemoryError",
    "KVState",
    "Model",
    "ModelFormatError",
    "ModelNotFoundError",
    "PlanError",
    "Result",
    "Stream",
    "Thinking",
    "ThinkingError",
    "TokenLogprob",
    "ToolCall",
    "ToolError",
    "__version__",
    "load",
    "load_embedder",
    "serve",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'edge' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
