"""A tool-calling loop with the `openai` client against `edge serve`: the model asks for a function, this script
runs it, sends the result back, and prints the model's answer.

    edge serve qwen2.5-coder-1.5b &            # or: python examples/tool_loop.py --serve qwen2.5-coder-1.5b
    python examples/tool_loop.py --base-url http://127.0.0.1:8080/v1 "What's the weather in Paris and Oslo?"
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import openai

WEATHER = {
    "paris": {"city": "Paris", "temperature": 21, "unit": "celsius", "sky": "sunny"},
    "oslo": {"city": "Oslo", "temperature": -3, "unit": "celsius", "sky": "snow"},
}


def get_weather(city: str) -> dict[str, Any]:
    """A stand-in for a real service."""
    return WEATHER.get(city.strip().lower(), {"error": f"no data for {city}"})


FUNCTIONS: dict[str, Callable[..., Any]] = {"get_weather": get_weather}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


def answer(client: openai.OpenAI, model: str, question: str, max_rounds: int = 4) -> str:
    """Ask; while the model calls tools, run them and send back their results; return its text answer."""
    messages: list[Any] = [{"role": "user", "content": question}]
    for round_ in range(max_rounds):
        # the first round must call (a 1.5B model left to "auto" often writes its call as prose); then "auto":
        # the model answers from the results or calls again
        choice = "required" if round_ == 0 else "auto"
        r = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, tool_choice=choice, max_tokens=200, temperature=0
        )  # type: ignore[arg-type]
        message = r.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            result = FUNCTIONS[call.function.name](**json.loads(call.function.arguments))
            print(f"  called {call.function.name}({call.function.arguments}) -> {json.dumps(result)}")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    raise RuntimeError(f"no answer after {max_rounds} rounds of tool calls")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="What's the weather in Paris? Answer in one sentence.")
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--serve", metavar="MODEL", help="start edge serve on MODEL in this process first")
    args = parser.parse_args(argv)
    server = None
    if args.serve:
        import edge

        server = edge.serve(args.serve, port=0, block=False)
        args.base_url, args.model = server.url + "/v1", args.serve
    try:
        client = openai.OpenAI(base_url=args.base_url, api_key="none")
        print(answer(client, args.model, args.question))
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
