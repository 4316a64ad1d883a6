"""Chat templates from GGUF metadata, rendered in a locked-down jinja2 sandbox.

Untrusted model files carry these templates (CVE-2024-34359 was code execution through one), so rendering
uses `ImmutableSandboxedEnvironment` and bounds time, loop sizes and output size. A single C-level call
cannot be interrupted by a deadline, so every way of building a big value (`*`, `%`, `**`, `~`, filters,
str methods, buffer joins, printing a container) is checked against the limits *before* it allocates.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.sandbox
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import markup_join, str_join
from jinja2.utils import Namespace, generate_lorem_ipsum

from edge.errors import TemplateError

TEMPLATE_KEY = "tokenizer.chat_template"


@dataclass(frozen=True)
class ThinkingStyle:
    """How a template's model thinks: a block between `open` and `close` before the answer (Qwen3, the
    DeepSeek-R1 distills, QwQ). `switch`: the template variable that turns it off (Qwen3's
    `enable_thinking`, false: the template writes an empty block); None: the template always thinks."""

    open: str = "<think>"
    close: str = "</think>"
    switch: str | None = None


def thinking_style(source: str) -> ThinkingStyle | None:
    """Declared by the template's text, never probed by generating: a template that writes or strips both
    think tags was made for a model that thinks. None: the model does not think."""
    style = ThinkingStyle()
    if style.open not in source or style.close not in source:
        return None
    return ThinkingStyle(switch="enable_thinking" if "enable_thinking" in source else None)


@dataclass(frozen=True)
class TemplateLimits:
    seconds: float = 1.0
    max_output_chars: int = 4_000_000
    max_range: int = 100_000
    max_source_chars: int = 1_000_000
    max_items: int = 1_000_000  # one list / tuple / dict value


_MAX_INT_BITS = 1 << 16  # ~20k decimal digits: far above any template's arithmetic, and fast to compute
_DIGITS = re.compile(r"\d+")
# Filters that turn their input into text (so a container's repr size matters) or whose arguments size
# the result; the others only count, pick or reorder items.
_TEXT_FILTERS = frozenset({
    "capitalize", "center", "e", "escape", "forceescape", "format", "indent", "join", "lower", "pprint",
    "replace", "safe", "string", "striptags", "title", "tojson", "trim", "truncate", "upper", "urlencode",
    "urlize", "wordcount", "wordwrap",
})  # fmt: skip
# Filters whose integer argument is a count of output pieces.
_COUNT_FILTERS = frozenset({"batch", "slice"})


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

    @property
    def deadline(self) -> _Deadline:
        found: _Deadline | None = getattr(self._local, "deadline", None)
        if found is None:
            found = self._local.deadline = _Deadline(self.limits.seconds)
        return found

    @deadline.setter
    def deadline(self, value: _Deadline) -> None:
        self._local.deadline = value

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self, limits: TemplateLimits) -> None:
        # Same settings as HF transformers' chat templates (lenient Undefined: templates test `if tools`).
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        self.limits = limits
        # per thread: two threads rendering with one model (the server, the API) each get their own deadline
        self._local = threading.local()
        self.code_generator_class = _BoundedCodeGenerator
        self.globals.update(
            range=self._range,
            raise_exception=_raise_exception,
            strftime_now=_strftime_now,
            lipsum=self._lipsum,
        )
        self.filters["tojson"] = _tojson
        # filters are bound into the compiled template, so they are wrapped before anything compiles
        self.filters = {name: self._bounded_filter(name, f) for name, f in self.filters.items()}
        self.finalize = self._finalize  # every {{ value }}: a container's repr is sized before str()
        self.concat = self._concat  # macro bodies, {% set %} blocks, caller(): the buffer join

    # -- size checks ---------------------------------------------------------------------------------
    def too_big(self, what: str, n: int) -> TemplateError:
        return TemplateError(
            f"chat template builds {what} of about {n} characters or items "
            f"(limits {self.limits.max_output_chars} characters, {self.limits.max_items} items)",
            hint="the template is broken or hostile; pass --raw",
        )

    def check_text(self, value: Any, what: str = "a text") -> None:
        n = _text_size(value, self.limits.max_output_chars)
        if n > self.limits.max_output_chars:
            raise self.too_big(what, n)

    def check_result(self, value: Any) -> Any:
        """A value just made: strings against the output limit, containers against the item limit."""
        if isinstance(value, str):
            if len(value) > self.limits.max_output_chars:
                raise self.too_big("a string", len(value))
        elif isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > self.limits.max_items:
            raise self.too_big("a collection", len(value))
        return value

    def check_args(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Integer arguments are widths, counts or repeat factors in every call that blows up a value."""
        for a in (*args, *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > self.limits.max_output_chars:
                raise self.too_big("a value sized by an argument", abs(a))

    def check_format(self, fmt: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """printf / str.format: widths written in the format string, and the size of what is inserted."""
        limit = self.limits.max_output_chars
        widest = max((int(d) for d in _DIGITS.findall(fmt) if len(d) <= 12), default=0)
        if any(len(d) > 12 for d in _DIGITS.findall(fmt)) or widest > limit:
            raise self.too_big("a formatted string", widest)
        self.check_args(args, kwargs)
        n = len(fmt) + sum(_text_size(a, limit) for a in (*args, *kwargs.values()))
        if "*" in fmt:  # '%*s': the width comes from the arguments (checked above)
            n += sum(abs(a) for a in args if isinstance(a, int) and not isinstance(a, bool))
        if n > limit:
            raise self.too_big("a formatted string", n)

    def bounded_join(self, parts: Sequence[Any], eval_ctx: Any) -> str:
        """`a ~ b ~ ...`: the parts sized before jinja2 joins them."""
        limit = self.limits.max_output_chars
        n = 0
        for p in parts:
            n += _text_size(p, limit)
            if n > limit:
                raise self.too_big("a string", n)
        return markup_join(parts) if eval_ctx.autoescape else str_join(parts)

    def _concat(self, parts: Any) -> str:
        parts = list(parts)
        n = sum(len(p) for p in parts)  # buffers hold text already
        if n > self.limits.max_output_chars:
            raise self.too_big("a string", n)
        return "".join(parts)

    def _finalize(self, value: Any) -> Any:
        if not isinstance(value, str):
            self.check_text(value)
        return value

    def _lipsum(self, n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
        if not (0 <= n <= 100 and 0 < min <= max <= 1000):
            raise TemplateError(f"chat template asked for lipsum(n={n}, min={min}, max={max}) (too large)")
        return generate_lorem_ipsum(n=n, html=html, min=min, max=max)

    def _bounded_filter(self, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        skip = 1 if getattr(f, "jinja_pass_arg", None) is not None else 0  # context / environment first
        text = name in _TEXT_FILTERS
        counts = name in _COUNT_FILTERS

        @functools.wraps(f)  # keeps jinja_pass_arg
        def bounded(*args: Any, **kwargs: Any) -> Any:
            self.deadline.check()
            value, rest = (args[skip], args[skip + 1 :]) if len(args) > skip else (None, ())
            if text and isinstance(value, Iterator):  # a generator (range, map) sized before it is joined
                value = list(itertools.islice(value, self.limits.max_items + 1))
                self.check_result(value)
                args = (*args[:skip], value, *rest)
            self.check_args(rest, kwargs)
            if counts and rest and isinstance(rest[0], int) and abs(rest[0]) > self.limits.max_range:
                raise self.too_big(f"{name}() pieces", abs(rest[0]))
            if text:
                self.check_text(value, f"the input of |{name}")
                _FILTER_ESTIMATES.get(name, _no_estimate)(self, value, rest, kwargs)
            return self.check_result(f(*args, **kwargs))

        return bounded

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        fmt: str = value.__self__

        def bounded(*args: Any, **kwargs: Any) -> str:
            inserted = args[0] if value.__name__ == "format_map" and args else {}
            self.check_format(fmt, args, {**kwargs, **(inserted if isinstance(inserted, dict) else {})})
            return self.check_result(wrapped(*args, **kwargs))

        return bounded

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
        self.check_args(args, kwargs)
        for a in (*args, *kwargs.values()):
            self.check_result(a)
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            _METHOD_ESTIMATES.get(getattr(__obj, "__name__", ""), _no_estimate)(self, owner, args, kwargs)
        return self.check_result(super().call(__context, __obj, *args, **kwargs))

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
        if _is_int(left) and _is_int(right):
            # int math is one C call a deadline cannot interrupt: bound the size of its result
            bits = left.bit_length() * max(right, 0) if operator == "**" else 0
            bits = left.bit_length() + right.bit_length() if operator == "*" else bits
            if bits > _MAX_INT_BITS:
                raise TemplateError(f"chat template computes a {bits}-bit integer (limit {_MAX_INT_BITS})")
        if operator in ("*", "+"):
            n = _seq_repeat_len(left, right) if operator == "*" else _concat_len(left, right)
            limit = self.limits.max_output_chars if isinstance(left, str) else self.limits.max_items
            if n > limit:
                raise TemplateError(f"chat template builds a value of {n} items (limit {limit})")
        if operator == "%" and isinstance(left, str):  # printf-style formatting
            args = right if isinstance(right, tuple) else (right,)
            self.check_format(left, args, right if isinstance(right, dict) else {})
        return super().call_binop(context, operator, left, right)


class _BoundedCodeGenerator(CodeGenerator):
    """`a ~ b` joins through the environment, which sizes the parts first (jinja2 joins blindly)."""

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.bounded_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("), context.eval_ctx)")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text_size(value: Any, limit: int) -> int:
    """About len(str(value)), over-estimated for containers (repr escapes), walked only until past `limit`."""
    if isinstance(value, str):
        return len(value)
    total = 0
    stack = [value]
    seen: set[int] = set()
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, str):  # inside a container: repr() escapes (\\, \n, \x00, \U000e0001)
            total += 2 + len(v) * (2 if v.isprintable() else 4 if v.isascii() else 10)
        elif _is_int(v):
            total += 2 + v.bit_length() // 3
        elif isinstance(v, (list, tuple, set, frozenset, dict, Namespace)):
            if id(v) in seen:  # a cycle prints as [...]
                total += 5
                continue
            seen.add(id(v))
            items = v._Namespace__attrs if isinstance(v, Namespace) else v  # type: ignore[attr-defined]
            if isinstance(items, dict):
                total += 2 + 4 * len(items)
                stack.extend(items.keys())
                stack.extend(items.values())
            else:
                total += 2 + 2 * len(items)
                stack.extend(items)
        else:  # numbers, None, Undefined, macros, loop objects: short reprs
            total += 40
    return total


_Estimate = Callable[[_BoundedEnvironment, Any, Sequence[Any], Mapping[str, Any]], None]


def _no_estimate(
    env: _BoundedEnvironment, value: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    return None


def _arg(args: Sequence[Any], kwargs: Mapping[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _estimate_replace(
    env: _BoundedEnvironment, s: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    old, new = _arg(args, kwargs, 0, "old", ""), _arg(args, kwargs, 1, "new", "")
    text = str(s)
    if isinstance(old, str) and isinstance(new, str) and len(new) > len(old):
        hits = len(text) + 1 if not old else text.count(old)
        n = len(text) + hits * (len(new) - len(old))
        if n > env.limits.max_output_chars:
            raise env.too_big("a string", n)


def _estimate_join(
    env: _BoundedEnvironment, sep: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    """str.join(items): sep between every pair (the |join filter is (items, sep): see below)."""
    items = _arg(args, kwargs, 0, "iterable", ())
    if isinstance(sep, str) and isinstance(items, (list, tuple, str, dict, set, frozenset)):
        limit = env.limits.max_output_chars
        n = len(sep) * max(len(items) - 1, 0)
        if n > limit:
            raise env.too_big("a joined string", n)
        n += sum(_text_size(x, limit) for x in items) if not isinstance(items, str) else len(items)
        if n > limit:
            raise env.too_big("a joined string", n)


def _estimate_join_filter(
    env: _BoundedEnvironment, items: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    _estimate_join(env, _arg(args, kwargs, 0, "d", ""), (items,), {})


def _estimate_expandtabs(
    env: _BoundedEnvironment, s: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    size = _arg(args, kwargs, 0, "tabsize", 8)
    if _is_int(size) and len(s) + s.count("\t") * max(size, 0) > env.limits.max_output_chars:
        raise env.too_big("a string", s.count("\t") * size)


def _estimate_indent(
    env: _BoundedEnvironment, s: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    width = _arg(args, kwargs, 0, "width", 4)
    pad = len(width) if isinstance(width, str) else width if _is_int(width) else 0
    text = str(s)
    n = len(text) + (text.count("\n") + 1) * max(pad, 0)
    if n > env.limits.max_output_chars:
        raise env.too_big("an indented string", n)


def _estimate_wordwrap(
    env: _BoundedEnvironment, s: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    width = _arg(args, kwargs, 0, "width", 79)
    wrap = _arg(args, kwargs, 2, "wrapstring", None) or "\n"
    text = str(s)
    if _is_int(width) and isinstance(wrap, str):
        n = len(text) + (len(text) // max(width, 1) + 1) * len(wrap)
        if n > env.limits.max_output_chars:
            raise env.too_big("a wrapped string", n)


def _estimate_format_filter(
    env: _BoundedEnvironment, fmt: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    env.check_format(str(fmt), args, kwargs)


def _estimate_tojson(
    env: _BoundedEnvironment, v: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    indent = _arg(args, kwargs, 0, "indent", None)
    if indent is not None and not (_is_int(indent) and 0 <= indent <= 16):
        raise TemplateError(f"chat template asked for tojson(indent={indent!r}) (allowed: 0 to 16)")


_METHOD_ESTIMATES: dict[str, _Estimate] = {
    "replace": _estimate_replace,
    "join": _estimate_join,
    "expandtabs": _estimate_expandtabs,
}
_FILTER_ESTIMATES: dict[str, _Estimate] = {
    "replace": _estimate_replace,
    "join": _estimate_join_filter,
    "indent": _estimate_indent,
    "wordwrap": _estimate_wordwrap,
    "format": _estimate_format_filter,
    "tojson": _estimate_tojson,
}


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
        self.thinking = thinking_style(source)  # None: the model does not think
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
        except TemplateError:
            raise
        except Exception as exc:
            # jinja2 compiles to Python: deep nesting overflows the parser ("too many statically nested
            # blocks", RecursionError) instead of giving a TemplateSyntaxError
            raise TemplateError(
                f"chat template cannot be compiled: {type(exc).__name__}: {exc}",
                hint="the template nests too deeply; pass --raw",
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
        except (OverflowError, MemoryError, RecursionError) as exc:
            raise TemplateError(f"chat template exhausted a resource: {type(exc).__name__}: {exc}") from None
        except Exception as exc:  # untrusted code: whatever it raises (1/0, a filter's assert) is its failure
            raise TemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from None
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
