"""Constrained output (edge/grammar.py): what a schema may say, the mask, and a generation that must match it.

The guarantee is tested on a tiny random model: its logits know nothing of JSON, so every answer that parses
and validates does so because of the mask alone."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest

import edge
from edge.errors import ConstraintError, GrammarError
from edge.grammar import MAX_GRAMMAR_BYTES, Grammar, compile_grammar, grammar_of
from edge.models.checked import check_model
from tests.tiny_models import TinySpec, write_tiny_model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
        "nick": {"type": ["string", "null"], "maxLength": 4},
    },
    "required": ["name", "age", "tags", "nick"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random llama model: it knows nothing of JSON."""
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", TinySpec(arch="llama"))


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ({"type": "strin"}, "not a valid JSON Schema at type"),
        ({"properties": {"a": {"minLength": -1}}}, "properties/a/minLength"),
        ({"type": "array", "uniqueItems": True}, 'Unimplemented keys: ["uniqueItems"] (at #/uniqueItems)'),
        ({"properties": {"x": {"not": {"type": "string"}}}}, "#/properties/x/not"),
        ({"type": "integer", "minimum": 5, "maximum": 3}, "Unsatisfiable"),
        ({"enum": []}, "Unsatisfiable"),
        ({"anyOf": []}, "not a valid JSON Schema"),
        ({"type": "string", "pattern": "(a|b"}, "regex"),
        (
            {"type": "object", "propertis": {"a": {"type": "integer"}}},
            "not a JSON Schema keyword: #/propertis",
        ),
        ({"properties": {"propertis": {"minimun": 3}}}, "#/properties/propertis/minimun"),
        ({"anyOf": [{"type": "string"}, {"typ": "null"}]}, "#/anyOf/1/typ"),
    ],
)
def test_a_schema_the_engine_cannot_enforce_is_refused_naming_it(schema: dict, needle: str) -> None:
    with pytest.raises(GrammarError) as err:
        Grammar.json_schema(schema)
    assert needle in str(err.value), err.value


def test_extensions_and_annotations_are_keywords() -> None:
    Grammar.json_schema({"type": "string", "title": "t", "x-order": 1, "$comment": "c", "examples": ["a"]})


def test_stop_strings_and_a_schema_do_not_mix() -> None:
    with pytest.raises(GrammarError, match="stop strings cannot be combined"):
        edge.GenerateOptions(stop=("}",), response_format={"type": "json_object"}).config()


def test_a_schema_too_large_is_refused_before_compiling() -> None:
    big = {"enum": [f"value-{i:08d}" for i in range(MAX_GRAMMAR_BYTES // 12)]}
    with pytest.raises(GrammarError, match="larger than"):
        Grammar.json_schema(big)


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ({"type": "yaml"}, "type 'yaml' is not supported"),
        ({"type": "json_schema"}, '"json_schema": {"name"'),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema must be a JSON Schema object"),
        (
            {"type": "json_schema", "json_schema": {"schema": {}, "strictly": True}},
            "unknown keys ['strictly']",
        ),
        ({"type": "json_object", "frob": 1}, "unknown keys ['frob']"),
        ({"type": "text", "json_schema": {}}, "type 'text'"),
        ("json", "is an object, not str"),
    ],
)
def test_response_format_shapes_it_does_not_know_are_errors(value: object, needle: str) -> None:
    with pytest.raises(GrammarError) as err:
        grammar_of(value)  # type: ignore[arg-type]
    assert needle in str(err.value), err.value


def test_response_format_shapes() -> None:
    assert grammar_of({"type": "text"}) is None
    assert grammar_of({"type": "json_object"}) == Grammar.json_object()
    wrapped = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    assert grammar_of(wrapped) == Grammar.json_schema(PERSON)
    assert grammar_of({"type": "json_object", "schema": PERSON}) == Grammar.json_schema(PERSON)


def test_the_mask_admits_exactly_the_schemas_continuations(tiny_model: Path) -> None:
    tok = check_model(tiny_model).tokenizer
    c = compile_grammar(Grammar.json_schema({"enum": ["yes", "no"]}), tok, tok.vocab_size + 7)
    allowed = c.allowed()
    assert allowed.shape == (tok.vocab_size + 7,) and not allowed[tok.vocab_size :].any()
    firsts = {tok.token_bytes(int(i)) for i in np.flatnonzero(allowed)}
    assert firsts and all(b'"yes"'.startswith(f) or b'"no"'.startswith(f) for f in firsts), firsts
    for t in tok.encode('"no"', parse_special=False, continues=True):
        assert c.allowed()[t]
        c.advance(t)
    assert c.done and c.accepting
    with pytest.raises(ConstraintError):  # the engine's state mid-answer: a server error, not the request's
        c.advance(tok.encode("x", parse_special=False)[0])


@pytest.mark.parametrize("backend", ["llamacpp", "ort", "openvino"])
def test_a_random_model_answers_valid_json_only_through_the_mask(
    backend: str, tiny_model: Path, edge_cache: Path
) -> None:
    with edge.load(str(tiny_model), backend=backend, draft="none", n_ctx=512) as m:
        for seed in range(4):
            r = m.generate(
                "x", response_format=Grammar.json_schema(PERSON), temperature=0.7, seed=seed, max_tokens=200
            )
            assert r.stats.stop_reason == "grammar", (r.text, r.stats.stop_reason)
            jsonschema.validate(json.loads(r.text), PERSON)
        obj = m.generate(
            "x", response_format={"type": "json_object"}, temperature=0.7, seed=1, max_tokens=200
        )
        if obj.stats.stop_reason == "grammar":
            assert isinstance(json.loads(obj.text), dict)
        else:  # cut inside the value: the client is told it is incomplete
            assert obj.stats.stop_reason == "length" and obj.stats.n_tokens == 200


def test_max_tokens_inside_the_value_is_length(tiny_model: Path, edge_cache: Path) -> None:
    with edge.load(str(tiny_model), backend="llamacpp", draft="none", n_ctx=256) as m:
        r = m.generate("x", response_format=Grammar.json_schema(PERSON), max_tokens=3)
    assert r.stats.stop_reason == "length" and r.stats.n_tokens == 3
    with pytest.raises(ValueError):
        json.loads(r.text)
