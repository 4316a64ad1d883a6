"""The Starlette app: OpenAI's chat completions and completions, one handler per endpoint, errors in
OpenAI's error shape; the other protocols (responses.py, anthropic.py, ollama.py) add their routes over the
same request core (core.py).

Handlers validate and bound the request, render the prompt off the event loop, hand a `Job` to the model's
scheduler and stream its pieces back (SSE via sse-starlette) or wait for its result. A client that goes away
cancels its job; the generation polls the cancel between tokens. Once the server is stopping (drain.py) a new
generation is a 503, and one cut at the end of the grace ends as OpenAI's clients understand it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge.model import Result
from edge.reasoning import ReasoningSplitter, split_reasoning
from edge.server import anthropic, ollama, responses
from edge.server import logprobs as lp
from edge.server import protocol as p
from edge.server.config import ServerConfig
from edge.server.core import (
    ClientGone,
    Core,
    CoreRequest,
    Prepared,
    classify,
    extra_stats,
    wait_or_gone,
)
from edge.server.drain import Drain
from edge.server.embeddings import embedding_routes, start_embedders
from edge.server.ollama_embed import ollama_embed_routes
from edge.server.ollama_lifecycle import ollama_lifecycle_routes
from edge.server.registry import Registry
from edge.server.scheduler import Failed, Job
from edge.server.security import Guard
from edge.tools import CallSplitter, ToolCall

__all__ = ["create_app"]


# -- errors ----------------------------------------------------------------------------------------
def error_response(exc: BaseException) -> JSONResponse:
    """An exception as OpenAI's error object and the HTTP status that goes with it."""
    e = classify(exc)
    return JSONResponse(
        p.error_body(e.message, e.kind, param=e.param, code=e.code), e.status, headers=e.headers
    )


class Handlers:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.registry = core.registry
        self.drain = core.drain
        self.started = time.time()

    def _chat_request(self, body: bytes) -> CoreRequest:
        req = p.ChatCompletionRequest.model_validate_json(body)
        req.check()
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        return CoreRequest(
            req.model,
            messages=req.chat_messages(),
            tools=req.tools,
            tool_choice=req.tool_choice,
            parallel_tool_calls=req.parallel_tool_calls,
            options=req.sampling(),
            max_tokens=req.token_budget,
            max_tokens_param=param,
            stream=req.stream,
            include_usage=req.include_usage,
            thinking=req.thinking(),
        )

    def _completion_request(self, body: bytes) -> CoreRequest:
        req = p.CompletionRequest.model_validate_json(body)
        req.check()
        return CoreRequest(
            req.model,
            prompt=req.text(),
            options=req.sampling(),
            max_tokens=req.token_budget,
            prompt_param="prompt",
            stream=req.stream,
            include_usage=req.include_usage,
        )

    # -- endpoints -------------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        models = {name: s.stats() for name, s in self.registry.loaded().items()}
        if self.drain.stopping:  # a load balancer sends no more here
            return JSONResponse({"status": "stopping", "models": models}, 503)
        return JSONResponse({"status": "ok", "models": models})

    async def models(self, request: Request) -> Response:
        return JSONResponse(p.models_response(self.registry.names(), self.registry.created))

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, *, chat: bool) -> Response:
        try:
            self.core.check_open()
            body = await request.body()  # the Guard raises BodyTooLarge past the limit
            prep, job = await self.core.start(
                self._chat_request(body) if chat else self._completion_request(body)
            )
        except Exception as exc:
            return error_response(exc)
        rid = p.new_id("chatcmpl" if chat else "cmpl")
        if prep.stream:
            return EventSourceResponse(self._events(job, prep, rid, chat), ping=15)
        try:
            text, result = await wait_or_gone(job, prep.sched, request)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        except Exception as exc:
            return error_response(exc)
        usage, extra = _usage(result), extra_stats(result, job, prep.notes)
        logprobs = lp.result_logprobs(result.logprobs, chat)
        if not chat:
            finish = p.finish_reason(extra["stop_reason"])
            body = p.completion_response(rid, prep.model, text, finish, usage, extra, logprobs)
            return JSONResponse(body)
        reasoning, text = split_reasoning(text, prep.thinking)
        content, calls = (text, []) if prep.tools is None else prep.tools.split(text)
        finish = p.finish_reason(extra["stop_reason"], len(calls))
        made = [c.openai() for c in calls]
        thought = (
            reasoning if prep.thinking is not None and reasoning else None
        )  # as llama.cpp: no empty field
        body = p.chat_response(
            rid,
            prep.model,
            content,
            finish,
            usage,
            extra,
            tool_calls=made,
            logprobs=logprobs,
            reasoning=thought,
        )
        return JSONResponse(body)

    async def _events(self, job: Job, prep: Prepared, rid: str, chat: bool) -> AsyncIterator[dict[str, str]]:
        created = int(time.time())
        done = False
        splitter = prep.splitter()
        thoughts = prep.reasoning_splitter() if chat else None
        logprobs = lp.ChunkLogprobs(chat)
        try:
            if chat:
                yield _data(p.chat_chunk(rid, prep.model, created, {"role": "assistant", "content": ""}))
            while True:
                item = await job.items.get()
                if isinstance(item, str):
                    logs = logprobs(item)
                    if not chat:
                        yield _data(p.completion_chunk(rid, prep.model, created, item, logprobs=logs))
                        continue
                    deltas = _chat_deltas(thoughts, splitter, item)
                    if logs is not None and not deltas:  # text held (a call may start): its entries go now
                        deltas = [{"content": ""}]
                    for i, delta in enumerate(deltas):
                        yield _data(
                            p.chat_chunk(rid, prep.model, created, delta, logprobs=logs if i == 0 else None)
                        )
                    continue
                done = True
                if isinstance(item, Failed):
                    yield _data(json.loads(error_response(item.error).body))
                    return
                if chat:
                    for delta in _chat_deltas(thoughts, splitter, None):
                        yield _data(p.chat_chunk(rid, prep.model, created, delta))
                result = item.result
                extra = extra_stats(result, job, prep.notes)
                finish = p.finish_reason(extra["stop_reason"], 0 if splitter is None else splitter.calls)
                if chat:
                    yield _data(p.chat_chunk(rid, prep.model, created, {}, finish, extra=extra))
                else:
                    yield _data(p.completion_chunk(rid, prep.model, created, "", finish, extra=extra))
                if prep.include_usage:
                    make = p.chat_chunk if chat else p.completion_chunk
                    yield _data(make(rid, prep.model, created, None, usage=_usage(result)))
                yield {"data": "[DONE]"}
                return
        finally:
            if not done:  # the client went away (or the server is stopping): stop generating
                prep.sched.withdraw(job)


def _chat_deltas(
    thoughts: ReasoningSplitter | None, splitter: CallSplitter | None, piece: str | None
) -> list[dict[str, Any]]:
    """A piece of the output as chat deltas: a thinking model's reasoning as `reasoning_content` (llama.cpp's
    and vLLM's delta field), the rest as `_deltas`. `piece=None`: the end of the output."""
    if thoughts is None:
        return _deltas(splitter, piece)
    out: list[dict[str, Any]] = []
    for is_reasoning, text in thoughts.finish() if piece is None else thoughts.feed(piece):
        out += [{"reasoning_content": text}] if is_reasoning else _deltas(splitter, text)
    return out + (_deltas(splitter, None) if piece is None else [])


def _deltas(splitter: CallSplitter | None, piece: str | None) -> list[dict[str, Any]]:
    """A piece of the answer as chat deltas: text as content, a finished tool call as OpenAI streams one (its
    index, id, name and the whole arguments in one delta). `piece=None`: the end of the answer."""
    if splitter is None:
        return [] if piece is None else [{"content": piece}]
    items = splitter.finish() if piece is None else splitter.feed(piece)
    index = splitter.calls - sum(isinstance(item, ToolCall) for item in items)  # the first new call's
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, ToolCall):
            out.append({"tool_calls": [item.openai(index=index)]})
            index += 1
        else:
            out.append({"content": item})
    return out


def _data(obj: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(obj, ensure_ascii=False, separators=(",", ":"))}


def _usage(result: Result) -> p.Usage:
    s = result.stats
    return p.Usage(
        prompt_tokens=s.n_prompt_tokens,
        completion_tokens=s.n_tokens,
        total_tokens=s.n_prompt_tokens + s.n_tokens,
        prompt_tokens_details={"cached_tokens": s.n_cached_tokens},
    )


async def _reap(registry: Registry, every_s: float = 0.5) -> None:
    """Unload the models idle past their keep-alive, for the server's life."""
    while True:
        await asyncio.sleep(every_s)
        await run_in_threadpool(registry.reap)


# -- the app ---------------------------------------------------------------------------------------
def create_app(config: ServerConfig, registry: Registry, drain: Drain) -> Any:
    """The ASGI app for a started `registry` (its models loaded), stopped by `drain`; the app closes the
    registry on shutdown."""
    core = Core(config, registry, drain)
    h = Handlers(core)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        draining = asyncio.create_task(drain.run())
        reaping = asyncio.create_task(_reap(registry))
        yield
        draining.cancel()  # done unless uvicorn was stopped some other way
        reaping.cancel()
        await run_in_threadpool(registry.close)  # cancels what still runs, frees the models

    embedders = start_embedders(config, registry)
    routes = [
        Route("/health", h.health, methods=["GET"]),
        Route("/v1/models", h.models, methods=["GET"]),
        Route("/v1/chat/completions", h.chat_completions, methods=["POST"]),
        Route("/v1/completions", h.completions, methods=["POST"]),
        *responses.routes(core),  # the other protocols, each a translation over the same core
        *anthropic.routes(core),
        *ollama.routes(core),
        *embedding_routes(embedders, registry),
        *ollama_embed_routes(embedders),
        *ollama_lifecycle_routes(core, embedders),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse(p.error_body(f"no route {request.url.path}", "invalid_request_error"), 404)

    async def not_allowed(request: Request, exc: Exception) -> Response:
        return JSONResponse(
            p.error_body(f"{request.method} is not allowed here", "invalid_request_error"), 405
        )

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_allowed)
    guarded = Guard(
        app,
        api_key=config.api_key,
        allowed_hosts=config.allowed_hosts,
        max_body_bytes=config.limits.max_body_bytes,
        cors_origins=config.cors_origins,
    )
    outer: Any = guarded
    if config.cors_origins:  # preflights (no Authorization header) are answered before the key check
        outer = CORSMiddleware(
            guarded,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "x-api-key", "anthropic-version"],
        )
    return drain.track(outer)
