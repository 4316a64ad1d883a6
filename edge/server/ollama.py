"""Ollama's native API (`/api/...`) on the server's port, as a translation in and out of the request core.

`/api/chat` and `/api/generate` stream NDJSON by default (`"stream": false` for one object), take `format`
("json" or a JSON Schema: the answer is guaranteed to match), `tools`, `options` (num_predict, temperature,
top_p, top_k, min_p, repeat_penalty, seed, stop, num_ctx) and `keep_alive`. Errors are Ollama's
`{"error": "..."}`. What edge cannot do (images, creating, copying or pushing models, `think` on a model that does
not think) is a clear 400. Pulling and deleting catalog models: edge/server/ollama_lifecycle.py.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

import edge
from edge.reasoning import ReasoningText, Thinking
from edge.server import ollama_models as om
from edge.server.config import parse_duration
from edge.server.core import Core, CoreRequest, Outcome, Prepared, classify
from edge.server.scheduler import Failed, Job
from edge.server.unsupported import UnsupportedValue
from edge.tools import ToolCall

__all__ = ["OLLAMA_VERSION", "routes"]

# The Ollama API level this layer follows: apps gate features on /api/version (tools, structured outputs).
OLLAMA_VERSION = "0.12.0"

# options that set up Ollama's runner (threads, GPU layers, batch): edge sets these when `edge serve` starts
LOAD_OPTIONS = frozenset(
    {
        "num_keep",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "use_mmap",
        "use_mlock",
        "num_thread",
        "numa",
        "low_vram",
    }
)
SAMPLING = {"temperature", "top_p", "top_k", "min_p", "repeat_penalty", "seed"}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class OllamaCall(_Request):
    function: dict[str, Any]


class OllamaMessage(_Request):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[OllamaCall] | None = None
    tool_name: str | None = None  # the tool a tool message answers
    thinking: str | None = None


class _Generation(_Request):
    model: str
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    stream: bool = True
    keep_alive: str | float | None = None
    think: bool | str | None = None

    def check(self) -> None:
        if isinstance(self.think, str) and self.think not in ("low", "medium", "high"):
            raise UnsupportedValue(
                "think", f'think is true, false, "low", "medium" or "high", not {self.think!r}'
            )
        self.keep()  # an invalid duration is a 400

    def thinking(self) -> Thinking | None:
        """`think` (a level, as gpt-oss takes, is on); None: the template's default."""
        return None if self.think is None else Thinking(on=self.think is not False, param="think")

    def keep(self) -> tuple[bool, float | None]:
        """Whether keep_alive was given, and its seconds (None: for ever)."""
        if self.keep_alive is None:
            return False, None
        try:
            return True, parse_duration(self.keep_alive)
        except ValueError as exc:
            raise UnsupportedValue("keep_alive", str(exc)) from None

    def core_options(self) -> tuple[dict[str, Any], int | None]:
        """GenerateOptions fields and the token budget (num_predict; -1 or -2: as much as fits)."""
        given = dict(self.options or {})
        opts: dict[str, Any] = {"temperature": 0.8}  # Ollama's defaults
        for key, value in given.items():
            if key in SAMPLING:
                opts[key] = value
            elif key == "stop":
                opts["stop"] = (value,) if isinstance(value, str) else tuple(value)
            elif key not in LOAD_OPTIONS | {"num_predict", "num_ctx"}:
                raise UnsupportedValue(f"options.{key}", f"option {key!r} is not supported by edge")
        budget = given.get("num_predict")
        if budget is not None and (not isinstance(budget, int) or budget < -2 or budget == 0):
            raise UnsupportedValue("options.num_predict", "num_predict is a positive count, -1 or -2")
        fmt = _format(self.format)
        if fmt is not None:
            opts["response_format"] = fmt
        return opts, None if budget is None or budget < 0 else budget


class ChatRequest(_Generation):
    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    def chat_messages(self) -> list[dict[str, Any]]:
        out = []
        for i, m in enumerate(self.messages):
            if m.images:
                raise UnsupportedValue(
                    f"messages[{i}].images", "images are not supported: edge serves text models"
                )
            msg: dict[str, Any] = {"role": m.role, "content": m.content}
            if m.tool_calls:
                msg["tool_calls"] = [
                    _history_call(c.function, f"ollama-{i}-{j}") for j, c in enumerate(m.tool_calls)
                ]
            if m.role == "tool" and m.tool_name:
                msg["name"] = m.tool_name
            if m.role == "assistant" and m.thinking is not None:
                msg["reasoning_content"] = m.thinking  # what the Qwen3 template reads back
            out.append(msg)
        return out


class GenerateRequest(_Generation):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    images: list[str] | None = None

    def check(self) -> None:
        super().check()
        for name, why in (
            ("images", "images are not supported: edge serves text models"),
            ("suffix", "suffix (fill-in-the-middle) is not supported"),
            ("template", "a per-request template is not supported: the model's own chat template is used"),
            (
                "context",
                "context (the deprecated token list) is not supported: send the conversation to /api/chat",
            ),
        ):
            if getattr(self, name):
                raise UnsupportedValue(name, why)


def _history_call(fn: dict[str, Any], default_id: str) -> dict[str, Any]:
    args = fn.get("arguments", {})
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return {"id": default_id, "type": "function", "function": {"name": fn.get("name"), "arguments": text}}


def _format(value: str | dict[str, Any] | None) -> dict[str, Any] | None:
    """Ollama's `format` as OpenAI's response_format (what the grammar engine reads)."""
    if value in (None, ""):
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}
    raise UnsupportedValue("format", f'format is "json" or a JSON Schema object, not {value!r}')


# -- responses -------------------------------------------------------------------------------------
def error(exc: BaseException) -> JSONResponse:
    e = classify(exc)
    return JSONResponse({"error": e.message}, e.status, headers=e.headers)


def _now() -> str:
    return _iso(time.time())


def _iso(when: float) -> str:
    return dt.datetime.fromtimestamp(when, dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _expires(when: float | None) -> str:
    """When a model unloads; one kept loaded (keep_alive -1) far in the future, as Ollama says it."""
    return "2318-01-01T00:00:00Z" if when is None else _iso(when)


def _call(call: ToolCall) -> dict[str, Any]:
    return {"function": {"name": call.name, "arguments": json.loads(call.arguments)}}


def _final(model: str, out: Outcome, started_ns: int) -> dict[str, Any]:
    """The closing fields of an answer: why it ended and Ollama's counts and durations (nanoseconds)."""
    s = out.result.stats
    reason = "length" if out.stop_reason in ("length", "context", "shutdown") else "stop"
    return {
        "model": model,
        "created_at": _now(),
        "done": True,
        "done_reason": reason,
        "total_duration": time.monotonic_ns() - started_ns,
        "load_duration": 0,
        "prompt_eval_count": out.prompt_tokens,
        "prompt_eval_duration": int(s.prefill_s * 1e9),
        "eval_count": out.completion_tokens,
        "eval_duration": int(s.decode_s * 1e9),
        "edge": out.extra,
    }


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


class OllamaAPI:
    def __init__(self, core: Core) -> None:
        self.core = core
        self.registry = core.registry

    # -- models ----------------------------------------------------------------------------------
    async def root(self, request: Request) -> Response:
        return PlainTextResponse("edge is running (Ollama's API under /api, OpenAI's under /v1)")

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": OLLAMA_VERSION, "edge": edge.__version__})

    async def tags(self, request: Request) -> Response:
        models = [om.summary(n, self.registry) for n in self.registry.names()]
        return JSONResponse({"models": models})

    async def ps(self, request: Request) -> Response:
        out = []
        for name, sched in self.registry.loaded().items():
            entry = om.summary(name, self.registry)
            entry.update(expires_at=_expires(self.registry.expires(name)), size_vram=0)
            entry["context_length"] = sched.replicas[0].decoder.n_ctx
            out.append(entry)
        return JSONResponse({"models": out})

    async def show(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
            name = om.resolve(str(body.get("model") or body.get("name") or ""), self.registry)
            sched = await self.core.scheduler(name)
        except Exception as exc:
            return error(exc)
        model = sched.replicas[0]
        info = om.model_info(model)
        arch = str(info["general.architecture"])
        caps = ["completion", "tools"] if model.has_chat_template else ["completion"]
        if model.template is not None and model.template.thinking is not None:
            caps.append("thinking")
        template = model.template.source if model.template is not None else ""
        return JSONResponse(
            {
                "modelfile": f"# served by edge {edge.__version__}\nFROM {model.path}\n",
                "parameters": f"num_ctx {model.decoder.n_ctx}",
                "template": template,
                "details": om.details(model, arch),
                "model_info": info,
                "capabilities": caps,
                "modified_at": om.summary(name, self.registry)["modified_at"],
            }
        )

    async def refuse(self, request: Request) -> Response:
        what = request.url.path.rsplit("/", 1)[-1]
        return JSONResponse(
            {"error": f"/api/{what} is not supported: edge serves catalog models and the files it was "
                      "started with (POST /api/pull or `edge pull NAME` adds a catalog model)"},
            400,
        )  # fmt: skip

    # -- generation ------------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        async def parse(body: bytes) -> tuple[CoreRequest, _Generation]:
            req = ChatRequest.model_validate_json(body)
            req.check()
            opts, budget = req.core_options()
            name = om.resolve(req.model, self.registry)
            core = CoreRequest(
                name, messages=req.chat_messages(), tools=req.tools or None, options=opts, max_tokens=budget,
                max_tokens_param="options.num_predict", stream=req.stream, thinking=req.thinking(),
            )  # fmt: skip
            return core, req

        return await self._generate(request, parse, chat=True)

    async def generate(self, request: Request) -> Response:
        async def parse(body: bytes) -> tuple[CoreRequest, _Generation]:
            req = GenerateRequest.model_validate_json(body)
            req.check()
            opts, budget = req.core_options()
            name = om.resolve(req.model, self.registry)
            common: dict[str, Any] = {"options": opts, "max_tokens": budget, "stream": req.stream}
            common["thinking"] = req.thinking()
            common["max_tokens_param"] = "options.num_predict"
            raw = CoreRequest(name, prompt=req.prompt, prompt_param="prompt", **common)
            if req.raw or not req.prompt:
                return raw, req
            sched = await self.core.scheduler(name)
            if not sched.replicas[0].has_chat_template:  # a base model: the prompt as it is
                return raw, req
            turns = ([{"role": "system", "content": req.system}] if req.system else []) + [
                {"role": "user", "content": req.prompt}
            ]
            return CoreRequest(name, messages=turns, prompt_param="prompt", **common), req

        return await self._generate(request, parse, chat=False)

    async def _generate(
        self,
        request: Request,
        parse: Callable[[bytes], Awaitable[tuple[CoreRequest, _Generation]]],
        *,
        chat: bool,
    ) -> Response:
        started = time.monotonic_ns()
        try:
            self.core.check_open()
            core, req = await parse(await request.body())
            given, keep = req.keep()
            if not (core.messages or core.prompt):  # Ollama's way to load (or, keep_alive 0, unload) a model
                return await self._load(core.model, chat, given, keep)
            prep, job = await self.core.start(core)
            if given:  # the request's own keep-alive, from its model's next idle moment
                self.registry.keep_alive(core.model, keep)
        except Exception as exc:
            return error(exc)
        model = om.ollama_name(core.model)
        if prep.stream:
            return StreamingResponse(
                self._lines(prep, job, model, chat, started), media_type="application/x-ndjson"
            )
        out = await self.core.answer_or_response(prep, job, request, error)
        if isinstance(out, Response):
            return out
        body = _final(model, out, started)
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": out.text}
            if prep.thinking is not None and out.reasoning:  # as Ollama: no empty field
                message["thinking"] = out.reasoning
            if out.calls:
                message["tool_calls"] = [_call(c) for c in out.calls]
            body["message"] = message
        else:
            body["response"] = out.text
            if prep.thinking is not None and out.reasoning:
                body["thinking"] = out.reasoning
        return JSONResponse({**body, "created_at": _now()})

    async def _load(self, name: str, chat: bool, given: bool, keep: float | None) -> Response:
        if given and keep == 0:
            unloaded = await run_in_threadpool(self.registry.unload, name)
            return JSONResponse(_loaded(name, chat, "unload" if unloaded else "load"))
        await self.core.scheduler(name)
        if given:
            self.registry.keep_alive(name, keep)
        return JSONResponse(_loaded(name, chat, "load"))

    async def _lines(
        self, prep: Prepared, job: Job, model: str, chat: bool, started: int
    ) -> AsyncIterator[bytes]:
        async for item in self.core.pieces(prep, job):
            if isinstance(item, Failed):
                yield _line({"error": classify(item.error).message})
                return
            if isinstance(item, Outcome):
                last = _final(model, item, started)
                yield _line(
                    {**last, "message": {"role": "assistant", "content": ""}}
                    if chat
                    else {**last, "response": ""}
                )
                return
            head = {"model": model, "created_at": _now(), "done": False}
            if isinstance(item, ReasoningText):  # Ollama streams thinking apart from the content
                yield _line(
                    {**head, "message": {"role": "assistant", "content": "", "thinking": item.text}}
                    if chat
                    else {**head, "response": "", "thinking": item.text}
                )
            elif isinstance(item, ToolCall):
                yield _line(
                    {**head, "message": {"role": "assistant", "content": "", "tool_calls": [_call(item)]}}
                )
            elif chat:
                yield _line({**head, "message": {"role": "assistant", "content": item}})
            else:
                yield _line({**head, "response": item})


def _loaded(name: str, chat: bool, reason: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": om.ollama_name(name),
        "created_at": _now(),
        "done": True,
        "done_reason": reason,
    }
    if chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return body


def routes(core: Core) -> list[Route]:
    api = OllamaAPI(core)
    return [
        Route("/", api.root, methods=["GET", "HEAD"]),
        Route("/api/version", api.version, methods=["GET"]),
        Route("/api/tags", api.tags, methods=["GET"]),
        Route("/api/ps", api.ps, methods=["GET"]),
        Route("/api/show", api.show, methods=["POST"]),
        Route("/api/chat", api.chat, methods=["POST"]),
        Route("/api/generate", api.generate, methods=["POST"]),
        # /api/embed and /api/embeddings: edge/server/ollama_embed.py, beside /v1/embeddings' models;
        # /api/pull and /api/delete: edge/server/ollama_lifecycle.py (they need the embedding models too)
        *(Route(f"/api/{what}", api.refuse, methods=["POST"]) for what in ("create", "copy", "push")),
    ]
