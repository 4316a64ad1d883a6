"""`response_format` through `edge serve` with the real `openai` client, on a tiny random model: whatever it
answers parses and validates, streamed or not, on chat and completions, because the mask allows nothing else."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from edge.server import Server
from tests.server.test_openai_client import HI, client

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "rank": {"type": "integer", "minimum": 1, "maximum": 9},
        "kind": {"enum": ["capital", "port"]},
    },
    "required": ["city", "rank", "kind"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}


def test_chat_json_schema_streamed_and_not(server: Server) -> None:
    c = client(server)
    for seed in range(3):
        r = c.chat.completions.create(
            model="tiny.gguf", messages=HI, response_format=FORMAT, temperature=0.7, seed=seed, max_tokens=120
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        jsonschema.validate(json.loads(choice.message.content or ""), SCHEMA)
        stream = c.chat.completions.create(
            model="tiny.gguf",
            messages=HI,
            response_format=FORMAT,
            temperature=0.7,
            seed=seed,
            max_tokens=120,
            stream=True,
        )
        chunks = [ch for ch in stream if ch.choices]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert text == choice.message.content  # the same seed samples the same masked distribution


def test_completions_take_response_format_too(server: Server) -> None:
    c = client(server)
    r = c.completions.create(
        model="tiny.gguf",
        prompt="x",
        max_tokens=120,
        temperature=0.7,
        seed=3,
        extra_body={"response_format": FORMAT},
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)


def test_json_object(server: Server) -> None:
    r = client(server).chat.completions.create(
        model="tiny.gguf",
        messages=HI,
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=300,
    )
    choice = r.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content or ""), dict)
    else:  # a random model may never close it: cut, and said so
        assert choice.finish_reason == "length" and r.usage is not None and r.usage.completion_tokens == 300


def test_max_tokens_inside_the_value_is_length(server: Server) -> None:
    r = client(server).chat.completions.create(
        model="tiny.gguf", messages=HI, response_format=FORMAT, max_tokens=3
    )
    assert r.choices[0].finish_reason == "length"
    with pytest.raises(ValueError):
        json.loads(r.choices[0].message.content or "")


@pytest.mark.parametrize(
    ("schema", "needle"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "objet"}, "not a valid JSON Schema at type"),
        ({"type": "integer", "minimum": 3, "maximum": 1}, "Unsatisfiable"),
    ],
)
def test_a_schema_it_cannot_enforce_is_a_400(server: Server, schema: dict, needle: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            client(server).chat.completions.create(
                model="tiny.gguf",
                messages=HI,
                response_format=fmt,
                stream=stream,  # type: ignore[call-overload]
            )
        assert err.value.param == "response_format" and needle in err.value.message, err.value.message
