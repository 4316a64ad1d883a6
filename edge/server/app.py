"""The Starlette app: one handler per endpoint, errors in OpenAI's error shape.

Handlers validate and bound the request, render the prompt off the event loop, hand a `Job` to the model's
scheduler and stream its pieces back (SSE via sse-starlette) or wait for its result. A client that goes away
cancels its job; the generation polls the cancel between tokens. Once the server is stopping (drain.py) a new
generation is a 503, and one cut at the end of the grace ends as OpenAI's clients understand it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sse_starlette.sse import EventSourceResponse
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge.errors import (
    ContextOverflowError,
    EdgeError,
    GrammarError,
    ModelNotFoundError,
    TemplateError,
    ToolError,
)
from edge.generate import GenerationConfig
from edge.grammar import check_grammar
from edge.logprobs import TokenLogprob
from edge.model import Model, Result, Stream
from edge.options import GenerateOptions
from edge.server import logprobs as lp
from edge.server import protocol as p
from edge.server.config import ServerConfig
from edge.server.drain import Drain
from edge.server.registry import ModelBusyError, Registry
from edge.server.scheduler import Done, Failed, Job, QueueFull, Scheduler, ServerStopping
from edge.server.security import BodyTooLarge, Guard
from edge.tools import CallSplitter, ToolCall, ToolPlan

log = logging.getLogger("edge.server")

__all__ = ["create_app"]


class ClientGone(Exception):
    pass


# -- errors ----------------------------------------------------------------------------------------
def error_response(exc: BaseException) -> JSONResponse:
    """An exception as OpenAI's error object and the HTTP status that goes with it."""
    headers: dict[str, str] = {}
    param: str | None = None
    code: str | None = None
    if isinstance(exc, p.UnsupportedValue):
        status, kind, param = 400, "invalid_request_error", exc.param
    elif isinstance(exc, ValidationError):
        err = exc.errors()[0]
        status, kind, param = 400, "invalid_request_error", _loc(err.get("loc", ()))
        exc = ValueError(
            f"{param}: {err.get('msg', 'invalid value')}" if param else err.get("msg", "invalid")
        )
    elif isinstance(exc, BodyTooLarge):
        status, kind, code = 413, "invalid_request_error", "request_too_large"
        exc = ValueError("the request body is too large")
    elif isinstance(exc, ModelNotFoundError):
        status, kind, param, code = 404, "invalid_request_error", "model", "model_not_found"
    elif isinstance(exc, QueueFull):
        status, kind, code = 429, "rate_limit_error", "queue_full"
        headers["Retry-After"] = str(exc.retry_after)
    elif isinstance(exc, ModelBusyError):
        status, kind, code = 503, "server_error", "models_busy"
    elif isinstance(exc, GrammarError):
        status, kind, param = 400, "invalid_request_error", "response_format"
    elif isinstance(exc, ToolError):
        status, kind, param = 400, "invalid_request_error", "tools"
    elif isinstance(exc, ServerStopping):
        status, kind, code = 503, "server_error", "server_shutting_down"
        headers["Connection"] = "close"  # this connection has nothing more to serve
    elif isinstance(exc, ContextOverflowError):
        status, kind, param, code = 400, "invalid_request_error", "messages", "context_length_exceeded"
    elif isinstance(exc, TemplateError):
        status, kind, code = 500, "server_error", "template_error"
    elif isinstance(exc, EdgeError):
        status, kind = 500, "server_error"
    elif isinstance(exc, (ValueError, TypeError)):
        status, kind = 400, "invalid_request_error"
    else:
        status, kind = 500, "server_error"
        exc = RuntimeError(f"internal error: {type(exc).__name__}")
    return JSONResponse(p.error_body(str(exc), kind, param=param, code=code), status, headers=headers)


def _loc(loc: tuple[Any, ...]) -> str | None:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not out:
            out = str(part)
        elif part not in ("str", "list[TextPart]", "list[str]"):  # pydantic's union branch names
            out += f".{part}"
    return out or None


# -- the request, prepared -------------------------------------------------------------------------
Runner = Callable[[Model, Callable[[], bool], Callable[[str], None]], Result]


@dataclass(frozen=True)
class Prepared:
    """A validated request: its prompt ids, how to run it and what it asked for."""

    model: str
    sched: Scheduler
    prompt_ids: list[int]
    run: Runner
    stream: bool
    include_usage: bool
    tools: ToolPlan | None = None
    notes: tuple[str, ...] = ()  # what reading the request's schemas dropped (the `edge` field says it)

    def splitter(self) -> CallSplitter | None:
        """What reads the answer's tool calls out of its text (None: the request can make none)."""
        return CallSplitter(self.tools) if self.tools is not None and self.tools.active else None


def _render(sched: Scheduler, messages: list[dict[str, Any]], plan: ToolPlan | None) -> tuple[list[int], int]:
    """A conversation's prompt ids and its system prompt span, rendered once, here, for every replica.
    NOTE: one template renders at a time (its sandbox keeps one deadline per template)."""
    model = sched.replicas[0]
    with sched.render_lock:
        span = model.system_span(messages if plan is None else plan.messages(messages))
        return model.chat_ids(messages, plan), span


def _runner(ids: list[int], config: GenerationConfig, keep: int | None) -> Runner:
    """The job's body: generate from the prompt ids on the replica it is given (reusing its KV prefix)."""

    def run(model: Model, cancel: Callable[[], bool], emit: Callable[[str], None]) -> Result:
        entries: list[TokenLogprob] = []
        pieces = model.stream_ids(ids, config, cancel=cancel, reuse=True, keep=keep, logprobs_into=entries)
        stream = Stream(pieces)
        with stream:
            if config.logprobs is not None:
                lp.relay(stream, entries, emit)
            else:
                for piece in stream:
                    emit(piece)
        assert stream.result is not None
        return stream.result

    return run


def _config(
    sched: Scheduler, opts: dict[str, Any], plan: ToolPlan | None = None
) -> tuple[GenerationConfig, tuple[str, ...]]:
    """The request's GenerationConfig and the notes of reading its schemas; invalid options and a grammar the
    engine cannot enforce are a 400 before the job is queued (compiling a grammar takes milliseconds once the
    model's vocabulary is indexed)."""
    config = GenerateOptions(**opts).config()
    notes = (() if config.grammar is None else config.grammar.notes) + (() if plan is None else plan.notes)
    if plan is not None:
        config = plan.constrain(config)
    if config.grammar is not None:
        model = sched.replicas[0]
        check_grammar(config.grammar, model.tokenizer, model.decoder.vocab_size)
    for note in notes:
        log.info("request note: %s", note)
    return config, notes


class Handlers:
    def __init__(self, config: ServerConfig, registry: Registry, drain: Drain) -> None:
        self.config = config
        self.limits = config.limits
        self.registry = registry
        self.drain = drain
        self.started = time.time()

    def _check_open(self) -> None:
        if self.drain.stopping:
            raise ServerStopping()

    async def _body(self, request: Request) -> bytes:
        return await request.body()  # the Guard raises BodyTooLarge past the limit

    def _budget(self, asked: int | None, param: str, n_prompt: int, n_ctx: int) -> int:
        if asked is not None and asked > self.limits.max_tokens:
            raise p.UnsupportedValue(param, f"{param} is at most {self.limits.max_tokens} on this server")
        room = max(1, n_ctx - n_prompt)
        return asked if asked is not None else min(self.limits.max_tokens, room)

    def _check_prompt(self, n_prompt: int, n_ctx: int, param: str) -> None:
        limit = self.limits.max_prompt_tokens or n_ctx
        if n_prompt > min(limit, n_ctx):
            raise ContextOverflowError(
                f"the prompt has {n_prompt} tokens; this model takes at most {min(limit, n_ctx)} ({param})"
            )

    async def _scheduler(self, name: str) -> Scheduler:
        return await run_in_threadpool(self.registry.get, name)

    async def _prepare_chat(self, body: bytes) -> Prepared:
        req = p.ChatCompletionRequest.model_validate_json(body)
        req.check()
        if len(req.messages) > self.limits.max_messages:
            raise p.UnsupportedValue("messages", f"at most {self.limits.max_messages} messages per request")
        messages = req.chat_messages()
        sched = await self._scheduler(req.model)
        first = sched.replicas[0]
        plan = first.tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls)
        ids, keep = await run_in_threadpool(_render, sched, messages, plan)
        n_ctx = sched.replicas[0].decoder.n_ctx
        self._check_prompt(len(ids), n_ctx, "messages")
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        opts = {**req.sampling(), "max_tokens": self._budget(req.token_budget, param, len(ids), n_ctx)}
        config, notes = await run_in_threadpool(_config, sched, opts, plan)
        run = _runner(ids, config, keep)
        return Prepared(req.model, sched, ids, run, req.stream, req.include_usage, plan, notes)

    async def _prepare_completion(self, body: bytes) -> Prepared:
        req = p.CompletionRequest.model_validate_json(body)
        req.check()
        prompt = req.text()
        sched = await self._scheduler(req.model)
        first = sched.replicas[0]
        ids = await run_in_threadpool(first.encode_prompt, prompt)
        n_ctx = first.decoder.n_ctx
        self._check_prompt(len(ids), n_ctx, "prompt")
        opts = {**req.sampling(), "max_tokens": self._budget(req.token_budget, "max_tokens", len(ids), n_ctx)}
        config, notes = await run_in_threadpool(_config, sched, opts)
        run = _runner(ids, config, None)
        return Prepared(req.model, sched, ids, run, req.stream, req.include_usage, notes=notes)

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
            self._check_open()
            body = await self._body(request)
            prep = await (self._prepare_chat(body) if chat else self._prepare_completion(body))
            self._check_open()  # on the loop, as the drain's cut: a job submitted before it is cut by it
            job = Job(prep.prompt_ids, prep.run, asyncio.get_running_loop())
            prep.sched.submit(job)
        except Exception as exc:
            return error_response(exc)
        rid = p.new_id("chatcmpl" if chat else "cmpl")
        if prep.stream:
            return EventSourceResponse(self._events(job, prep, rid, chat), ping=15)
        try:
            text, result = await _wait_or_gone(job, prep.sched, request)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        except Exception as exc:
            return error_response(exc)
        usage, extra = _usage(result), _extra(result, job, prep.notes)
        logprobs = lp.result_logprobs(result.logprobs, chat)
        if not chat:
            finish = p.finish_reason(extra["stop_reason"])
            body = p.completion_response(rid, prep.model, text, finish, usage, extra, logprobs)
            return JSONResponse(body)
        content, calls = (text, []) if prep.tools is None else prep.tools.split(text)
        finish = p.finish_reason(extra["stop_reason"], len(calls))
        made = [c.openai() for c in calls]
        body = p.chat_response(
            rid, prep.model, content, finish, usage, extra, tool_calls=made, logprobs=logprobs
        )
        return JSONResponse(body)

    async def _events(self, job: Job, prep: Prepared, rid: str, chat: bool) -> AsyncIterator[dict[str, str]]:
        created = int(time.time())
        done = False
        splitter = prep.splitter()
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
                    deltas = _deltas(splitter, item)
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
                if splitter is not None:
                    for delta in _deltas(splitter, None):
                        yield _data(p.chat_chunk(rid, prep.model, created, delta))
                result = item.result
                extra = _extra(result, job, prep.notes)
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


def _extra(result: Result, job: Job, notes: tuple[str, ...] = ()) -> dict[str, Any]:
    """edge's own statistics, in the `edge` field of a response (clients that do not know it ignore it)."""
    s = result.stats
    cut = job.shutdown and s.stop_reason == "cancelled"  # it may have ended by itself at the same token
    return {
        "ttft_ms": round(s.ttft_ms, 2),
        "prefill_tok_s": round(s.prefill_tok_s, 1),
        "decode_tok_s": round(s.decode_tok_s, 1),
        "queue_ms": round(job.queue_ms, 2),
        "batch": None if job.batch is None else round(job.batch, 2),  # mean requests per step it rode in
        "copied_tokens": job.copied,  # prompt tokens whose KV was copied from another slot (in cached_tokens)
        "cached_tokens": s.n_cached_tokens,
        "stop_reason": "shutdown" if cut else s.stop_reason,
        "backend": f"{result.backend}:{result.device}",
        "fallback": result.fallback,
        "draft": None if s.draft is None else s.draft.to_dict(),
        **({"notes": list(notes)} if notes else {}),  # e.g. a schema's annotation keys, ignored
    }


async def _collect(job: Job) -> tuple[str, Result]:
    pieces: list[str] = []
    while True:
        item = await job.items.get()
        if isinstance(item, str):
            pieces.append(item)
        elif isinstance(item, Failed):
            raise item.error
        else:
            assert isinstance(item, Done)
            return "".join(pieces), item.result


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _wait_or_gone(job: Job, sched: Scheduler, request: Request) -> tuple[str, Result]:
    """The job's text and result; a client that disconnects first cancels it (ClientGone)."""
    result = asyncio.ensure_future(_collect(job))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not result.done():
            result.cancel()
            sched.withdraw(job)
    if result in done:
        return result.result()
    raise ClientGone


# -- the app ---------------------------------------------------------------------------------------
def create_app(config: ServerConfig, registry: Registry, drain: Drain) -> Any:
    """The ASGI app for a started `registry` (its models loaded), stopped by `drain`; the app closes the
    registry on shutdown."""
    h = Handlers(config, registry, drain)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        draining = asyncio.create_task(drain.run())
        yield
        draining.cancel()  # done unless uvicorn was stopped some other way
        await run_in_threadpool(registry.close)  # cancels what still runs, frees the models

    routes = [
        Route("/health", h.health, methods=["GET"]),
        Route("/v1/models", h.models, methods=["GET"]),
        Route("/v1/chat/completions", h.chat_completions, methods=["POST"]),
        Route("/v1/completions", h.completions, methods=["POST"]),
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
    )
    outer: Any = guarded
    if config.cors_origins:  # preflights (no Authorization header) are answered before the key check
        outer = CORSMiddleware(
            guarded,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    return drain.track(outer)
