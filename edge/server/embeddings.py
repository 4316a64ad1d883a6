"""`POST /v1/embeddings` in OpenAI's shape, on the embedding models `edge serve` holds beside its chat models.

`input`: a string, a list of strings, a list of token ids or a list of such lists (ids of the text alone; the
model's [CLS]/[SEP] are added as for text). `encoding_format`: float or base64 (little-endian float32, which
the openai client asks for by default). `dimensions`: a 400, as no catalog embedding model is trained to be
cut (Matryoshka). Bad input is a 400 naming what is wrong: an input over the model's maximum (its token count
and the limit; no silent truncation, as OpenAI), an empty string, ids outside the vocabulary, a chat model;
more than `MAX_INPUTS` inputs is a 413.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge.errors import (
    ContextOverflowError,
    EdgeError,
    ModelFormatError,
    ModelInUseError,
    ModelNotFoundError,
    TokenizerError,
)
from edge.server.config import ServerConfig
from edge.server.protocol import error_body

__all__ = ["MAX_INPUTS", "Embedders", "EmbeddingRequest", "embedding_routes", "start_embedders"]

log = logging.getLogger("edge.server")

MAX_INPUTS = 2048  # OpenAI's own bound on inputs per request
ENCODER_BACKENDS = ("auto", "ort", "openvino")


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class TooManyInputs(Exception):
    pass


class Embedders:
    """The embedding models of one server: those named at start, and pulled catalog ones on first use."""

    def __init__(self, config: ServerConfig) -> None:
        from edge.models.encoder_source import is_embedding_model

        self.config = config
        self._lock = threading.Lock()
        self._loaded: dict[str, Any] = {}
        self.named = [ref for ref in config.models if is_embedding_model(ref)]

    def start(self) -> None:
        for ref in self.named:
            model = self._open(ref)
            with self._lock:
                self._loaded[model.name] = model  # a folder by its name: ids, never paths

    def get(self, name: str) -> Any:
        """The EmbeddingModel `name` names: one named at start, or a pulled catalog embedding model, loaded on
        first use (blocking: call it off the event loop). Paths are not taken from requests."""
        from edge.models.catalog import lookup
        from edge.models.store import is_verified

        key = _key(name)
        loaded = self._loaded.get(key)  # no wait behind another model's load
        if loaded is not None:
            return loaded
        with self._lock:
            if key in self._loaded:
                return self._loaded[key]
            entry = lookup(name)
            if entry is not None and not entry.embedding:
                raise ModelFormatError(
                    f"{entry.name} is a chat model (text generation), not an embedding model"
                )
            if entry is None or not is_verified(entry):
                raise ModelNotFoundError(
                    f"the embedding model {name!r} does not exist on this server",
                    hint="name it to `edge serve`, or `edge pull` a catalog embedding model",
                )
            self._loaded[key] = self._open(name)
            return self._loaded[key]

    def _open(self, name: str) -> Any:
        from edge.embed import load_embedder

        s = self.config.load
        backend = s.backend if s.backend in ENCODER_BACKENDS else "auto"  # llamacpp: a decoder's backend
        model = load_embedder(name, backend=backend, precision=s.precision, n_threads=s.n_threads)
        log.info("loaded embedding model %s on %s (%s)", model.name, model.backend, model.precision)
        return model

    def names(self) -> list[str]:
        return list(self._loaded)

    @contextlib.contextmanager
    def unused(self, name: str) -> Iterator[None]:
        """Holds the load lock while embedding model `name` is not loaded (see Registry.unused)."""
        with self._lock:
            if _key(name) in self._loaded:
                raise ModelInUseError(
                    f"{name} is loaded on this server as an embedding model; it cannot be deleted",
                    hint="stop the server first, or delete it with `edge rm` then",
                )
            yield


def _key(name: str) -> str:
    from edge.models.catalog import lookup

    entry = lookup(name)
    return entry.name if entry is not None else name


def _bad(
    message: str, param: str | None = "input", status: int = 400, code: str | None = None
) -> JSONResponse:
    return JSONResponse(error_body(message, "invalid_request_error", param=param, code=code), status)


class EmbeddingsHandler:
    def __init__(self, embedders: Embedders, chat_names: Any) -> None:
        self.embedders = embedders
        self._chat_names = chat_names  # () -> the chat models' names, to say what a wrong model is

    async def handle(self, request: Request) -> Response:
        try:
            req = EmbeddingRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ())[:1]) or None
            return _bad(f"{where}: {err.get('msg', 'invalid value')}", where)
        if req.dimensions is not None:
            return _bad("dimensions: this model's vectors cannot be shortened", "dimensions")
        if req.model in self._chat_names():
            return _bad(
                f"{req.model} is a chat model (text generation); it makes no embeddings here", "model"
            )
        try:
            return JSONResponse(await run_in_threadpool(self._embed, req))
        except TooManyInputs as exc:
            return _bad(str(exc), status=413, code="too_many_inputs")
        except ModelNotFoundError as exc:
            return _bad(str(exc), "model", 404, "model_not_found")
        except ModelFormatError as exc:  # a chat model or a folder edge does not read
            return _bad(str(exc), "model")
        except ContextOverflowError as exc:
            return _bad(str(exc), code="context_length_exceeded")
        except (TokenizerError, ValueError) as exc:
            return _bad(str(exc))
        except EdgeError as exc:
            return JSONResponse(error_body(str(exc), "server_error"), 500)

    def _embed(self, req: EmbeddingRequest) -> dict[str, Any]:
        model = self.embedders.get(req.model)
        seqs = self._tokens(model, req.input)
        vectors = model.embed_tokens(seqs)
        data = [
            {"object": "embedding", "index": i, "embedding": _encode(v, req.encoding_format)}
            for i, v in enumerate(vectors)
        ]
        n = sum(len(s) for s in seqs)
        return {
            "object": "list",
            "data": data,
            "model": req.model,
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }

    @staticmethod
    def _tokens(model: Any, value: Any) -> list[list[int]]:
        items = [value] if isinstance(value, str) or (value and isinstance(value[0], int)) else list(value)
        if not items:
            raise ValueError("input: at least one input is needed")
        if len(items) > MAX_INPUTS:
            raise TooManyInputs(f"input: {len(items)} inputs; at most {MAX_INPUTS} per request")
        if all(isinstance(x, str) for x in items):
            empty = [i for i, x in enumerate(items) if not x]
            if empty:
                raise ValueError(f"input[{empty[0]}] is an empty string")
            return model.tokenize(items)
        if any(not x for x in items):
            raise ValueError("input: an empty list of token ids")
        return model.wrap_ids(items)


def _encode(v: Any, fmt: str) -> Any:
    if fmt == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]


def start_embedders(config: ServerConfig, registry: Any) -> Embedders:
    """The server's embedding models, loaded now (those `config.models` names that are embedding models)."""
    embedders = Embedders(config)
    embedders.start()
    registry.list_embedders(embedders.names())
    return embedders


def embedding_routes(embedders: Embedders, registry: Any) -> list[Route]:
    handler = EmbeddingsHandler(embedders, registry.chat_names)
    return [Route("/v1/embeddings", handler.handle, methods=["POST"])]
