"""Schemas as clients send them (edge/schemas.py): annotation keys that are no keyword accepted and noted,
draft-04's spellings read as 2020-12's, $refs resolved where a tool's parameters sit inside the call grammar,
and what constrains but cannot be enforced still refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import llguidance
import pytest

from edge.errors import GrammarError, ToolError
from edge.grammar import Grammar
from edge.tools import CallSyntax, ToolChoice, ToolPlan, parse_tools

# each entry: its source, license and schema; the four below are hand-made in the shapes clients send
DATA = json.loads((Path(__file__).parents[1] / "data" / "schemas_real_world.json").read_text())
REAL = {name: entry["schema"] for name, entry in DATA.items()}
NOTED = {
    "schemastore-draft04": ["#/id"],
    "kubernetes-style": [
        "#/javaType",
        "#/x-kubernetes-group-version-kind",
        "#/properties/protocol/x-kubernetes-list-type",
        "#/properties/name/readonly",
    ],
    "form-ui": ["#/preferredOrder", "#/properties/title/x-ui-widget"],
    "pydantic-nested": [],
}
VALID = {
    "schemastore-draft04": {"level": "info", "port": 8080, "name": "svc"},
    "kubernetes-style": {"containerPort": 80, "protocol": "TCP"},
    "form-ui": {"title": "milk", "done": False},
    "pydantic-nested": {"places": [{"city": "Oslo", "unit": "celsius"}]},
}


def matches(grammar: Grammar, value: object) -> bool:
    """Whether llguidance's compiled grammar admits `value` as written by edge (", " and ": ")."""
    text = json.dumps(value, separators=(", ", ": "))
    lark = llguidance.LLMatcher.grammar_from_lark(grammar.source) if grammar.kind == "lark" else None
    source = lark or llguidance.LLMatcher.grammar_from_json_schema(
        grammar.schema(),
        overrides={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
    )
    return llguidance.LLMatcher.validate_grammar(source) == "" and _admits(source, text)


def _admits(source: str, text: str) -> bool:
    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), n_vocab=257, eos_token=[256])
    matcher = llguidance.LLMatcher(tok, source, log_level=0)
    return all(matcher.consume_token(b) for b in text.encode()) and matcher.is_accepting()


class _Bytes:
    """A byte vocabulary, what llguidance's TokenizerWrapper reads."""

    def __init__(self) -> None:
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff<eos>"]
        self.special_token_ids = [256]
        self.eos_token_id = 256
        self.bos_token_id = None

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


@pytest.mark.parametrize("name", sorted(NOTED))
def test_real_world_schemas_are_read_with_their_annotations_noted(name: str) -> None:
    grammar = Grammar.json_schema(REAL[name])
    noted = NOTED[name]
    assert len(grammar.notes) == (1 if noted else 0)
    for path in noted:
        assert path in grammar.notes[0]
    jsonschema.validate(VALID[name], REAL[name])
    assert matches(grammar, VALID[name])


def test_draft04_spellings_are_understood() -> None:
    grammar = Grammar.json_schema(REAL["schemastore-draft04"])
    port = grammar.schema()["definitions"]["port"]
    assert port == {"type": "integer", "exclusiveMinimum": 0, "maximum": 65535}
    assert not matches(grammar, {"level": "info", "port": 0, "name": "svc"})  # exclusive: 0 is out
    assert not matches(grammar, {"level": "loud", "port": 1, "name": "svc"})  # the $ref'd enum holds


def test_a_draft07_tuple_is_read_as_prefix_items() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": [{"type": "string"}, {"type": "integer"}],
        "additionalItems": False,
    }
    grammar = Grammar.json_schema(schema)
    assert grammar.schema() == {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer"}],
        "items": False,
    }
    assert matches(grammar, ["a", 1]) and not matches(grammar, ["a", 1, 2]) and not matches(grammar, [1])


def test_a_format_the_engine_does_not_know_is_an_annotation_noted() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "string", "format": "byte"}}, "required": ["b"]}
    grammar = Grammar.json_schema(schema)
    assert grammar.notes == (
        "formats the engine does not enforce, read as annotations: #/properties/b/format (byte)",
    )
    assert matches(grammar, {"b": "anything"})
    kept = Grammar.json_schema({"type": "string", "format": "date"})  # one it enforces stays
    assert not kept.notes and not matches(kept, "soon") and matches(kept, "2026-12-07")


def test_dependencies_are_read_as_the_any_of_they_mean() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "string"}},
        "dependencies": {"a": ["b"], "c": {"required": ["a"]}, "b": []},
        "additionalProperties": False,
    }
    grammar = Grammar.json_schema(schema)
    for value in ({}, {"b": 1}, {"a": 1, "b": 2}, {"a": 1, "b": 2, "c": "x"}, {"a": 1}, {"c": "x"}):
        ok = jsonschema.Draft7Validator(schema).is_valid(value)
        assert matches(grammar, value) == ok, value


def test_a_one_of_proven_disjoint_is_an_any_of_and_an_overlapping_one_stays_refused() -> None:
    schema = {
        "$defs": {"name": {"type": "string", "minLength": 1}},
        "type": "object",
        "properties": {
            "watch": {
                "oneOf": [{"$ref": "#/$defs/name"}, {"type": "array", "items": {"$ref": "#/$defs/name"}}]
            },
            "run": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"ps": {"type": "string"}},
                        "required": ["ps"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {"sh": {"type": "string"}},
                        "required": ["sh"],
                        "additionalProperties": False,
                    },
                ]
            },
            "size": {"oneOf": [{"type": "string", "pattern": "^[0-9]+$"}, {"const": "any"}]},
        },
    }
    grammar = Grammar.json_schema(schema)
    assert "oneOf" not in json.dumps(grammar.schema())
    for value in (
        {"watch": "a", "run": {"ps": "x"}, "size": "any"},
        {"watch": ["a"], "run": {"sh": "y"}, "size": "12"},
    ):
        assert matches(grammar, value), value
    assert not matches(grammar, {"run": {"ps": "x", "sh": "y"}})
    overlapping = {"type": "object", "oneOf": [{"required": ["files"]}, {"required": ["folder"]}]}
    with pytest.raises(GrammarError, match="oneOf"):
        Grammar.json_schema(overlapping)  # {"files": .., "folder": ..} matches both: no anyOf says that


def test_an_ecma_named_group_in_a_pattern_is_read() -> None:
    grammar = Grammar.json_schema({"type": "string", "pattern": "^(?<major>[0-9]+)[.](?<minor>[0-9]+)$"})
    assert matches(grammar, "1.2") and not matches(grammar, "1.x")


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ({"type": "object", "propertis": {}}, "#/propertis (did you mean 'properties'?)"),
        ({"type": "object", "Required": ["a"]}, "#/Required (did you mean 'required'?)"),
        ({"type": "array", "uniqueItems": True}, 'Unimplemented keys: ["uniqueItems"] (at #/uniqueItems)'),
        ({"type": "object", "x-guidance": {"lenient": True}, "uniqueItems": True}, "uniqueItems"),
    ],
)
def test_what_constrains_and_is_not_enforced_stays_refused(schema: dict, needle: str) -> None:
    with pytest.raises(GrammarError) as err:
        Grammar.json_schema(schema)
    assert needle in str(err.value), err.value


def test_a_tools_refs_resolve_inside_the_call_grammar() -> None:
    """openai's pydantic_function_tool on a model with a nested enum: $defs at the parameters' root, which
    the call grammar embeds (named and required choices compiled, a valid call admitted)."""
    tool = {"type": "function", "function": {"name": "forecast", "parameters": REAL["pydantic-nested"]}}
    tools = parse_tools([tool])
    call = {"name": "forecast", "arguments": VALID["pydantic-nested"]}
    text = "<tool_call>\n" + json.dumps(call, separators=(", ", ": ")) + "\n</tool_call>"
    for choice in (ToolChoice("required"), ToolChoice("function", "forecast")):
        grammar = ToolPlan(tools, choice, CallSyntax(), native=True).grammar()
        assert grammar is not None and _admits(llguidance.LLMatcher.grammar_from_lark(grammar.source), text)


def test_a_tools_annotation_keys_are_noted_and_misspellings_refused() -> None:
    params = dict(REAL["kubernetes-style"])
    plan = ToolPlan(
        parse_tools([{"type": "function", "function": {"name": "port", "parameters": params}}]),
        ToolChoice("auto"),
        CallSyntax(),
        native=True,
    )
    assert len(plan.notes) == 1 and plan.notes[0].startswith("tool port: ") and "#/javaType" in plan.notes[0]
    bad = {"type": "object", "properties": {"a": {"type": "integer", "minimun": 1}}}
    with pytest.raises(ToolError, match="minimun"):
        parse_tools([{"type": "function", "function": {"name": "f", "parameters": bad}}])
