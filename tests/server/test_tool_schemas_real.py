"""Schemas as clients send them, through `edge serve` with the real `openai` client (issue 45): a tool made by
`openai.pydantic_function_tool` from nested pydantic models with an enum ($defs + $ref inside the call grammar)
with a named and a `required` tool_choice, parsed back by the client; a response_format whose annotation keys
are no JSON Schema keyword answered, the keys named in the response's `edge.notes`. On qwen2.5-coder-0.5b."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pydantic
import pytest

import edge
from edge.server import Server

pytestmark = pytest.mark.slow
MODEL = "qwen2.5-coder-0.5b"
DATA = json.loads((Path(__file__).parents[1] / "data" / "schemas_real_world.json").read_text())
REAL = {name: entry["schema"] for name, entry in DATA.items()}


class Unit(str, enum.Enum):
    celsius = "celsius"
    fahrenheit = "fahrenheit"


class Place(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    unit: Unit


class Forecast(pydantic.BaseModel):
    """The weather forecast for some places."""

    places: list[Place] = pydantic.Field(min_length=1, max_length=2)


@pytest.fixture(scope="module")
def client(edge_cache: Path) -> Iterator[openai.OpenAI]:
    server: Server = edge.serve(
        models=[MODEL], port=0, block=False, backend="llamacpp", n_threads=2, n_ctx=2048, grace_s=1.0
    )
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    server.stop()


@pytest.mark.parametrize("choice", ["named", "required"])
def test_pydantic_function_tool_with_nested_models_and_enums(client: openai.OpenAI, choice: str) -> None:
    tool = openai.pydantic_function_tool(Forecast)
    assert "$defs" in tool["function"]["parameters"]  # the shape that failed: $refs into the tool's root
    named = {"type": "function", "function": {"name": "Forecast"}}
    done = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Oslo, in celsius?"}],
        tools=[tool],
        tool_choice=named if choice == "named" else "required",
        temperature=0,
        max_tokens=120,
    )
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls" and message.tool_calls, message
    parsed = message.tool_calls[0].function.parsed_arguments
    assert isinstance(parsed, Forecast) and parsed.places and isinstance(parsed.places[0].unit, Unit)


def test_annotation_keys_are_answered_and_noted(client: openai.OpenAI) -> None:
    schema = REAL["kubernetes-style"]
    done = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A container port for a web server, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "port", "schema": schema}},
        temperature=0.7,
        seed=1,
        max_tokens=80,
    )
    jsonschema.validate(json.loads(done.choices[0].message.content or ""), schema)
    notes = (done.model_extra or {})["edge"]["notes"]
    assert len(notes) == 1 and "#/javaType" in notes[0] and "#/properties/name/readonly" in notes[0]


def test_a_keyword_the_engine_cannot_enforce_is_a_400_naming_it(client: openai.OpenAI) -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    with pytest.raises(openai.BadRequestError, match="uniqueItems"):
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Three numbers."}],
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        )
