"""OpenAI's Responses API (`POST /v1/responses`) over the request core, stateless.

Input as text or items (messages, function_call, function_call_output), instructions, function tools with
tool_choice, `text.format` (json_object / json_schema, guaranteed by the grammar mask), max_output_tokens and
sampling. Nothing is stored: `previous_response_id` is a 400 that says so (send the whole conversation as
input items). Streams are the Responses events (response.created ... response.completed).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edge.reasoning import ReasoningText, Thinking
from edge.server import protocol as p
from edge.server.core import Core, CoreRequest, Outcome, Prepared, classify
from edge.server.scheduler import Failed, Job
from edge.server.unsupported import UnsupportedValue
from edge.tools import ToolCall

__all__ = ["routes"]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ResponsesRequest(_Request):
    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    previous_response_id: str | None = None
    conversation: Any = None
    reasoning: dict[str, Any] | None = None
    background: bool | None = None

    def check(self) -> None:
        if self.previous_response_id is not None or self.conversation is not None:
            name = "previous_response_id" if self.previous_response_id is not None else "conversation"
            raise UnsupportedValue(
                name,
                f"{name} is not supported: this server stores no responses; "
                "send the whole conversation as input items",
            )  # fmt: skip
        if self.background:
            raise UnsupportedValue("background", "background responses are not supported")
        self.thinking()  # an invalid reasoning object is a 400 here

    def thinking(self) -> Thinking | None:
        """`reasoning.effort` ("none": off, any other: on); a summary edge cannot write is refused."""
        spec = self.reasoning or {}
        unknown = sorted(set(spec) - {"effort", "summary", "generate_summary"})
        if unknown:
            raise UnsupportedValue("reasoning", f"reasoning has unknown keys {unknown}")
        for key in ("summary", "generate_summary"):
            if spec.get(key) not in (None, "auto"):
                raise UnsupportedValue(
                    f"reasoning.{key}",
                    "reasoning summaries are not written: the thoughts come whole, as reasoning_text",
                )  # "auto" leaves it to the server, which writes none
        effort = spec.get("effort")
        if effort is None:
            return None
        if effort not in ("none", "minimal", "low", "medium", "high"):
            raise UnsupportedValue("reasoning.effort", f"reasoning.effort {effort!r} is not known")
        # "minimal" is off, as on chat completions (edge/server/protocol.py): a model that does not think takes it
        return Thinking(on=effort not in ("none", "minimal"), param="reasoning")

    def to_core(self) -> CoreRequest:
        opts: dict[str, Any] = {"temperature": 1.0 if self.temperature is None else self.temperature}
        if self.top_p is not None:
            opts["top_p"] = self.top_p
        fmt = _format(self.text)
        if fmt is not None:
            opts["response_format"] = fmt
        return CoreRequest(
            self.model,
            messages=self.messages(),
            tools=_tools(self.tools),
            tool_choice=_choice(self.tool_choice),
            parallel_tool_calls=self.parallel_tool_calls,
            options=opts,
            max_tokens=self.max_output_tokens,
            max_tokens_param="max_output_tokens",
            prompt_param="input",
            stream=self.stream,
            thinking=self.thinking(),
        )

    def messages(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        if isinstance(self.input, str):
            return [*out, {"role": "user", "content": self.input}]
        for i, item in enumerate(self.input):
            _item(item, f"input[{i}]", out)
        return out


def _item(item: dict[str, Any], where: str, out: list[dict[str, Any]]) -> None:
    kind = item.get("type", "message")
    last = out[-1] if out else None
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise UnsupportedValue(f"{where}.role", f"role {role!r} is not supported")
        if role == "assistant" and _thought_only(last):  # the turn its reasoning item opened
            assert last is not None
            last["content"] = _content(item, where)
            return
        out.append({"role": "system" if role == "developer" else role, "content": _content(item, where)})
    elif kind == "function_call":
        fn = {"name": item.get("name"), "arguments": item.get("arguments") or "{}"}
        call = {"id": item.get("call_id"), "type": "function", "function": fn}
        if (
            last is not None and last["role"] == "assistant" and not last["content"]
        ):  # one turn, several calls
            last.setdefault("tool_calls", []).append(call)
        else:
            out.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)
        out.append({"role": "tool", "content": text, "tool_call_id": item.get("call_id")})
    elif kind == "reasoning":  # earlier thoughts: they open the assistant turn that follows
        texts = [c.get("text") or "" for c in item.get("content") or [] if isinstance(c, dict)]
        out.append({"role": "assistant", "content": "", "reasoning_content": "".join(texts)})
    else:
        raise UnsupportedValue(f"{where}.type", f"input item {kind!r} is not supported")


def _thought_only(msg: dict[str, Any] | None) -> bool:
    return (
        msg is not None
        and msg["role"] == "assistant"
        and "reasoning_content" in msg
        and not (msg["content"] or msg.get("tool_calls"))
    )


def _content(item: dict[str, Any], where: str) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise UnsupportedValue(f"{where}.content", "content is text or a list of text parts")
    pieces = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise UnsupportedValue(f"{where}.content[{j}]", f"only text parts are supported, not {kind!r}")
        pieces.append(str(part.get("text", "")))
    return "".join(pieces)


def _tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses' flat function tools as the core's (OpenAI chat's) nested ones."""
    out = []
    for i, t in enumerate(tools or []):
        if t.get("type") != "function":
            raise UnsupportedValue(
                f"tools[{i}].type", f"only function tools are supported, not {t.get('type')!r}"
            )
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out or None


def _choice(choice: str | dict[str, Any] | None) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    return dict(fmt)  # json_object, or a shape the grammar layer names as unknown


# -- responses -------------------------------------------------------------------------------------
def error(exc: BaseException) -> JSONResponse:
    e = classify(exc)
    return JSONResponse(
        p.error_body(e.message, e.kind, param=e.param, code=e.code), e.status, headers=e.headers
    )


def _new(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _message_item(text: str, status: str = "completed", item_id: str | None = None) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "message", "id": item_id or _new("msg"), "status": status, "role": "assistant",
            "content": [] if status == "in_progress" else [part]}  # fmt: skip


def _reasoning_item(text: str, status: str = "completed", item_id: str | None = None) -> dict[str, Any]:
    """The thoughts as a Responses reasoning item (the whole text, as open-weight models give it; no summary)."""
    content = [] if status == "in_progress" else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": item_id or _new("rs"), "summary": [], "content": content,
            "status": status}  # fmt: skip


def _cut(item: Outcome | ToolCall) -> bool:
    """An answer cut short by its token budget (or the server's stop): Responses calls it incomplete."""
    return (
        isinstance(item, Outcome) and item.stop_reason in ("length", "context", "shutdown") and not item.calls
    )


def _call_item(call: ToolCall, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id or _new("fc"), "call_id": call.id, "name": call.name,
            "arguments": call.arguments if status == "completed" else "", "status": status}  # fmt: skip


class ResponsesAPI:
    def __init__(self, core: Core) -> None:
        self.core = core

    def _shell(self, rid: str, req: ResponsesRequest, status: str) -> dict[str, Any]:
        """The response object without its output (what response.created carries)."""
        return {
            "id": rid, "object": "response", "created_at": int(time.time()), "status": status,
            "model": req.model, "output": [], "error": None, "incomplete_details": None,
            "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": bool(req.parallel_tool_calls), "previous_response_id": None,
            "temperature": req.temperature, "top_p": req.top_p, "tools": req.tools or [],
            "tool_choice": req.tool_choice or "auto", "text": req.text or {"format": {"type": "text"}},
            "store": False, "metadata": {}, "usage": None,
        }  # fmt: skip

    def _done(self, shell: dict[str, Any], out: Outcome, output: list[dict[str, Any]]) -> dict[str, Any]:
        cut = _cut(out)
        usage = {
            "input_tokens": out.prompt_tokens,
            "input_tokens_details": {"cached_tokens": out.result.stats.n_cached_tokens},
            "output_tokens": out.completion_tokens,
            # NOTE: the thoughts' tokens are not counted apart (a piece of text may hold both sides of a tag)
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": out.prompt_tokens + out.completion_tokens,
        }
        details = {"reason": "max_output_tokens"} if cut else None
        status = "incomplete" if cut else "completed"
        return {**shell, "status": status, "incomplete_details": details, "output": output, "usage": usage,
                "edge": out.extra}  # fmt: skip

    async def create(self, request: Request) -> Response:
        try:
            self.core.check_open()
            req = ResponsesRequest.model_validate_json(await request.body())
            req.check()
            prep, job = await self.core.start(req.to_core())
        except Exception as exc:
            return error(exc)
        rid = _new("resp")
        if prep.stream:
            return EventSourceResponse(
                _Events(self, prep, job, self._shell(rid, req, "in_progress")).run(), ping=15
            )
        out = await self.core.answer_or_response(prep, job, request, error)
        if isinstance(out, Response):
            return out
        status = "incomplete" if _cut(out) else "completed"
        output = [_reasoning_item(out.reasoning)] if prep.thinking is not None and out.reasoning else []
        output += [_message_item(out.text, status)] if out.text or not (out.calls or output) else []
        output += [_call_item(c) for c in out.calls]
        return JSONResponse(self._done(self._shell(rid, req, "completed"), out, output))


class _Events:
    """One response's stream: each output item opened, its deltas, closed; sequence numbers in order."""

    def __init__(self, api: ResponsesAPI, prep: Prepared, job: Job, shell: dict[str, Any]) -> None:
        self.api, self.prep, self.job, self.shell = api, prep, job, shell
        self.seq = 0
        self.output: list[dict[str, Any]] = []
        self.text_id: str | None = None
        self.text = ""
        self.thought_id: str | None = None
        self.thought = ""

    def event(self, kind: str, **fields: Any) -> dict[str, str]:
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return {"event": kind, "data": json.dumps(data, ensure_ascii=False, separators=(",", ":"))}

    def close_text(self, status: str = "completed") -> list[dict[str, str]]:
        if self.text_id is None:
            return []
        i, tid = len(self.output), self.text_id
        item = _message_item(self.text, status, tid)
        part = item["content"][0]
        self.output.append(item)
        self.text_id = None
        where = {"item_id": tid, "output_index": i, "content_index": 0}
        return [
            self.event("response.output_text.done", **where, text=self.text, logprobs=[]),
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=i, item=item),
        ]

    async def run(self) -> AsyncIterator[dict[str, str]]:
        yield self.event("response.created", response=self.shell)
        yield self.event("response.in_progress", response=self.shell)
        async for item in self.api.core.pieces(self.prep, self.job):
            if isinstance(item, Failed):
                e = classify(item.error)
                yield self.event("error", code=e.code or e.kind, message=e.message, param=e.param)
                return
            if isinstance(item, ReasoningText):
                for ev in self.thought_piece(item.text):
                    yield ev
                continue
            for ev in self.close_thought():
                yield ev
            if isinstance(item, str):
                for ev in self.text_piece(item):
                    yield ev
                continue
            for ev in self.close_text("incomplete" if _cut(item) else "completed"):
                yield ev
            if isinstance(item, ToolCall):
                for ev in self.call(item):
                    yield ev
                continue
            done = self.api._done(self.shell, item, self.output)
            kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
            yield self.event(kind, response=done)
            return

    def thought_piece(self, piece: str) -> list[dict[str, str]]:
        out = []
        i = len(self.output)
        if self.thought_id is None:
            self.thought_id, self.thought = _new("rs"), ""
            item = _reasoning_item("", "in_progress", self.thought_id)
            out.append(self.event("response.output_item.added", output_index=i, item=item))
        self.thought += piece
        out.append(self.event("response.reasoning_text.delta", item_id=self.thought_id, output_index=i,
                              content_index=0, delta=piece))  # fmt: skip
        return out

    def close_thought(self) -> list[dict[str, str]]:
        if self.thought_id is None:
            return []
        i, rid = len(self.output), self.thought_id
        item = _reasoning_item(self.thought, "completed", rid)
        self.output.append(item)
        self.thought_id = None
        return [
            self.event(
                "response.reasoning_text.done",
                item_id=rid,
                output_index=i,
                content_index=0,
                text=self.thought,
            ),
            self.event("response.output_item.done", output_index=i, item=item),
        ]

    def text_piece(self, piece: str) -> list[dict[str, str]]:
        out = []
        i = len(self.output)
        if self.text_id is None:
            self.text_id, self.text = _new("msg"), ""
            out.append(self.event("response.output_item.added", output_index=i,
                                  item=_message_item("", "in_progress", self.text_id)))  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(self.event("response.content_part.added", item_id=self.text_id, output_index=i,
                                  content_index=0, part=part))  # fmt: skip
        self.text += piece
        out.append(self.event("response.output_text.delta", item_id=self.text_id, output_index=i,
                              content_index=0, delta=piece, logprobs=[]))  # fmt: skip
        return out

    def call(self, call: ToolCall) -> list[dict[str, str]]:
        i, fid = len(self.output), _new("fc")
        item = _call_item(call, fid)
        self.output.append(item)
        return [
            self.event(
                "response.output_item.added", output_index=i, item=_call_item(call, fid, "in_progress")
            ),
            self.event(
                "response.function_call_arguments.delta", item_id=fid, output_index=i, delta=call.arguments
            ),
            self.event(
                "response.function_call_arguments.done",
                item_id=fid,
                output_index=i,
                name=call.name,
                arguments=call.arguments,
            ),
            self.event("response.output_item.done", output_index=i, item=item),
        ]


def routes(core: Core) -> list[Route]:
    api = ResponsesAPI(core)
    return [Route("/v1/responses", api.create, methods=["POST"])]
