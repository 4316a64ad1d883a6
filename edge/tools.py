"""Tool calls: OpenAI's `tools` / `tool_choice`, rendered by the model's own chat template, guaranteed by a grammar
and parsed back into calls.

A model writes a call in its template's syntax (Qwen 2.5 / Hermes: `<tool_call>\\n{"name": ..., "arguments":
{...}}\\n</tool_call>`). `required` and a named function constrain the whole answer to calls of the allowed
functions whose arguments match their `parameters` schema; `auto` lets the model answer in text or call, the call
constrained once it starts. Under `auto` an answer may also open with a call in the shapes small models write
without the markers: a bare JSON object `{"name": <declared tool>, "arguments": ...}`, the same in doubled braces
(Qwen 2.5's template shows its example so) or in a ```json fence, several in a row where parallel calls are
allowed; each shape's opening up to the tool's name is a lexeme of the grammar (the trigger), and from it on
the tool's schema holds. A JSON object naming no declared tool stays text; `none` renders no tools and parses no calls, so none can come out. A template with no
tools branch gets the same syntax through a system prompt edge writes; a template whose call syntax edge does not
know is refused (never a tool request answered as if no tools were given).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge.errors import GrammarError, ToolError
from edge.generate import GenerationConfig
from edge.grammar import Grammar
from edge.models.chat_template import ChatTemplate
from edge.models.tokenizer import Tokenizer
from edge.schemas import read_schema

__all__ = [
    "CallSplitter",
    "Tool",
    "ToolCall",
    "ToolChoice",
    "ToolPlan",
    "plan_tools",
]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 128
# Qwen 2.5 Coder, asked with tools in auto mode, often writes its call as a fenced JSON block instead of in
# <tool_call> tags (llama.cpp's Hermes parser takes that form too): at the start of an answer it is a call
FENCE = ("```json\n", "\n```")
# JSON written the way the Qwen/Hermes templates write it (", " and ": "), so a call reads like the examples
_JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", ", "lenient": False}


@dataclass(frozen=True)
class Tool:
    """One function the model may call."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    # the parameters as the grammar enforces them (annotation keys dropped: `notes` says which); None: as given
    enforced: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()

    def openai(self) -> dict[str, Any]:
        """The tool in OpenAI's shape (what chat templates iterate over)."""
        fn = {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolCall:
    """A call the model made: `arguments` is JSON text (as OpenAI returns it), valid against the tool's schema."""

    id: str
    name: str
    arguments: str

    def openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function"}
        out["function"] = {"name": self.name, "arguments": self.arguments}
        return out if index is None else {"index": index, **out}


@dataclass(frozen=True)
class ToolChoice:
    """auto | none | required | function (then `name` is the one function allowed)."""

    mode: str = "auto"
    name: str | None = None


def parse_tools(tools: Sequence[Any]) -> tuple[Tool, ...]:
    """OpenAI's `tools` list, each entry checked: a function with a valid name and a `parameters` JSON Schema
    edge can enforce (the keyword a validator would ignore, or the engine cannot enforce, is named)."""
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise ToolError("tools must be a list of {'type': 'function', 'function': {...}}")
    if len(tools) > MAX_TOOLS:
        raise ToolError(f"at most {MAX_TOOLS} tools per request (got {len(tools)})")
    out: list[Tool] = []
    for i, entry in enumerate(tools):
        out.append(_tool(entry, f"tools[{i}]"))
    names = [t.name for t in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ToolError(f"tool names must be unique: {', '.join(dup)} given twice")
    return tuple(out)


def _tool(entry: Any, where: str) -> Tool:
    if not isinstance(entry, Mapping) or entry.get("type") != "function":
        raise ToolError(f"{where}: only {{'type': 'function', 'function': {{...}}}} tools are supported")
    _only(entry, {"type", "function"}, where)
    fn = entry.get("function")
    if not isinstance(fn, Mapping):
        raise ToolError(f"{where}.function must be an object with a name")
    _only(fn, {"name", "description", "parameters", "strict"}, f"{where}.function")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ToolError(f"{where}.function.name must be 1-64 letters, digits, _ or - (got {name!r})")
    description = fn.get("description") or ""
    if not isinstance(description, str):
        raise ToolError(f"{where}.function.description must be text")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, Mapping) or params.get("type", "object") != "object":
        raise ToolError(f"{where}.function.parameters must be a JSON Schema of type object")
    try:
        read = read_schema(params)
    except GrammarError as exc:
        raise ToolError(f"{where}.function.parameters: {exc.message}", hint=exc.hint) from None
    notes = tuple(f"tool {name}: {note}" for note in read.notes)
    return Tool(name, description, params, read.schema, notes)


def _only(value: Mapping[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(value) - known)
    if unknown:
        raise ToolError(f"{where}: unknown key {', '.join(map(repr, unknown))}", hint=f"use {sorted(known)}")


def parse_tool_choice(value: Any, tools: Sequence[Tool]) -> ToolChoice:
    """OpenAI's `tool_choice` (default: auto where tools are given, none where not)."""
    if value is None:
        return ToolChoice("auto" if tools else "none")
    if value in ("auto", "none", "required"):
        if value != "none" and not tools:
            raise ToolError(f"tool_choice {value!r} needs tools")
        return ToolChoice(value)
    if isinstance(value, Mapping) and value.get("type") == "function":
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else None
        if name not in {t.name for t in tools}:
            raise ToolError(f"tool_choice names function {name!r}, which is not among the tools")
        return ToolChoice("function", name)
    raise ToolError(
        f"tool_choice {value!r} is not supported",
        hint="use 'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}",
    )


# -- how a model writes a call ---------------------------------------------------------------------
@dataclass(frozen=True)
class CallSyntax:
    """Hermes-style calls: a JSON object {"name", "arguments"} between `open` and `close`. `open_id` /
    `close_id`: the markers as single special tokens (the grammar names them by id; text cannot spell them)."""

    open: str = "<tool_call>"
    close: str = "</tool_call>"
    open_id: int | None = None
    close_id: int | None = None

    def lark_open(self) -> str:
        return f"<[{self.open_id}]>" if self.open_id is not None else json.dumps(self.open)

    def lark_close(self) -> str:
        return f"<[{self.close_id}]>" if self.close_id is not None else json.dumps(self.close)


def _special_id(tokenizer: Tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, parse_special=True)
    return ids[0] if len(ids) == 1 and tokenizer.is_special(ids[0]) else None


def _syntax(template: ChatTemplate, tokenizer: Tokenizer) -> tuple[CallSyntax, bool]:
    """The model's call syntax and whether its template renders tools itself (else edge's system prompt)."""
    source = template.source
    native = "tools" in source
    if native and "<tool_call>" not in source:
        raise ToolError(
            "this model's chat template writes tool calls in a syntax edge does not parse",
            hint="edge parses Qwen/Hermes <tool_call> calls; use a model whose template writes them",
        )
    ids = _special_id(tokenizer, "<tool_call>"), _special_id(tokenizer, "</tool_call>")
    both = ids if None not in ids else (None, None)
    return CallSyntax(open_id=both[0], close_id=both[1]), native


# -- the plan of one request -----------------------------------------------------------------------
@dataclass(frozen=True)
class ToolPlan:
    """What one request's tools mean for its prompt, its grammar and its answer."""

    tools: tuple[Tool, ...]
    choice: ToolChoice
    syntax: CallSyntax
    native: bool  # the template renders tools itself
    # one call per answer unless asked (llama.cpp's server default too): small models at temperature 0 repeat
    # calls until max_tokens once a second one is allowed
    parallel: bool = False

    @property
    def notes(self) -> tuple[str, ...]:
        """What reading the tools' schemas dropped (annotation keys), to tell the client."""
        return tuple(note for t in self.tools for note in t.notes)

    @property
    def active(self) -> bool:
        return self.choice.mode != "none"

    def template_kwargs(self) -> dict[str, Any]:
        """What the chat template gets besides the messages."""
        return {"tools": [t.openai() for t in self.tools]} if self.tools and self.native else {}

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """The conversation for the template: calls' arguments as objects (the templates `tojson` them); for a
        template without a tools branch, calls and results written as text and edge's tools system prompt."""
        out = [_template_message(m) for m in messages]
        if self.native:
            return out
        out = [_as_text(m, self.syntax) for m in out]
        if not self.tools:
            return out
        prompt = _system_prompt(self.tools, self.syntax)
        if out and out[0].get("role") == "system":
            return [
                {"role": "system", "content": f"{out[0].get('content') or ''}\n\n{prompt}".lstrip()},
                *out[1:],
            ]
        return [{"role": "system", "content": prompt}, *out]

    def grammar(self, answer: Grammar | None = None) -> Grammar | None:
        """The constraint of the whole answer (None: unconstrained). `answer`: the response_format's grammar,
        which a text answer in auto mode must match."""
        if not self.active:  # none: the tools are known, no call can be written
            return (
                answer
                if answer is not None or not self.tools
                else Grammar("lark", f"start: TEXT\n{self._text()}")
            )
        allowed = self.allowed()
        calls = "call" if not self.parallel else 'call ("\\n" call)*'
        rules = [
            f"calls: {calls}",
            f'call: {self.syntax.lark_open()} "\\n" body "\\n" {self.syntax.lark_close()}',
            *_body_rules(allowed),
        ]
        if self.choice.mode in ("required", "function"):
            return Grammar("lark", "\n".join(["start: calls", *rules]))
        return Grammar("lark", "\n".join([*self._text_rules(answer), *rules]))

    def allowed(self) -> list[Tool]:
        """The tools a call may name under this choice."""
        return [t for t in self.tools if self.choice.mode != "function" or t.name == self.choice.name]

    def _text_rules(self, answer: Grammar | None) -> list[str]:
        if answer is not None:
            if answer.kind not in ("json_schema", "json_object"):
                raise ToolError("tools combine with a json_object or json_schema response_format only")
            schema = {"x-guidance": _JSON_STYLE, **answer.schema()}
            return ["start: text | calls", f"text: %json {json.dumps(schema)}"]
        # a special-token marker can follow a preamble (the lexer cannot confuse it with text); the JSON shapes
        # open the answer, each trigger a lexeme that ends where the text lexeme stops matching
        head = "start: TEXT | TEXT? calls" if self.syntax.open_id is not None else "start: TEXT | calls"
        shapes = 'shaped ("\\n" shaped)*' if self.parallel else "shaped"
        return [
            f"{head} | shapeds",
            f"shapeds: {shapes}",
            "shaped: fenced | bare | doubled",
            f"fenced: {json.dumps(FENCE[0])} body {json.dumps(FENCE[1])}",
            "bare: " + " | ".join(f"BARE_{i} rest_{i}" for i in range(len(self.allowed()))),
            "doubled: " + " | ".join(f'DOUBLED_{i} rest_{i} "}}"' for i in range(len(self.allowed()))),
            *(f"BARE_{i}: /{_trigger(_literal(t.name))}/" for i, t in enumerate(self.allowed())),
            *(f"DOUBLED_{i}: /\\{{{_trigger(_literal(t.name))}/" for i, t in enumerate(self.allowed())),
            self._text(shaped=True),
        ]

    def _text(self, shaped: bool = False) -> str:
        """Free text that never spells the call marker, so every marker in an answer opened a constrained call
        (and with `none` none can be written); with `shaped`, it does not open as a JSON-shaped call either."""
        names = "|".join(_literal(t.name) for t in self.allowed())
        not_json = (
            f" & ~/{_literal(FENCE[0])}(?s:.*)/ & ~/\\{{?{_trigger(f'({names})')}(?s:.*)/" if shaped else ""
        )
        return f"TEXT: /(.|\\n)+/ & ~/(?s:.*{_literal(self.syntax.open)}.*)/{not_json}"

    def constrain(self, config: GenerationConfig) -> GenerationConfig:
        """`config` with the tools' grammar around its response_format's; stop strings are refused, as with a
        schema: one could cut a call short of its arguments."""
        if self.active and config.stop:
            raise ToolError(
                "stop strings cannot be combined with tool calls",
                hint="drop stop: a call ends where its arguments are complete",
            )
        return dataclasses.replace(config, grammar=self.grammar(config.grammar))

    def split(self, text: str) -> tuple[str, list[ToolCall]]:
        """An answer's text as (content, calls); a call cut short (max_tokens) stays in the content."""
        if not self.active:
            return text, []
        splitter = CallSplitter(self)
        pieces = [*splitter.feed(text), *splitter.finish()]
        content = "".join(p for p in pieces if isinstance(p, str))
        return content, [p for p in pieces if isinstance(p, ToolCall)]


def _literal(text: str) -> str:
    """`text` as a regex in a Lark grammar (a newline as \\n: the grammar's regexes are one line)."""
    return re.escape(text).replace("\\\n", "\\n")


def _trigger(name: str) -> str:
    """The regex of a bare JSON call's opening up to its name: `{"name": "NAME"` with any spacing (`name`: a
    regex, so one trigger can name several tools)."""
    return f'\\{{\\s*"name"\\s*:\\s*"{name}"'


def _body_rules(tools: Sequence[Tool]) -> list[str]:
    """`body`: one call as JSON, `{"name": ..., "arguments": ...}`; `rest_i`: what follows tool i's name. Each
    tool's parameters are a schema of their own (`%json`), so their `$ref`s resolve against their own root."""
    rules = ["body: " + " | ".join(f"{json.dumps(_opening(t.name))} rest_{i}" for i, t in enumerate(tools))]
    for i, t in enumerate(tools):
        args = {"x-guidance": _JSON_STYLE, **(t.parameters if t.enforced is None else t.enforced)}
        rules += [f'rest_{i}: ", \\"arguments\\": " args_{i} "}}"', f"args_{i}: %json {json.dumps(args)}"]
    return rules


def _opening(name: str) -> str:
    return '{"name": ' + json.dumps(name)


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A history's assistant calls with their arguments as objects (what the chat templates `tojson`), also
    for a request that gives no tools this turn."""
    return [_template_message(m) for m in messages]


def _template_message(m: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(m)
    calls = out.get("tool_calls")
    if calls:
        out["tool_calls"] = [_call_for_template(c) for c in calls]
    return out


def _call_for_template(call: Mapping[str, Any]) -> dict[str, Any]:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            raise ToolError(
                f"tool call {fn.get('name')!r} in the history has arguments that are not JSON"
            ) from None
    return {**call, "function": {"name": fn.get("name"), "arguments": args}}


def _as_text(m: dict[str, Any], syntax: CallSyntax) -> dict[str, Any]:
    """A call or a tool result as plain chat text, for a template that knows no tools."""
    if m.get("role") == "tool":
        return {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
    calls = m.get("tool_calls")
    if not calls:
        return m
    written = [
        f"{syntax.open}\n{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}\n"
        f"{syntax.close}"
        for c in calls
    ]
    text = "\n".join([*([m["content"]] if m.get("content") else []), *written])
    return {"role": "assistant", "content": text}


def _system_prompt(tools: Iterable[Tool], syntax: CallSyntax) -> str:
    """The tools instruction the Qwen 2.5 templates write, for a template that has none."""
    listed = "\n".join(json.dumps(t.openai()) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>"
        "\n\nFor each function call, return a json object with function name and arguments within "
        f"{syntax.open}{syntax.close} XML tags:\n{syntax.open}\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        f"{syntax.close}"
    )


# -- reading calls out of a stream of text ---------------------------------------------------------
class CallSplitter:
    """Text pieces in, content pieces (str) and finished calls (ToolCall) out, as soon as each is certain: text
    that may be the start of a call marker, or whitespace before a call, is held until the next piece tells.
    In auto mode an answer may open with JSON-shaped calls (fenced, bare or in doubled braces), held from their
    first character while they may still name a declared tool."""

    def __init__(self, plan: ToolPlan) -> None:
        self._markers = plan.syntax.open, plan.syntax.close
        self._open, self._close = self._markers
        self._names = {t.name for t in plan.tools}
        self._buf = ""
        self._in_call = False
        self._braces = 0  # inside a bare (1) or doubled-brace (2) call
        self._fresh = plan.choice.mode == "auto"  # a JSON-shaped call may open the answer (auto's grammar)
        self.calls = 0

    def feed(self, piece: str) -> list[str | ToolCall]:
        self._buf += piece
        out: list[str | ToolCall] = []
        while True:
            if self._fresh and not self._opens_shaped():
                return out
            if self._braces:
                if not self._json_call(out):
                    return out
                continue
            if self._in_call:
                end, call = self._closing()
                if end < 0:
                    return out
                out.append(call if call is not None else f"{self._open}{self._buf[:end]}{self._close}")
                self._buf, self._in_call = self._buf[end + len(self._close) :], False
                if self._open == FENCE[0]:  # the next JSON-shaped call may follow (parallel)
                    self._fresh = True
                self._open, self._close = self._markers
                continue
            at = self._buf.find(self._open)
            if at >= 0:
                out.extend(self._content(self._buf[:at], final=True))
                self._buf, self._in_call = self._buf[at + len(self._open) :], True
                continue
            keep = _marker_prefix(self._buf, self._open)
            held = len(self._buf) - keep
            text = self._buf[:held]
            tail = len(text) - len(text.rstrip())  # whitespace waits: it is dropped before a call
            out.extend(self._content(text[: len(text) - tail]))
            self._buf = self._buf[len(text) - tail :]
            return out

    def _opens_shaped(self) -> bool:
        """Where a JSON-shaped call may start: False while undecided; else decided (and True), the state set to
        the call's shape or to text."""
        head = self._buf.lstrip() if self.calls else self._buf  # between parallel calls: a newline
        if FENCE[0].startswith(head) and len(head) < len(FENCE[0]):
            return False
        braces = _opens_call(head, self._names)
        if braces is None:
            return False
        self._fresh = False
        if head.startswith(FENCE[0]):
            self._open, self._close = FENCE
            self._buf, self._in_call = head[len(FENCE[0]) :], True
        elif braces:
            self._buf, self._braces = head, braces
        return True

    def _json_call(self, out: list[str | ToolCall]) -> bool:
        """A bare or doubled-brace call read off the buffer once complete (False: not yet)."""
        try:
            value, end = json.JSONDecoder().raw_decode(self._buf, self._braces - 1)
        except ValueError:
            return False
        if self._braces == 2:
            if len(self._buf) <= end:
                return False
            end += 1  # the outer brace (the grammar writes it)
        call = self._call_of(value)
        out.append(call if call is not None else self._buf[:end])
        self._buf, self._braces, self._fresh = self._buf[end:], 0, True
        return True

    def _closing(self) -> tuple[int, ToolCall | None]:
        """Where the open call ends and the call it is: the first close marker after a body that parses as a
        call (an argument may spell the marker itself). (-1, None) while none has: the grammar only lets valid
        calls through, and one cut short comes out as text at `finish`."""
        at = self._buf.find(self._close)
        while at >= 0:
            call = self._call(self._buf[:at])
            if call is not None:
                return at, call
            at = self._buf.find(self._close, at + 1)
        return -1, None

    def finish(self) -> list[str | ToolCall]:
        """The rest: a call never closed (cut by max_tokens) comes out as content."""
        rest = f"{self._open}{self._buf}" if self._in_call else self._buf
        self._buf, self._in_call, self._braces = "", False, 0
        if self.calls and not rest.strip():
            return []
        return [rest] if rest else []

    def _content(self, text: str, final: bool = False) -> list[str | ToolCall]:
        if final:
            text = text.rstrip() if self.calls or text.strip() else ""
        return [text] if text else []

    def _call(self, body: str) -> ToolCall | None:
        try:
            value = json.loads(body)
        except ValueError:
            return None
        return self._call_of(value)

    def _call_of(self, value: Any) -> ToolCall | None:
        if not isinstance(value, dict) or value.get("name") not in self._names:
            return None
        args = value.get("arguments", value.get("parameters", {}))
        self.calls += 1
        text = json.dumps(args, ensure_ascii=False)
        return ToolCall(f"call_{uuid.uuid4().hex[:24]}", value["name"], text)


_SPACE = " \t\n\r"


def _opens_call(text: str, names: set[str]) -> int | None:
    """Whether `text` opens a bare JSON call of one of `names` (`{"name": "NAME"`, any spacing, one or two
    opening braces): the braces (1 or 2), 0 where it cannot, None while it still may."""
    braces = len(text) - len(text.lstrip("{"))
    if not 1 <= braces <= 2 or (braces == len(text) and braces < 2):
        return None if text == "" or text == "{" else 0
    at = braces
    for part in ('"name"', ":", '"'):
        while at < len(text) and text[at] in _SPACE:
            at += 1
        got = text[at : at + len(part)]
        if not part.startswith(got):
            return 0
        if len(got) < len(part):
            return None
        at += len(part)
    end = text.find('"', at)
    name = text[at:] if end < 0 else text[at:end]
    if end >= 0:
        return braces if name in names else 0
    return None if any(n.startswith(name) for n in names) else 0


def _marker_prefix(text: str, marker: str) -> int:
    """How many trailing characters of `text` are a proper prefix of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def plan_tools(
    template: ChatTemplate | None,
    tokenizer: Tokenizer,
    tools: Sequence[Any] | None,
    tool_choice: Any = None,
    parallel: bool | None = None,
) -> ToolPlan | None:
    """The plan of a request's tools (None where it has none and chooses none)."""
    parsed = parse_tools(tools or [])
    choice = parse_tool_choice(tool_choice, parsed)
    if not parsed and choice.mode == "none":
        return None
    if template is None:
        raise ToolError("tool calls need a chat model; this is a base model without a chat template")
    syntax, native = _syntax(template, tokenizer)
    return ToolPlan(parsed, choice, syntax, native, bool(parallel))
