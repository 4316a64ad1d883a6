"""The request core every protocol layer shares: one internal request in, its answer or its stream out.

A protocol (OpenAI's chat completions, Ollama's /api, Anthropic's Messages, OpenAI's Responses) translates its
request into a `CoreRequest` (messages or a raw prompt, OpenAI-shaped tools and tool_choice, GenerateOptions
fields, a token budget, stream or not) and translates back what comes out. Everything the core does holds for
all of them: the prompt rendered and bounded, the grammar for a tool_choice or a schema checked before a job
is queued (the mask's guarantee), batching through the model's scheduler, cancellation when the client goes
away, the drain's 503 and cut. `classify` says which HTTP status and kind an exception is; each protocol
writes it in its own error shape.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from edge.errors import (
    ContextOverflowError,
    EdgeError,
    GrammarError,
    ModelInUseError,
    ModelNotFoundError,
    TemplateError,
    ThinkingError,
    ToolError,
)
from edge.generate import GenerationConfig
from edge.grammar import check_grammar
from edge.logprobs import TokenLogprob
from edge.model import Model, Result, Stream
from edge.options import GenerateOptions
from edge.reasoning import (
    ReasoningSplitter,
    ReasoningText,
    Thinking,
    ThinkingConfig,
    ThinkingPlan,
    split_reasoning,
)
from edge.server import logprobs as lp
from edge.server.config import ServerConfig
from edge.server.drain import Drain
from edge.server.registry import ModelBusyError, Registry
from edge.server.scheduler import Done, Failed, Job, QueueFull, Scheduler, ServerStopping
from edge.server.security import BodyTooLarge
from edge.server.unsupported import UnsupportedValue
from edge.tools import CallSplitter, ToolCall, ToolPlan

__all__ = [
    "ClientGone",
    "Core",
    "CoreRequest",
    "Outcome",
    "Prepared",
    "Problem",
    "classify",
    "disconnected",
    "extra_stats",
    "wait_or_gone",
]

log = logging.getLogger("edge.server")


class ClientGone(Exception):
    pass


# -- errors ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Problem:
    """An exception as HTTP sees it: status, OpenAI's error kind, message, the field at fault."""

    status: int
    kind: str
    message: str
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def classify(exc: BaseException) -> Problem:
    """The status, kind and message of an exception (an unexpected one says only its type)."""
    headers: dict[str, str] = {}
    param: str | None = None
    code: str | None = None
    message = str(exc)
    if isinstance(exc, UnsupportedValue):
        status, kind, param = 400, "invalid_request_error", exc.param
    elif isinstance(exc, ValidationError):
        err = exc.errors()[0]
        status, kind, param = 400, "invalid_request_error", _loc(err.get("loc", ()))
        message = f"{param}: {err.get('msg', 'invalid value')}" if param else err.get("msg", "invalid")
    elif isinstance(exc, BodyTooLarge):
        status, kind, code = 413, "invalid_request_error", "request_too_large"
        message = "the request body is too large"
    elif isinstance(exc, ModelNotFoundError):
        status, kind, param, code = 404, "invalid_request_error", "model", "model_not_found"
    elif isinstance(exc, QueueFull):
        status, kind, code = 429, "rate_limit_error", "queue_full"
        headers["Retry-After"] = str(exc.retry_after)
    elif isinstance(exc, ModelInUseError):  # a delete refused: the client's to change, not a server fault
        status, kind, param, code = 400, "invalid_request_error", "model", "model_in_use"
    elif isinstance(exc, ModelBusyError):
        status, kind, code = 503, "server_error", "models_busy"
    elif isinstance(exc, GrammarError):
        status, kind, param = 400, "invalid_request_error", "response_format"
    elif isinstance(exc, ThinkingError):
        status, kind, param = 400, "invalid_request_error", exc.param
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
        message = f"internal error: {type(exc).__name__}"
    return Problem(status, kind, message, param, code, headers)


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


# -- the internal request --------------------------------------------------------------------------
@dataclass(frozen=True)
class CoreRequest:
    """One generation request, whatever protocol it came in by."""

    model: str
    messages: list[dict[str, Any]] | None = None  # a conversation, rendered by the chat template
    prompt: str | None = None  # or a raw prompt, sent as it is
    tools: list[dict[str, Any]] | None = None  # OpenAI's shape: {"type": "function", "function": {...}}
    tool_choice: Any = None  # OpenAI's values: auto | none | required | {"type": "function", ...}
    parallel_tool_calls: bool | None = None
    options: dict[str, Any] = field(default_factory=dict)  # GenerateOptions fields, max_tokens aside
    max_tokens: int | None = None  # None: as many as the context and the server's limit allow
    max_tokens_param: str = "max_tokens"  # the field an over-limit budget is blamed on
    prompt_param: str = "messages"
    stream: bool = False
    include_usage: bool = False
    thinking: Thinking | None = None  # on / off / a budget; None: the template's default


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
    thinking: ThinkingConfig | None = None  # a thinking model's block: its text is the reasoning

    def reasoning_splitter(self) -> ReasoningSplitter | None:
        """What tells the reasoning from the content (None: the model does not think)."""
        return None if self.thinking is None else self.thinking.splitter()

    def splitter(self) -> CallSplitter | None:
        """What reads the answer's tool calls out of its text (None: the request can make none)."""
        return CallSplitter(self.tools) if self.tools is not None and self.tools.active else None


@dataclass(frozen=True)
class Outcome:
    """A finished answer: its text (tool calls taken out), its calls, and the run's result."""

    text: str
    calls: list[ToolCall]
    result: Result
    extra: dict[str, Any]  # edge's statistics (the `edge` field)
    reasoning: str = ""  # a thinking model's thoughts, apart from the text

    @property
    def stop_reason(self) -> str:
        return str(self.extra["stop_reason"])

    @property
    def prompt_tokens(self) -> int:
        return self.result.stats.n_prompt_tokens

    @property
    def completion_tokens(self) -> int:
        return self.result.stats.n_tokens


def _render(
    sched: Scheduler, messages: list[dict[str, Any]], plan: ToolPlan | None, think: ThinkingPlan | None
) -> tuple[list[int], int, ThinkingConfig | None]:
    """A conversation's prompt ids, its system prompt span and where its thinking starts, rendered once, here,
    for every replica. NOTE: one template renders at a time (its sandbox keeps one deadline per template)."""
    model = sched.replicas[0]
    with sched.render_lock:
        span = model.system_span(messages if plan is None else plan.messages(messages))
        text = model.render_chat(messages, plan, think)
        thinking = None if think is None else model.thinking_config(messages, text, plan, think)
        return model.encode_prompt(text), span, thinking


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
    sched: Scheduler,
    opts: dict[str, Any],
    plan: ToolPlan | None = None,
    thinking: ThinkingConfig | None = None,
) -> tuple[GenerationConfig, tuple[str, ...]]:
    """The request's GenerationConfig and the notes of reading its schemas; invalid options and a grammar the
    engine cannot enforce are a 400 before the job is queued (compiling a grammar takes milliseconds once the
    model's vocabulary is indexed)."""
    config = GenerateOptions(**opts).config()
    notes = (() if config.grammar is None else config.grammar.notes) + (() if plan is None else plan.notes)
    if plan is not None:
        config = plan.constrain(config)
    if thinking is not None:  # the grammar, if any, applies after the thinking (edge/reasoning.py)
        config = dataclasses.replace(config, thinking=thinking)
    if config.grammar is not None:
        model = sched.replicas[0]
        check_grammar(config.grammar, model.tokenizer, model.decoder.vocab_size)
    for note in notes:
        log.info("request note: %s", note)
    return config, notes


def extra_stats(result: Result, job: Job, notes: tuple[str, ...] = ()) -> dict[str, Any]:
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


# -- the core --------------------------------------------------------------------------------------
class Core:
    """Prepares, submits and follows generation jobs for every protocol."""

    def __init__(self, config: ServerConfig, registry: Registry, drain: Drain) -> None:
        self.config = config
        self.limits = config.limits
        self.registry = registry
        self.drain = drain

    def check_open(self) -> None:
        if self.drain.stopping:
            raise ServerStopping()

    async def scheduler(self, name: str) -> Scheduler:
        return await run_in_threadpool(self.registry.get, name)

    def budget(self, asked: int | None, param: str, n_prompt: int, n_ctx: int) -> int:
        if asked is not None and asked > self.limits.max_tokens:
            raise UnsupportedValue(param, f"{param} is at most {self.limits.max_tokens} on this server")
        room = max(1, n_ctx - n_prompt)
        return asked if asked is not None else min(self.limits.max_tokens, room)

    def check_prompt(self, n_prompt: int, n_ctx: int, param: str) -> None:
        limit = self.limits.max_prompt_tokens or n_ctx
        if n_prompt > min(limit, n_ctx):
            raise ContextOverflowError(
                f"the prompt has {n_prompt} tokens; this model takes at most {min(limit, n_ctx)} ({param})"
            )

    async def prepare(self, req: CoreRequest) -> Prepared:
        """The request validated against its model: prompt rendered and bounded, grammar checked."""
        if req.messages is not None and len(req.messages) > self.limits.max_messages:
            raise UnsupportedValue(
                req.prompt_param, f"at most {self.limits.max_messages} messages per request"
            )
        sched = await self.scheduler(req.model)
        first = sched.replicas[0]
        plan: ToolPlan | None = None
        keep: int | None = None
        thinking: ThinkingConfig | None = None
        if req.messages is not None:
            plan = first.tool_plan(req.tools, req.tool_choice, req.parallel_tool_calls)
            think = first.thinking_plan(req.thinking)
            ids, keep, thinking = await run_in_threadpool(_render, sched, req.messages, plan, think)
        else:
            if req.tools:
                raise UnsupportedValue("tools", "tools need a chat request (messages), not a raw prompt")
            if req.thinking is not None and req.thinking.asks:
                first.thinking_plan(req.thinking)  # a model that does not think says so first
                raise ThinkingError(
                    "thinking needs a chat request (messages): a raw prompt is sent as it is",
                    hint="send messages, or write the think tags into the prompt yourself",
                    param=req.thinking.param,
                )
            ids = await run_in_threadpool(first.encode_prompt, req.prompt or "")
        n_ctx = first.decoder.n_ctx
        self.check_prompt(len(ids), n_ctx, req.prompt_param)
        budget = self.budget(req.max_tokens, req.max_tokens_param, len(ids), n_ctx)
        opts = {**req.options, "max_tokens": budget}
        config, notes = await run_in_threadpool(_config, sched, opts, plan, thinking)
        run = _runner(ids, config, keep)
        return Prepared(req.model, sched, ids, run, req.stream, req.include_usage, plan, notes, thinking)

    def submit(self, prep: Prepared) -> Job:
        self.check_open()  # on the loop, as the drain's cut: a job submitted before it is cut by it
        job = Job(prep.prompt_ids, prep.run, asyncio.get_running_loop())
        prep.sched.submit(job)
        return job

    async def start(self, req: CoreRequest) -> tuple[Prepared, Job]:
        """The request prepared and queued on its model."""
        for attempt in (0, 1):
            self.check_open()
            prep = await self.prepare(req)
            try:
                return prep, self.submit(prep)
            except ServerStopping:
                if self.drain.stopping or attempt:
                    raise
                # NOTE: its model was unloaded (keep-alive) between preparing and queueing: load it again
        raise AssertionError("unreachable")

    async def answer(self, prep: Prepared, job: Job, request: Request) -> Outcome:
        """The whole answer, its tool calls split out; ClientGone if the client left first."""
        text, result = await wait_or_gone(job, prep.sched, request)
        reasoning, text = split_reasoning(text, prep.thinking)
        content, calls = (text, []) if prep.tools is None else prep.tools.split(text)
        return Outcome(content, calls, result, extra_stats(result, job, prep.notes), reasoning)

    async def answer_or_response(
        self, prep: Prepared, job: Job, request: Request, error: Callable[[BaseException], Response]
    ) -> Outcome | Response:
        """The whole answer, or what to send instead: 499 when the client left, else the protocol's `error`."""
        try:
            return await self.answer(prep, job, request)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it
        except Exception as exc:
            return error(exc)

    async def pieces(
        self, prep: Prepared, job: Job
    ) -> AsyncIterator[str | ReasoningText | ToolCall | Outcome | Failed]:
        """The answer as it comes: reasoning, text, whole tool calls, then its Outcome (text: all of it) or a
        Failed. A consumer that stops early (the client went away) withdraws the job."""
        splitter = prep.splitter()
        thoughts = prep.reasoning_splitter()
        done = False
        texts: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        try:
            while True:
                item = await job.items.get()
                if isinstance(item, Failed):
                    done = True
                    yield item
                    return
                parts = _reasoned(thoughts, item if isinstance(item, str) else None)
                for part in parts:
                    if isinstance(part, ReasoningText):
                        reasoning.append(part.text)
                        yield part
                        continue
                    news: list[str | ToolCall] = [part] if splitter is None else splitter.feed(part)
                    for new in news:
                        (calls if isinstance(new, ToolCall) else texts).append(new)  # type: ignore[arg-type]
                        if new != "":
                            yield new
                if isinstance(item, Done):
                    for new in [] if splitter is None else splitter.finish():
                        (calls if isinstance(new, ToolCall) else texts).append(new)  # type: ignore[arg-type]
                        if new != "":
                            yield new
                    done = True
                    extra = extra_stats(item.result, job, prep.notes)
                    yield Outcome("".join(texts), calls, item.result, extra, "".join(reasoning))
                    return
        finally:
            if not done:  # the client went away (or the server is stopping): stop generating
                prep.sched.withdraw(job)


def _reasoned(thoughts: ReasoningSplitter | None, text: str | None) -> list[str | ReasoningText]:
    """A piece of the output (None: its end) as reasoning and content parts."""
    if thoughts is None:
        return [] if text is None else [text]
    parts = thoughts.finish() if text is None else thoughts.feed(text)
    return [ReasoningText(t) if r else t for r, t in parts]


async def collect(job: Job) -> tuple[str, Result]:
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


async def disconnected(request: Request) -> None:
    """Returns when the client has gone away (its connection closed)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def wait_or_gone(job: Job, sched: Scheduler, request: Request) -> tuple[str, Result]:
    """The job's text and result; a client that disconnects first cancels it (ClientGone)."""
    result = asyncio.ensure_future(collect(job))
    gone = asyncio.ensure_future(disconnected(request))
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
