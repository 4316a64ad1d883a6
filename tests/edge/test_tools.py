"""edge.tools without a model: tools and tool_choice checked, the grammar of each choice, and calls read out of
text however it is split into pieces."""

from __future__ import annotations

import json

import pytest

from edge.errors import ToolError
from edge.grammar import Grammar
from edge.tools import (
    CallSplitter,
    CallSyntax,
    ToolCall,
    ToolChoice,
    ToolPlan,
    parse_tool_choice,
    parse_tools,
)

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}


def plan(mode: str = "auto", name: str | None = None, **kw: object) -> ToolPlan:
    return ToolPlan(parse_tools([WEATHER, ADD]), ToolChoice(mode, name), CallSyntax(), native=False, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tools", "says"),
    [
        ([{"type": "retrieval"}], "only {'type': 'function'"),
        ([{"type": "function", "function": {"name": "has space"}}], "1-64 letters"),
        ([{"type": "function", "function": {"name": "f", "paramters": {}}}], "unknown key 'paramters'"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            "of type object",
        ),
        (
            [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "propertis": {}}},
                }
            ],
            "tools[0].function.parameters: not a JSON Schema keyword: #/propertis",
        ),
        ([WEATHER, WEATHER], "unique: get_weather"),
        ("get_weather", "must be a list"),
    ],
)
def test_bad_tools_are_refused_naming_what(tools: object, says: str) -> None:
    with pytest.raises(ToolError, match=None) as err:
        parse_tools(tools)  # type: ignore[arg-type]
    assert says in str(err.value)


def test_tool_choice() -> None:
    tools = parse_tools([WEATHER])
    assert parse_tool_choice(None, tools) == ToolChoice("auto")
    assert parse_tool_choice(None, ()) == ToolChoice("none")
    named = {"type": "function", "function": {"name": "get_weather"}}
    assert parse_tool_choice(named, tools) == ToolChoice("function", "get_weather")
    for bad in ({"type": "function", "function": {"name": "other"}}, "always", {"type": "tool"}):
        with pytest.raises(ToolError):
            parse_tool_choice(bad, tools)
    with pytest.raises(ToolError, match="needs tools"):
        parse_tool_choice("required", ())


def test_each_choice_is_a_grammar_the_engine_takes() -> None:
    for mode, name in (("auto", None), ("required", None), ("function", "add"), ("none", None)):
        g = plan(mode, name).grammar()
        assert g is not None and g.kind == "lark"
    named = plan("function", "add").grammar()
    assert named is not None and '\\"name\\": \\"add\\"' in named.source and "get_weather" not in named.source
    # auto with a response_format: a text answer must match the schema
    answer = Grammar.json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})
    both = plan("auto").grammar(answer)
    assert both is not None and '"x"' in both.source
    with pytest.raises(ToolError):
        plan("auto").grammar(Grammar("regex", "a+"))


WRITTEN = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.mark.parametrize("size", [1, 2, 3, 5, 11, len(WRITTEN)])
def test_calls_read_out_of_any_split(size: int) -> None:
    splitter = CallSplitter(plan())
    items = []
    for at in range(0, len(WRITTEN), size):
        items += splitter.feed(WRITTEN[at : at + size])
    items += splitter.finish()
    text = "".join(i for i in items if isinstance(i, str))
    calls = [i for i in items if isinstance(i, ToolCall)]
    assert text == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_a_call_cut_short_or_unknown_stays_text() -> None:
    cut = '<tool_call>\n{"name": "get_weather", "argu'
    assert plan().split(cut) == (cut, [])
    unknown = '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'
    assert plan().split(unknown) == (unknown, [])
    assert plan().split("a < b <tool") == ("a < b <tool", [])  # a marker's start that never became one


def test_none_renders_tools_but_reads_no_calls() -> None:
    p = plan("none")
    assert p.split(WRITTEN) == (WRITTEN, [])
    msgs = p.messages([{"role": "user", "content": "hi"}])
    assert msgs[0]["role"] == "system" and "get_weather" in msgs[0]["content"]


def test_history_calls_and_results_for_a_template_without_tools() -> None:
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"t": 3}'},
    ]
    out = plan().messages(history)
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    }
    assert out[3] == {"role": "user", "content": '<tool_response>\n{"t": 3}\n</tool_response>'}
    bad = [history[0], {**history[1], "tool_calls": [{"function": {"name": "f", "arguments": "{not json"}}]}]
    with pytest.raises(ToolError, match="not JSON"):
        plan().messages(bad)


def test_models_that_cannot_call_are_refused() -> None:
    from edge.models.chat_template import ChatTemplate
    from edge.tools import plan_tools

    with pytest.raises(ToolError, match="base model"):
        plan_tools(None, None, [WEATHER])  # type: ignore[arg-type]
    other = ChatTemplate("{% if tools %}[TOOLS]{{ tools | tojson }}{% endif %}{{ messages[0].content }}")
    with pytest.raises(ToolError, match="syntax edge does not parse"):
        plan_tools(other, None, [WEATHER])  # type: ignore[arg-type]
    assert plan_tools(None, None, None) is None  # no tools: nothing to plan, any model


FENCED = '```json\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```'


@pytest.mark.parametrize("size", [1, 4, len(FENCED)])
def test_a_fenced_call_opening_an_auto_answer_is_a_call(size: int) -> None:
    splitter = CallSplitter(plan("auto"))
    items = [x for at in range(0, len(FENCED), size) for x in splitter.feed(FENCED[at : at + size])]
    items += splitter.finish()
    assert [(c.name, c.arguments) for c in items if isinstance(c, ToolCall)] == [
        ("get_weather", '{"city": "Oslo"}')
    ]
    assert not [x for x in items if isinstance(x, str)]
    later = "Here it is:\n" + FENCED  # not at the start: text (auto's grammar lets text spell it)
    assert plan("auto").split(later) == (later, [])
    assert plan("required").split(FENCED) == (FENCED, [])  # required's grammar writes <tool_call> only


def test_an_argument_may_spell_the_close_marker() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a</tool_call>b"}}\n</tool_call>'
    content, calls = plan("required").split(text)
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "a</tool_call>b"})
    ]


def test_stop_strings_are_refused_with_tools() -> None:
    from edge.generate import GenerationConfig

    with pytest.raises(ToolError, match="stop strings"):
        plan("required").constrain(GenerationConfig(stop=("\n",)))
    assert plan("none").constrain(GenerationConfig(stop=("\n",))).stop == ("\n",)  # text only: stops apply
    assert plan("auto").constrain(GenerationConfig()).grammar is not None


def test_history_calls_are_objects_for_the_template_without_tools_this_turn() -> None:
    from edge.tools import template_messages

    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
    out = template_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert out[0]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
