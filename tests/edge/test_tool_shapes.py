"""Tool calls in the shapes small models write them under tool_choice auto (issue 48): tagged, bare JSON, doubled
braces (Qwen 2.5's template shows that shape), a fenced json block, several in a row, and text that merely holds
JSON. Each entry of the corpus, per family, is admitted by auto's grammar (llguidance over a byte vocabulary
with the call markers as special tokens where the family has them) and split into content and calls as
intended, whole and streamed in pieces of any size."""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance
import pytest

from edge.tools import CallSplitter, CallSyntax, ToolCall, ToolChoice, ToolPlan, parse_tools

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
OPEN, CLOSE = 256, 257  # the markers' ids in the byte vocabulary, for the family that has them as tokens
# the family: Qwen 2.5 (markers are special tokens: text may come before a call) and a template without a
# tools branch (edge's tools prompt; markers are text)
FAMILIES = {"qwen2.5": CallSyntax(open_id=OPEN, close_id=CLOSE), "hermes-text": CallSyntax()}

BOTH = ("qwen2.5", "hermes-text")
PARIS = ("get_weather", {"city": "Paris"})
SUM = ("add", {"a": 2, "b": 3})
TAGGED = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
BARE_SUM = '{"name": "add", "arguments": {"a": 2, "b": 3}}'
# (text, parallel, families it applies to, expected content, expected calls)
CORPUS: list[tuple[str, bool, tuple[str, ...], str, list[tuple[str, dict[str, Any]]]]] = [
    (TAGGED, False, BOTH, "", [PARIS]),
    ("Let me look.\n" + TAGGED, False, ("qwen2.5",), "Let me look.", [PARIS]),
    (BARE, False, BOTH, "", [PARIS]),
    ('{ "name":"add", "arguments": {"a": 2, "b": 3}}', False, BOTH, "", [SUM]),
    ("{" + BARE + "}", False, BOTH, "", [PARIS]),
    (f"```json\n{BARE}\n```", False, BOTH, "", [PARIS]),
    (f"{BARE}\n{BARE_SUM}", True, BOTH, "", [PARIS, SUM]),
    ("{" + BARE + "}\n{" + BARE_SUM + "}", True, BOTH, "", [PARIS, SUM]),
    (f"```json\n{BARE}\n```\n```json\n{BARE_SUM}\n```", True, BOTH, "", [PARIS, SUM]),
    (f"{TAGGED}\n{TAGGED}", True, BOTH, "", [PARIS, PARIS]),
    # text that merely holds JSON stays text
    ('The call would be {"name": "get_weather"}.', False, BOTH, None, []),
    ('{"name": "rm_rf", "arguments": {}}', False, BOTH, None, []),
    ('{"name": "get_weather_v2", "arguments": {}}', False, BOTH, None, []),
    ('{"city": "Paris"}', False, BOTH, None, []),
    ("{{ not json }}", False, BOTH, None, []),
    ("Here it is:\n```json\n" + BARE + "\n```", False, BOTH, None, []),
]
CASES = [
    pytest.param(family, *case, id=f"{family}-{i}") for i, case in enumerate(CORPUS) for family in case[2]
]


class _Bytes:
    """A byte vocabulary (what llguidance's TokenizerWrapper reads), the call markers as special tokens."""

    def __init__(self) -> None:
        self.tokens = [bytes([i]) for i in range(256)] + [
            b"\xff<tool_call>",
            b"\xff</tool_call>",
            b"\xff<eos>",
        ]
        self.special_token_ids = [OPEN, CLOSE, 258]
        self.eos_token_id = 258
        self.bos_token_id = None

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), n_vocab=259, eos_token=[258])


def plan(syntax: CallSyntax, parallel: bool) -> ToolPlan:
    return ToolPlan(parse_tools([WEATHER, ADD]), ToolChoice("auto"), syntax, native=True, parallel=parallel)


def ids(text: str, syntax: CallSyntax) -> list[int]:
    if syntax.open_id is None:
        return list(text.encode())
    out: list[int] = []
    for part in re.split("(</?tool_call>)", text):
        out += (
            [{"<tool_call>": OPEN, "</tool_call>": CLOSE}[part]]
            if "tool_call>" in part
            else list(part.encode())
        )
    return out


def admitted(p: ToolPlan, text: str) -> bool:
    grammar = p.grammar()
    assert grammar is not None
    matcher = llguidance.LLMatcher(
        TOKENIZER, llguidance.LLMatcher.grammar_from_lark(grammar.source), log_level=0
    )
    return all(matcher.consume_token(t) for t in ids(text, p.syntax)) and matcher.is_accepting()


def split_in_pieces(p: ToolPlan, text: str, size: int) -> tuple[str, list[ToolCall]]:
    splitter = CallSplitter(p)
    items = [x for at in range(0, len(text), size) for x in splitter.feed(text[at : at + size])]
    items += splitter.finish()
    return "".join(x for x in items if isinstance(x, str)), [x for x in items if isinstance(x, ToolCall)]


@pytest.mark.parametrize(("family", "text", "parallel", "families", "content", "calls"), CASES)
def test_each_shape_is_admitted_and_read_as_intended(
    family: str, text: str, parallel: bool, families: tuple[str, ...], content: str | None, calls: list[Any]
) -> None:
    p = plan(FAMILIES[family], parallel)
    assert admitted(p, text), text
    want = text if content is None else content
    for size in (1, 3, 7, len(text)):
        got, made = split_in_pieces(p, text, size)
        assert got == want, (size, got)
        assert [(c.name, json.loads(c.arguments)) for c in made] == calls, size


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"town": "Paris"}}',  # a key the schema does not have
        '{"name": "get_weather", "arguments": {"city": "Paris"}} and more',  # text after a call
        '{{"name": "get_weather", "arguments": {"city": "Paris"}}',  # a doubled brace never closed
        f"{BARE}\n{BARE}",  # a second call where one is allowed
    ],
)
def test_from_the_trigger_on_the_call_is_constrained(text: str) -> None:
    assert not admitted(plan(FAMILIES["qwen2.5"], False), text)


def test_a_call_cut_short_comes_out_as_text() -> None:
    cut = '{"name": "get_weather", "arguments": {"ci'
    for size in (1, len(cut)):
        assert split_in_pieces(plan(FAMILIES["qwen2.5"], False), cut, size) == (cut, [])


def test_a_held_opening_is_released_as_soon_as_it_is_no_call() -> None:
    splitter = CallSplitter(plan(FAMILIES["qwen2.5"], False))
    assert splitter.feed('{"name": "get_w') == []  # may still name get_weather: held
    assert splitter.feed('ind", "x": 1}') == ['{"name": "get_wind", "x": 1}']
