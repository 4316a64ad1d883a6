"""OpenAI's request and response shapes (chat completions, completions, models, errors) as pydantic models.

Requests ignore fields they do not know; a known field with a value edge does not support is a 400 that names
the field (`UnsupportedValue`), never silently dropped. Responses carry edge's own statistics in one extra
field, `edge`, which OpenAI clients ignore.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from edge.reasoning import Thinking
from edge.server import logprobs as lp
from edge.server.unsupported import UnsupportedValue

__all__ = [
    "ChatCompletionRequest",
    "CompletionRequest",
    "ErrorBody",
    "UnsupportedValue",
    "Usage",
    "chat_chunk",
    "chat_response",
    "completion_chunk",
    "completion_response",
    "error_body",
    "finish_reason",
    "models_response",
    "new_id",
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Request):
    type: str
    text: str | None = None


class FunctionCall(_Request):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # the call a tool message answers
    reasoning_content: str | None = None  # an assistant's earlier thinking (the Qwen3 template reads it)

    def text(self, where: str) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        pieces = []
        for i, part in enumerate(self.content):
            if part.type != "text" or part.text is None:
                raise UnsupportedValue(
                    f"{where}.content[{i}]", f"only text content parts are supported, not {part.type!r}"
                )
            pieces.append(part.text)
        return "".join(pieces)


class StreamOptions(_Request):
    include_usage: bool = False


class _Sampling(_Request):
    """The fields chat completions and completions share."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | int | None = (
        None  # chat: a bool (+ top_logprobs); completions: N (edge/server/logprobs.py)
    )
    # llama.cpp's servers take these too
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    # constrained output (edge/grammar.py): json_object or json_schema, on chat and completions alike
    response_format: dict[str, Any] | None = None

    def check_common(self) -> None:
        if self.n not in (None, 1):
            raise UnsupportedValue("n", "only n=1 is supported")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise UnsupportedValue(name, f"{name} is not supported (use repeat_penalty)")
        if self.logit_bias:
            raise UnsupportedValue("logit_bias", "logit_bias is not supported")
        self.logprobs_top()  # out-of-range values are a 400 here
        if self.stop is not None:
            stops = [self.stop] if isinstance(self.stop, str) else self.stop
            if len(stops) > 16 or any(not s for s in stops):
                raise UnsupportedValue("stop", "stop takes at most 16 non-empty strings")
        if self.stream_options is not None and not self.stream:
            raise UnsupportedValue("stream_options", "stream_options is only allowed with stream=true")

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def sampling(self) -> dict[str, Any]:
        """`edge.GenerateOptions` fields the request sets (OpenAI's default temperature is 1)."""
        opts: dict[str, Any] = {"temperature": 1.0 if self.temperature is None else self.temperature}
        for name in ("top_p", "seed", "top_k", "min_p", "repeat_penalty"):
            value = getattr(self, name)
            if value is not None:
                opts[name] = value
        if self.stop is not None:
            opts["stop"] = self.stops()
        if self.response_format is not None:
            opts["response_format"] = self.response_format
        if self.logprobs_top() is not None:
            opts["logprobs"] = self.logprobs_top()
        return opts

    def logprobs_top(self) -> int | None:
        """The top alternatives per token asked for, None for no logprobs."""
        raise NotImplementedError

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    top_logprobs: int | None = None
    # thinking on a model whose template thinks: OpenAI's reasoning_effort ("none" and "minimal": off, the
    # nearest a local template has to minimal reasoning, so a model that does not think takes both; "low" and
    # above: on) and
    # llama.cpp's / vLLM's chat_template_kwargs {"enable_thinking": bool} (the one key edge passes on)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # the most thinking tokens before the close tag is forced (llama.cpp's per-request key)
    thinking_budget_tokens: int | None = Field(default=None, ge=0)

    def logprobs_top(self) -> int | None:
        return lp.chat_top(self.logprobs, self.top_logprobs)

    def thinking(self) -> Thinking | None:
        """What the request asks of thinking (None: the template's default)."""
        kwargs = self.chat_template_kwargs or {}
        unknown = sorted(set(kwargs) - {"enable_thinking"})
        if unknown:
            raise UnsupportedValue(
                "chat_template_kwargs", f"chat_template_kwargs takes only enable_thinking (got {unknown})"
            )
        enable = kwargs.get("enable_thinking")
        if enable is not None and not isinstance(enable, bool):
            raise UnsupportedValue(
                "chat_template_kwargs", "chat_template_kwargs.enable_thinking is a boolean"
            )
        effort = None if self.reasoning_effort is None else self.reasoning_effort not in ("none", "minimal")
        if enable is not None and effort is not None and enable != effort:
            raise UnsupportedValue(
                "reasoning_effort", "reasoning_effort and chat_template_kwargs.enable_thinking disagree"
            )
        on = enable if enable is not None else effort
        budget = self.thinking_budget_tokens
        if on is False and budget is not None:
            raise UnsupportedValue("thinking_budget_tokens", "a thinking budget needs thinking on")
        if on is None and budget is None:
            return None
        param = "reasoning_effort" if effort is not None else "chat_template_kwargs"
        return Thinking(on=on, budget=budget, param="thinking_budget_tokens" if on is None else param)

    def check(self) -> None:
        self.check_common()
        for i, m in enumerate(self.messages):
            if m.tool_calls and m.role != "assistant":
                raise UnsupportedValue(f"messages[{i}].tool_calls", "only assistant messages make tool calls")

    def chat_messages(self) -> list[dict[str, Any]]:
        """The conversation as the chat template takes it (a developer message is a system message; calls and
        tool results in the shape the templates read)."""
        out = []
        for i, m in enumerate(self.messages):
            role = "system" if m.role == "developer" else m.role
            msg: dict[str, Any] = {"role": role, "content": m.text(f"messages[{i}]")}
            if m.tool_calls:
                msg["tool_calls"] = [c.model_dump(exclude_none=True) for c in m.tool_calls]
            if m.tool_call_id is not None:
                msg["tool_call_id"] = m.tool_call_id
            if m.name is not None and role == "tool":
                msg["name"] = m.name
            if m.reasoning_content is not None and role == "assistant":
                msg["reasoning_content"] = m.reasoning_content
            out.append(msg)
        return out

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def logprobs_top(self) -> int | None:
        return lp.completion_top(self.logprobs)

    def check(self) -> None:
        self.check_common()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise UnsupportedValue("prompt", "only one prompt per request is supported")
        if self.echo:
            raise UnsupportedValue("echo", "echo is not supported")
        if self.suffix:
            raise UnsupportedValue("suffix", "suffix (insertion) is not supported")
        if self.best_of not in (None, 1):
            raise UnsupportedValue("best_of", "only best_of=1 is supported")

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def token_budget(self) -> int | None:
        return self.max_tokens


# -- responses (plain dicts in OpenAI's shape) -----------------------------------------------------
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": ErrorBody(message=message, type=type_, param=param, code=code).model_dump()}


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def finish_reason(stop_reason: str, calls: int = 0) -> str:
    """edge's stop reason as OpenAI's finish_reason. An answer cut by a shutdown is "length": the one reason every
    client already reads as "the text is incomplete" (the `edge` field's stop_reason says "shutdown")."""
    if stop_reason in ("length", "context", "shutdown"):
        return "length"
    return "tool_calls" if calls else "stop"


def models_response(names: list[str], created: int) -> dict[str, Any]:
    data = [{"id": n, "object": "model", "created": created, "owned_by": "edge"} for n in names]
    return {"object": "list", "data": data}


def chat_response(
    rid: str,
    model: str,
    text: str,
    finish: str,
    usage: Usage,
    extra: dict[str, Any],
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    logprobs: dict[str, Any] | None = None,
    reasoning: str | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls}
    if reasoning is not None:  # a thinking model's (llama.cpp's and vLLM's field)
        message["reasoning_content"] = reasoning
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": finish,
            }
        ],
        "usage": usage.model_dump(exclude_none=True),
        "edge": extra,
    }


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None,
    finish: str | None = None,
    usage: Usage | None = None,
    extra: dict[str, Any] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One stream chunk; `delta=None` is the usage-only chunk (no choices) that include_usage asks for."""
    choice = (
        None if delta is None else {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    )
    return _chunk("chat.completion.chunk", rid, model, created, choice, usage, extra)


def completion_response(
    rid: str,
    model: str,
    text: str,
    finish: str,
    usage: Usage,
    extra: dict[str, Any],
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
        "usage": usage.model_dump(exclude_none=True),
        "edge": extra,
    }


def completion_chunk(
    rid: str,
    model: str,
    created: int,
    text: str | None,
    finish: str | None = None,
    usage: Usage | None = None,
    extra: dict[str, Any] | None = None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice = (
        None if text is None else {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
    )
    return _chunk("text_completion", rid, model, created, choice, usage, extra)


def _chunk(
    obj: str,
    rid: str,
    model: str,
    created: int,
    choice: dict[str, Any] | None,
    usage: Usage | None,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    """A stream chunk of either endpoint; no choice: the usage-only chunk."""
    chunk: dict[str, Any] = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": [] if choice is None else [choice],
    }
    if usage is not None:
        chunk["usage"] = usage.model_dump(exclude_none=True)
    if extra is not None:
        chunk["edge"] = extra
    return chunk
