"""OpenAI's Responses API through the real `openai` client, unchanged: create and stream (the same text, the
events in order), instructions, function tools with tool_choice required (a valid call, sampled), a round trip
with function_call_output items, `text.format` via `responses.parse`, and previous_response_id refused."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from pydantic import BaseModel

from edge.server import Server
from tests.server.protocols.conftest import MODEL, TIME, WEATHER

pytestmark = pytest.mark.slow

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": WEATHER,
    },
    {"type": "function", "name": "get_time", "description": "The time in a timezone", "parameters": TIME},
]


class City(BaseModel):
    name: str
    country: str


@pytest.fixture(scope="module")
def client(protocol_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=protocol_server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def test_create_and_stream_agree(client: openai.OpenAI) -> None:
    kwargs = {
        "model": MODEL,
        "input": "What is the capital of France?",
        "instructions": "Answer in one sentence.",
        "max_output_tokens": 24,
        "temperature": 0.0,
    }
    resp = client.responses.create(**kwargs)
    assert resp.status in ("completed", "incomplete") and resp.output_text
    assert resp.usage is not None and resp.usage.output_tokens > 0
    kinds = []
    with client.responses.stream(**kwargs) as stream:
        for event in stream:
            kinds.append(event.type)
        final = stream.get_final_response()
    assert final.output_text == resp.output_text
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds and "response.output_item.done" in kinds


def test_function_tools_required(client: openai.OpenAI) -> None:
    ask = "What is the weather in Paris?"
    # sampled at T=1: the mask keeps the call valid
    resp = client.responses.create(model=MODEL, input=ask, tools=TOOLS, tool_choice="required")
    calls = [o for o in resp.output if o.type == "function_call"]
    assert calls, resp.output
    schema = WEATHER if calls[0].name == "get_weather" else TIME
    jsonschema.validate(json.loads(calls[0].arguments), schema)
    named = client.responses.create(
        model=MODEL, input=ask, tools=TOOLS, tool_choice={"type": "function", "name": "get_weather"}
    )
    call = next(o for o in named.output if o.type == "function_call")
    assert call.name == "get_weather"
    # the round trip, stateless: the call and its output sent back as input items
    items = [
        {"role": "user", "content": ask},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "21 degrees, sunny"},
    ]
    answer = client.responses.create(
        model=MODEL, input=items, tools=TOOLS, tool_choice="none", max_output_tokens=40, temperature=0.0
    )
    assert answer.output_text


def test_streamed_call_and_parse(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model=MODEL, input="Weather in Oslo?", tools=TOOLS, tool_choice="required"
    ) as stream:
        final = stream.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert calls and calls[0].name in ("get_weather", "get_time")
    parsed = client.responses.parse(model=MODEL, input="Name a city in Japan.", text_format=City)
    assert isinstance(parsed.output_parsed, City)


def test_previous_response_id_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_123")
    assert "previous_response_id" in str(info.value) and "stores no responses" in str(info.value)
