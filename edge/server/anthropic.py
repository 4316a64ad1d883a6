"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`) over the request core.

Text, tool_use and tool_result blocks become the chat template's messages (tool calls and tool results as
OpenAI shapes them, which the core and the templates read); tools' `input_schema` and tool_choice auto / any /
tool / none become the core's tools, so a forced call is guaranteed by the grammar mask as on every protocol.
Streams are Anthropic's named SSE events; errors its `{"type": "error", "error": {...}}`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge.reasoning import ReasoningText, Thinking
from edge.server.core import Core, CoreRequest, Outcome, Prepared, classify
from edge.server.scheduler import Failed, Job
from edge.server.unsupported import UnsupportedValue
from edge.tools import ToolCall

__all__ = ["routes"]

# classify's kinds and statuses as Anthropic's error types
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Block(_Request):
    type: str
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None  # tool_result
    content: str | list[Block] | None = None
    is_error: bool | None = None
    thinking: str | None = None  # an assistant's earlier thinking block
    signature: str | None = None


class Message(_Request):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolIn(_Request):
    name: str
    description: str | None = None
    input_schema: dict[str, Any]
    type: str | None = None  # "custom" or unset; Anthropic's server tools are refused


class ToolChoiceIn(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class CountRequest(_Request):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[Block] | None = None
    tools: list[ToolIn] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: dict[str, Any] | None = None

    def core(self, **more: Any) -> CoreRequest:
        choice = self.tool_choice or ToolChoiceIn(type="auto")
        return CoreRequest(
            self.model,
            messages=self._messages(),
            tools=self._tools(),
            tool_choice=_choice(choice) if self.tools else None,
            parallel_tool_calls=not choice.disable_parallel_tool_use,
            thinking=self._thinking(),
            **more,
        )

    def _thinking(self) -> Thinking:
        """Anthropic's `thinking`: enabled with a budget_tokens, or disabled; unset is off (a Messages client
        that did not ask gets no thinking blocks), so a thinking template is rendered with its block closed."""
        spec = self.thinking
        if spec is None or spec.get("type") == "disabled":
            return Thinking(on=False, param="thinking")
        budget = spec.get("budget_tokens")
        if spec.get("type") != "enabled" or set(spec) - {"type", "budget_tokens"}:
            raise UnsupportedValue(
                "thinking", 'thinking is {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}'
            )
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise UnsupportedValue("thinking.budget_tokens", "thinking.budget_tokens is a count of tokens")
        return Thinking(on=True, budget=budget, param="thinking")

    def _tools(self) -> list[dict[str, Any]] | None:
        out = []
        for i, t in enumerate(self.tools or []):
            if t.type not in (None, "custom"):
                raise UnsupportedValue(f"tools[{i}].type", f"server tool {t.type!r} is not supported")
            fn = {"name": t.name, "description": t.description or "", "parameters": t.input_schema}
            out.append({"type": "function", "function": fn})
        return out or None

    def _messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.system is not None:
            out.append({"role": "system", "content": _text(self.system, "system")})
        names: dict[str, str] = {}  # tool_use id -> tool name, for the results that answer them
        for i, m in enumerate(self.messages):
            where = f"messages[{i}]"
            if isinstance(m.content, str):
                out.append({"role": m.role, "content": m.content})
            elif m.role == "assistant":
                out.append(_assistant(m.content, where, names))
            else:
                out.extend(_user(m.content, where, names))
        return out


class MessagesRequest(CountRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)

    def to_core(self) -> CoreRequest:
        opts: dict[str, Any] = {"temperature": 1.0 if self.temperature is None else self.temperature}
        for name in ("top_p", "top_k"):
            if getattr(self, name) is not None:
                opts[name] = getattr(self, name)
        if self.stop_sequences:
            opts["stop"] = tuple(self.stop_sequences)
        return self.core(options=opts, max_tokens=self.max_tokens, stream=self.stream)


def _choice(c: ToolChoiceIn) -> Any:
    if c.type == "tool":
        if not c.name:
            raise UnsupportedValue("tool_choice.name", 'tool_choice {"type": "tool"} needs the tool\'s name')
        return {"type": "function", "function": {"name": c.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[c.type]


def _text(content: str | list[Block], where: str) -> str:
    if isinstance(content, str):
        return content
    pieces = []
    for j, b in enumerate(content):
        if b.type != "text" or b.text is None:
            raise UnsupportedValue(f"{where}[{j}]", f"only text blocks are supported here, not {b.type!r}")
        pieces.append(b.text)
    return "".join(pieces)


def _assistant(blocks: list[Block], where: str, names: dict[str, str]) -> dict[str, Any]:
    texts, calls, thoughts = [], [], []
    for j, b in enumerate(blocks):
        if b.type == "text":
            texts.append(b.text or "")
        elif b.type == "thinking":
            thoughts.append(b.thinking or "")
        elif b.type == "redacted_thinking":
            continue  # another model's encrypted thoughts: nothing a local template can read
        elif b.type == "tool_use" and b.id and b.name:
            names[b.id] = b.name
            args = json.dumps(b.input or {}, ensure_ascii=False)
            calls.append({"id": b.id, "type": "function", "function": {"name": b.name, "arguments": args}})
        else:
            raise UnsupportedValue(f"{where}.content[{j}]", f"block {b.type!r} is not supported here")
    msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if thoughts:
        msg["reasoning_content"] = "".join(thoughts)  # what the Qwen3 template reads back
    return msg


def _user(blocks: list[Block], where: str, names: dict[str, str]) -> list[dict[str, Any]]:
    """A user turn's tool results (each a tool message, as the templates take them) and its text."""
    out: list[dict[str, Any]] = []
    texts = []
    for j, b in enumerate(blocks):
        if b.type == "text":
            texts.append(b.text or "")
        elif b.type == "tool_result" and b.tool_use_id:
            content = _text(b.content or "", f"{where}.content[{j}].content")
            if b.is_error:
                content = f"error: {content}"
            msg = {"role": "tool", "content": content, "tool_call_id": b.tool_use_id}
            if b.tool_use_id in names:
                msg["name"] = names[b.tool_use_id]
            out.append(msg)
        else:
            raise UnsupportedValue(
                f"{where}.content[{j}]", f"block {b.type!r} is not supported (text, tool_use, tool_result)"
            )
    if texts:
        out.append({"role": "user", "content": "".join(texts)})
    return out


# -- responses -------------------------------------------------------------------------------------
def error_body(exc: BaseException) -> tuple[dict[str, Any], int, dict[str, str]]:
    e = classify(exc)
    kind = _TYPES.get(e.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}, e.status, e.headers


def error(exc: BaseException) -> JSONResponse:
    body, status, headers = error_body(exc)
    return JSONResponse(body, status, headers=headers)


def _stop(out: Outcome, stops: list[str] | None) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence (the one asked for, when only one was: which of several
    matched is not recorded)."""
    if out.stop_reason in ("length", "context", "shutdown"):  # cut: a further call may have been cut off
        return "max_tokens", None
    if out.calls:
        return "tool_use", None
    if out.stop_reason == "stop":
        return "stop_sequence", stops[0] if stops and len(stops) == 1 else None
    return "end_turn", None


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": _tool_id(call), "name": call.name, "input": json.loads(call.arguments)}


def _tool_id(call: ToolCall) -> str:
    return "toolu_" + call.id.removeprefix("call_").replace("-", "")


def _thinking_block(text: str) -> dict[str, Any]:
    # NOTE: a local model's thoughts carry no signature (Anthropic's proves they came from its servers)
    return {"type": "thinking", "thinking": text, "signature": ""}


def _usage(out: Outcome) -> dict[str, int]:
    return {"input_tokens": out.prompt_tokens, "output_tokens": out.completion_tokens,
            "cache_read_input_tokens": out.result.stats.n_cached_tokens}  # fmt: skip


def _message(rid: str, model: str, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": rid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": None, "stop_sequence": None}  # fmt: skip


def _event(kind: str, **fields: Any) -> dict[str, str]:
    data = json.dumps({"type": kind, **fields}, ensure_ascii=False, separators=(",", ":"))
    return {"event": kind, "data": data}


class MessagesAPI:
    def __init__(self, core: Core) -> None:
        self.core = core

    async def count_tokens(self, request: Request) -> Response:
        try:
            req = CountRequest.model_validate_json(await request.body())
            prep = await self.core.prepare(req.core())
        except Exception as exc:
            return error(exc)
        return JSONResponse({"input_tokens": len(prep.prompt_ids)})

    async def messages(self, request: Request) -> Response:
        try:
            self.core.check_open()
            req = MessagesRequest.model_validate_json(await request.body())
            prep, job = await self.core.start(req.to_core())
        except Exception as exc:
            return error(exc)
        rid = "msg_" + uuid.uuid4().hex[:24]
        if prep.stream:
            return EventSourceResponse(self._events(prep, job, rid, req), ping=15)
        out = await self.core.answer_or_response(prep, job, request, error)
        if isinstance(out, Response):
            return out
        content: list[dict[str, Any]] = (
            [_thinking_block(out.reasoning)] if prep.thinking and out.reasoning else []
        )
        content += [{"type": "text", "text": out.text}] if out.text or not (out.calls or content) else []
        content += [_tool_use(c) for c in out.calls]
        reason, sequence = _stop(out, req.stop_sequences)
        body = {**_message(rid, req.model, content), "stop_reason": reason, "stop_sequence": sequence}
        return JSONResponse({**body, "usage": _usage(out), "edge": out.extra})

    async def _events(
        self, prep: Prepared, job: Job, rid: str, req: MessagesRequest
    ) -> AsyncIterator[dict[str, str]]:
        start = {
            **_message(rid, req.model, []),
            "usage": {"input_tokens": len(prep.prompt_ids), "output_tokens": 0},
        }
        yield _event("message_start", message=start)
        index, text_open, thinking_open = 0, False, False
        async for item in self.core.pieces(prep, job):
            if isinstance(item, Failed):
                body, _, _ = error_body(item.error)
                yield {"event": "error", "data": json.dumps(body)}
                return
            if isinstance(item, ReasoningText):
                if not thinking_open:
                    block = _thinking_block("")
                    yield _event("content_block_start", index=index, content_block=block)
                    thinking_open = True
                delta = {"type": "thinking_delta", "thinking": item.text}
                yield _event("content_block_delta", index=index, delta=delta)
                continue
            if thinking_open:  # the thoughts end where anything else begins
                yield _event("content_block_stop", index=index)
                index, thinking_open = index + 1, False
            if isinstance(item, str) and not text_open:
                yield _event("content_block_start", index=index, content_block={"type": "text", "text": ""})
                text_open = True
            if isinstance(item, str):
                yield _event("content_block_delta", index=index, delta={"type": "text_delta", "text": item})
                continue
            if text_open:  # a tool call or the end closes the text block
                yield _event("content_block_stop", index=index)
                index, text_open = index + 1, False
            if isinstance(item, ToolCall):
                block = {**_tool_use(item), "input": {}}
                yield _event("content_block_start", index=index, content_block=block)
                delta = {"type": "input_json_delta", "partial_json": item.arguments}
                yield _event("content_block_delta", index=index, delta=delta)
                yield _event("content_block_stop", index=index)
                index += 1
                continue
            reason, sequence = _stop(item, req.stop_sequences)
            delta = {"stop_reason": reason, "stop_sequence": sequence}
            yield _event(
                "message_delta", delta=delta, usage={"output_tokens": item.completion_tokens}, edge=item.extra
            )
            yield _event("message_stop")
            return


def routes(core: Core) -> list[Route]:
    api = MessagesAPI(core)
    return [
        Route("/v1/messages", api.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", api.count_tokens, methods=["POST"]),
    ]
