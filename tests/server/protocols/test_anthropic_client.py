"""Anthropic's Messages API through the real `anthropic` client, unchanged: create and stream (the same text),
a system prompt, tools with tool_choice tool and any (a valid call every time, sampled), a tool round trip,
count_tokens, the x-api-key header, and Anthropic's error shape."""

from __future__ import annotations

import anthropic
import httpx
import jsonschema
import pytest

from edge.server import Server
from tests.server.protocols.conftest import MODEL, TIME, WEATHER

pytestmark = pytest.mark.slow

TOOLS = [
    {"name": "get_weather", "description": "Get the current weather in a city", "input_schema": WEATHER},
    {"name": "get_time", "description": "The time in a timezone", "input_schema": TIME},
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(protocol_server: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=protocol_server.url, api_key="x", max_retries=0, timeout=120)


def test_create_and_stream_agree(client: anthropic.Anthropic) -> None:
    kwargs = {
        "model": MODEL,
        "max_tokens": 16,
        "extra_body": {"temperature": 0.0},
        "system": "You answer in one sentence.",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
    }
    msg = client.messages.create(**kwargs)
    assert msg.role == "assistant" and msg.content[0].type == "text" and msg.content[0].text
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens > 0
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == msg.content[0].text
    assert final.stop_reason == msg.stop_reason and final.usage.output_tokens == msg.usage.output_tokens
    counted = client.messages.count_tokens(model=MODEL, system=kwargs["system"], messages=kwargs["messages"])
    assert counted.input_tokens == msg.usage.input_tokens


def test_tool_choice_tool_and_any(client: anthropic.Anthropic) -> None:
    # sampled at T=1 (Anthropic's default): the mask keeps each call valid
    for choice, allowed in (
        ({"type": "tool", "name": "get_time", "disable_parallel_tool_use": True}, {"get_time"}),
        ({"type": "any", "disable_parallel_tool_use": True}, {"get_weather", "get_time"}),
    ):
        msg = client.messages.create(
            model=MODEL, max_tokens=60, messages=ASK, tools=TOOLS, tool_choice=choice
        )
        uses = [b for b in msg.content if b.type == "tool_use"]
        assert uses and msg.stop_reason == "tool_use", msg
        assert uses[0].name in allowed and uses[0].id.startswith("toolu_")
        schema = WEATHER if uses[0].name == "get_weather" else TIME
        jsonschema.validate(uses[0].input, schema)


def test_tool_round_trip_streamed(client: anthropic.Anthropic) -> None:
    with client.messages.stream(
        model=MODEL,
        max_tokens=60,
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
    ) as stream:
        first = stream.get_final_message()
    use = next(b for b in first.content if b.type == "tool_use")
    jsonschema.validate(use.input, WEATHER)
    history = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "21 degrees, sunny"}],
        },
    ]
    answer = client.messages.create(
        model=MODEL,
        max_tokens=16,
        messages=history,
        tools=TOOLS,
        tool_choice={"type": "none"},
        extra_body={"temperature": 0.0},
    )
    assert answer.content[0].type == "text" and answer.content[0].text
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert answer.usage.input_tokens > first.usage.input_tokens


def test_errors_and_api_key(protocol_server: Server, client: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as info:
        client.messages.create(model="no-such-model", max_tokens=8, messages=ASK)
    assert "no-such-model" in str(info.value)
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "aGk="},
                        }
                    ],
                }
            ],
        )
    assert "image" in str(bad.value)
    r = httpx.post(protocol_server.url + "/v1/messages", json={"model": MODEL, "messages": ASK})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert (
        r.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in r.json()["error"]["message"]
    )
