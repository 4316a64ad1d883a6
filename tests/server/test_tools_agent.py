"""Tool calls as apps make them (issue 48), through `edge serve` under tool_choice auto with an app's system
message: pydantic-ai's Agent (the real framework, its own requests and tool loop) calls its tool and answers
after the result on qwen2.5-coder-1.5b; qwen2.5-coder-0.5b, which writes its call as bare JSON without the
<tool_call> tags, gets a call back through the `openai` client, streamed and not, nothing of it in content."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic_ai import Agent, UsageLimits
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import edge
from edge.server import Server

pytestmark = pytest.mark.slow
SMALL, BIG = "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"
INSTRUCTIONS = "Use the tool to answer, then answer in one sentence."
QUESTION = "What is the stock price of ACME?"
STOCK = {
    "type": "function",
    "function": {
        "name": "stock_price",
        "description": "The current stock price of a ticker.",
        "parameters": {
            "type": "object",
            "properties": {"ticker": {"type": "string"}},
            "required": ["ticker"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def server(edge_cache: Path) -> Iterator[Server]:
    started: Server = edge.serve(
        models=[SMALL, BIG], port=0, block=False, backend="llamacpp", n_threads=2, n_ctx=2048, grace_s=1.0
    )
    yield started
    started.stop()


def test_pydantic_ai_agent_calls_its_tool_and_answers_after_the_result(server: Server) -> None:
    provider = OpenAIProvider(base_url=server.url + "/v1", api_key="x")
    agent = Agent(OpenAIChatModel(BIG, provider=provider), instructions=INSTRUCTIONS)
    asked: list[str] = []

    @agent.tool_plain
    def stock_price(ticker: str) -> str:
        """The current stock price of a ticker."""
        asked.append(ticker)
        return f"{ticker} trades at 123.45 USD."

    run = agent.run_sync(
        QUESTION, model_settings={"temperature": 0}, usage_limits=UsageLimits(request_limit=3)
    )
    assert asked == ["ACME"]
    calls = [p for m in run.all_messages() for p in getattr(m, "parts", []) if isinstance(p, ToolCallPart)]
    assert [(c.tool_name, c.args_as_dict()) for c in calls] == [("stock_price", {"ticker": "ACME"})]
    assert isinstance(run.output, str) and "123.45" in run.output, run.output


def streamed(stream: Any) -> tuple[str, list[tuple[str, str]], str | None]:
    text, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            name, args = calls.get(d.index, ("", ""))
            calls[d.index] = (name + (d.function.name or ""), args + (d.function.arguments or ""))
        finish = choice.finish_reason or finish
    return text, [calls[i] for i in sorted(calls)], finish


def test_a_bare_json_call_of_the_small_model_is_a_call_streamed_and_not(server: Server) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    messages = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": QUESTION}]
    ask = {"model": SMALL, "messages": messages, "tools": [STOCK], "temperature": 0, "max_tokens": 60}
    done = client.chat.completions.create(**ask)
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "tool_calls" and not message.content, message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []] == [
        ("stock_price", {"ticker": "ACME"})
    ]
    text, calls, finish = streamed(client.chat.completions.create(**ask, stream=True))
    assert text == "" and finish == "tool_calls"
    assert [(n, json.loads(a)) for n, a in calls] == [("stock_price", {"ticker": "ACME"})]
