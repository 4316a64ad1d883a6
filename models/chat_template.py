"""Chat templates from GGUF metadata, rendered in a locked-down jinja2 sandbox.

Untrusted model files carry these templates (CVE-2024-34359 was code execution through one), so rendering
uses `ImmutableSandboxedEnvironment` and bounds time, loop sizes and output size.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.sandbox

from edge.errors import TemplateError

TEMPLATE_KEY = "tokenizer.chat_template"


@dataclass(frozen=True)
class TemplateLimits:
    seconds: float = 1.0
    max_output_chars: int = 4_000_000
    max_range: int = 100_000
    max_source_chars: int = 1_000_000


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.seconds = seconds

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise TemplateError(
                f"chat template took longer than {self.seconds:g} s to render",
                hint="the model's template loops too much; pass --raw or use another model file",
            )


class _BoundedEnvironment(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """Sandbox that also checks a render deadline on every call, attribute lookup and binary op."""

    intercepted_binops = frozenset({"*", "**", "+"})

    def __init__(self, limits: TemplateLimits) -> None:
        # Same settings as HF transformers' chat templates (lenient Undefined: templates test `if tools`).
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        self.limits = limits
        self.deadline = _Deadline(limits.seconds)
        self.globals.update(range=self._range, raise_exception=_raise_exception, strftime_now=_strftime_now)
        self.filters["tojson"] = _tojson

    def _range(self, *args: int) -> Iterator[int]:
        r = range(*args)
        if len(r) > self.limits.max_range:
            raise TemplateError(
                f"chat template asked for range of {len(r)} items (limit {self.limits.max_range})"
            )
        for i in r:
            self.deadline.check()
            yield i

    def call(self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        self.deadline.check()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.deadline.check()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.deadline.check()
        return super().getitem(obj, argument)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        self.deadline.check()
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise TemplateError("chat template computes a power too large to allow")
        if operator in ("*", "+"):
            n = _seq_repeat_len(left, right) if operator == "*" else _concat_len(left, right)
            if n > self.limits.max_output_chars:
                raise TemplateError(
                    f"chat template builds a value of {n} items (limit {self.limits.max_output_chars})"
                )
        return super().call_binop(context, operator, left, right)


def _seq_repeat_len(left: Any, right: Any) -> int:
    for seq, k in ((left, right), (right, left)):
        if isinstance(seq, (str, list, tuple)) and isinstance(k, int):
            return len(seq) * max(k, 0)
    return 0


def _concat_len(left: Any, right: Any) -> int:
    if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        return len(left) + len(right)
    return 0


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None) -> str:
    import json

    # HF's tojson keeps non-ASCII as is (ensure_ascii=False); templates rely on that for tool schemas.
    return json.dumps(value, ensure_ascii=False, indent=indent)


class ChatTemplate:
    """A compiled chat template. `render(messages)` returns the prompt text, special tokens as text."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str = "",
        eos_token: str = "",
        limits: TemplateLimits | None = None,
    ) -> None:
        self.limits = limits or TemplateLimits()
        if len(source) > self.limits.max_source_chars:
            raise TemplateError(
                f"chat template is {len(source)} characters (limit {self.limits.max_source_chars})"
            )
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._env = _BoundedEnvironment(self.limits)
        try:
            self._template = self._env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(
                f"chat template does not parse: {exc.message} (line {exc.lineno})",
                hint="pass --raw to send the prompt without a template",
            ) from None

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        env = self._env
        env.deadline = _Deadline(self.limits.seconds)
        ctx = {
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **extra,
        }
        out: list[str] = []
        size = 0
        try:
            for chunk in self._template.generate(ctx):
                size += len(chunk)
                if size > self.limits.max_output_chars:
                    raise TemplateError(
                        f"chat template output exceeds {self.limits.max_output_chars} characters",
                        hint="the template is broken or hostile; pass --raw",
                    )
                env.deadline.check()
                out.append(chunk)
        except TemplateError:
            raise
        except jinja2.sandbox.SecurityError as exc:
            raise TemplateError(
                f"chat template tried an unsafe operation and was stopped: {exc}",
                hint="the model file's template is hostile; do not trust this file",
            ) from None
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
            raise TemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from None
        except (OverflowError, MemoryError, RecursionError) as exc:
            raise TemplateError(f"chat template exhausted a resource: {type(exc).__name__}: {exc}") from None
        return "".join(out)


def template_from_metadata(
    metadata: Mapping[str, Any], *, bos_token: str = "", eos_token: str = ""
) -> ChatTemplate | None:
    """The model's chat template, or None for a base model (edge then runs plain completion)."""
    source = metadata.get(TEMPLATE_KEY)
    if source is None:
        return None
    if not isinstance(source, str):
        raise TemplateError(f"{TEMPLATE_KEY} is a {type(source).__name__}, not text")
    if not source.strip():
        return None
    return ChatTemplate(source, bos_token=bos_token, eos_token=eos_token)
