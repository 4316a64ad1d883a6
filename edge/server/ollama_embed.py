"""Ollama's `POST /api/embed` and its older `POST /api/embeddings`, on the embedding models `/v1/embeddings`
serves (edge/server/embeddings.py), in Ollama's shapes.

`/api/embed`: `input` a string or a list of strings, `truncate` (Ollama's default true: an input past the
model's maximum is cut to it, the end marker kept; false: a 400 naming its token count and the limit) ->
`{"model", "embeddings", "total_duration", "load_duration", "prompt_eval_count"}`. `/api/embeddings`:
`prompt` -> `{"embedding"}`. `keep_alive` is taken (embedding models stay loaded while the server runs);
`options` and `dimensions` are a 400 naming them, never ignored. Errors are Ollama's `{"error": ...}`.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge.errors import ContextOverflowError, EdgeError, ModelFormatError, ModelNotFoundError, TokenizerError
from edge.server.embeddings import MAX_INPUTS, Embedders

__all__ = ["ollama_embed_routes"]

_TAG = ":latest"


class EmbedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[str]
    truncate: bool = True
    keep_alive: str | int | float | None = None
    options: dict[str, Any] | None = None
    dimensions: int | None = None


class LegacyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    prompt: str
    keep_alive: str | int | float | None = None
    options: dict[str, Any] | None = None


def _error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status)


class OllamaEmbed:
    def __init__(self, embedders: Embedders) -> None:
        self.embedders = embedders

    async def embed(self, request: Request) -> Response:
        return await self._answer(request, EmbedRequest, legacy=False)

    async def embeddings(self, request: Request) -> Response:
        return await self._answer(request, LegacyRequest, legacy=True)

    async def _answer(self, request: Request, kind: type[BaseModel], *, legacy: bool) -> Response:
        try:
            req = kind.model_validate_json(await request.body())
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err.get("loc", ())) or "body"
            return _error(f"{where}: {err.get('msg', 'invalid value')}")
        unsupported = [k for k in ("options", "dimensions") if getattr(req, k, None)]
        if unsupported:
            return _error(f"{unsupported[0]} is not supported for embedding models here")
        try:
            return JSONResponse(await run_in_threadpool(self._run, req, legacy))
        except ModelNotFoundError as exc:
            return _error(str(exc), 404)
        except (ModelFormatError, ContextOverflowError, TokenizerError, ValueError) as exc:
            return _error(str(exc))
        except EdgeError as exc:
            return _error(str(exc), 500)

    def _run(self, req: Any, legacy: bool) -> dict[str, Any]:
        name = req.model[: -len(_TAG)] if req.model.endswith(_TAG) else req.model
        t0 = time.perf_counter()
        model = self.embedders.get(name)
        t1 = time.perf_counter()
        texts = [req.prompt] if legacy else ([req.input] if isinstance(req.input, str) else req.input)
        if len(texts) > MAX_INPUTS:
            raise ValueError(f"input: {len(texts)} inputs; at most {MAX_INPUTS} per request")
        if not texts or any(not t for t in texts):
            raise ValueError("input: an empty string has no embedding")
        seqs = model.tokenize(texts, truncate=legacy or req.truncate)
        vectors = model.embed_tokens(seqs)
        if legacy:
            return {"embedding": [float(x) for x in vectors[0]]}
        ns = lambda s: int(s * 1e9)  # noqa: E731 (Ollama's durations are nanoseconds)
        return {
            "model": req.model,
            "embeddings": [[float(x) for x in v] for v in vectors],
            "total_duration": ns(time.perf_counter() - t0),
            "load_duration": ns(t1 - t0),
            "prompt_eval_count": sum(len(s) for s in seqs),
        }


def ollama_embed_routes(embedders: Embedders) -> list[Route]:
    api = OllamaEmbed(embedders)
    return [
        Route("/api/embed", api.embed, methods=["POST"]),
        Route("/api/embeddings", api.embeddings, methods=["POST"]),
    ]
