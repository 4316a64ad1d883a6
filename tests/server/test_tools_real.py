"""Tool calls through `edge serve` with the real `openai` client: `required` and a named function always give a
valid call of an allowed function (its arguments validate against its schema), sampled at temperature 0.7;
`none` never calls; a call -> tool result -> answer round trip works, streamed and not. On qwen2.5-coder-0.5b
(its template renders tools) and smollm2-135m (no tools branch: edge's own tools prompt), both on ort, and
qwen2.5-coder-1.5b on llamacpp (the round trip needs a model that reads a tool's result)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

import edge
from edge.server import Server

pytestmark = pytest.mark.slow
DATA = Path(__file__).parents[1] / "data"
TOOLS = json.loads((DATA / "tools.json").read_text())
CASES = json.loads((DATA / "tool_cases.json").read_text())
MODELS = ("qwen2.5-coder-0.5b", "smollm2-135m")
BIG = "qwen2.5-coder-1.5b"


def tools_of(names: list[str]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, **TOOLS[n]}} for n in names]


@pytest.fixture(scope="module")
def client(edge_cache: Path) -> Iterator[openai.OpenAI]:
    server: Server = edge.serve(
        models=list(MODELS), port=0, block=False, backend="ort", n_threads=2, n_ctx=2048, grace_s=1.0
    )
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    server.stop()


@pytest.fixture(scope="module")
def big(edge_cache: Path) -> Iterator[openai.OpenAI]:
    server: Server = edge.serve(
        models=[BIG], port=0, block=False, backend="llamacpp", n_threads=2, n_ctx=2048, grace_s=1.0
    )
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    server.stop()


def check_call(call: Any, allowed: list[str]) -> dict[str, Any]:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in allowed, call
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, TOOLS[call.function.name]["parameters"])
    return args


def streamed(stream: Any) -> tuple[str, list[dict[str, str]], str | None]:
    """A stream's content, its calls (name, arguments) by index and its finish reason."""
    text, calls, finish = "", {}, None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        for d in choice.delta.tool_calls or []:
            call = calls.setdefault(d.index, {"name": "", "arguments": "", "id": d.id})
            call["name"] += d.function.name or ""
            call["arguments"] += d.function.arguments or ""
        finish = choice.finish_reason or finish
    return text, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("model", MODELS)
def test_required_and_named_give_valid_calls(client: openai.OpenAI, model: str) -> None:
    for seed, case in enumerate(CASES):
        tools = tools_of(case["tools"])
        named = {"type": "function", "function": {"name": case["expect"]}}
        choices = (("required", case["tools"]), (named, [case["expect"]]))
        for choice, allowed in choices[: 1 + seed % 2]:  # named on every other case
            r = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": case["ask"]}],
                tools=tools,  # type: ignore[arg-type]
                tool_choice=choice,  # type: ignore[arg-type]
                temperature=0.7,
                seed=seed,
                max_tokens=200,
            )
            out = r.choices[0]
            assert out.finish_reason == "tool_calls", (case, out)
            assert out.message.tool_calls and len(out.message.tool_calls) == 1  # parallel_tool_calls off
            check_call(out.message.tool_calls[0], allowed)
            assert not out.message.content  # nothing but the call


def test_streamed_calls_match_the_whole_answer(client: openai.OpenAI) -> None:
    for seed, case in enumerate(CASES[:4]):
        kwargs: dict[str, Any] = dict(
            model=MODELS[0],
            messages=[{"role": "user", "content": case["ask"]}],
            tools=tools_of(case["tools"]),
            tool_choice="required",
            temperature=0.7,
            seed=seed,
            max_tokens=200,
        )
        whole = client.chat.completions.create(**kwargs).choices[0]
        text, calls, finish = streamed(client.chat.completions.create(stream=True, **kwargs))
        assert finish == "tool_calls" and text == ""
        assert whole.message.tool_calls is not None
        assert [(c["name"], c["arguments"]) for c in calls] == [
            (c.function.name, c.function.arguments) for c in whole.message.tool_calls
        ]


def test_parallel_calls_when_asked(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODELS[0],
        messages=[{"role": "user", "content": "What's the weather in Paris and in Rome?"}],
        tools=tools_of(["get_weather"]),  # type: ignore[arg-type]
        tool_choice="required",
        parallel_tool_calls=True,
        temperature=0,
        max_tokens=120,
    )
    out = r.choices[0]
    calls = out.message.tool_calls or []
    # every call that came out is complete and valid; one cut by max_tokens stays text and says "length"
    assert calls and all(check_call(c, ["get_weather"]) for c in calls)
    assert out.finish_reason in ("tool_calls", "length")
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("model", MODELS)
def test_none_never_calls_and_auto_calls_validly(client: openai.OpenAI, model: str) -> None:
    for seed, case in enumerate(CASES[:4]):
        for choice in ("none", "auto"):
            r = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": case["ask"]}],
                tools=tools_of(case["tools"]),  # type: ignore[arg-type]
                tool_choice=choice,  # type: ignore[arg-type]
                temperature=0.7,
                seed=seed,
                max_tokens=120,
            )
            out = r.choices[0]
            if choice == "none" or not out.message.tool_calls:
                assert not out.message.tool_calls and out.finish_reason in ("stop", "length")
                assert out.message.content and "<tool_call>" not in out.message.content
            else:
                assert out.finish_reason == "tool_calls"
                for call in out.message.tool_calls:
                    check_call(call, case["tools"])


def test_llamacpp_calls_are_valid_too(big: openai.OpenAI) -> None:
    for seed, case in enumerate(CASES[1::2]):  # half the set: the 1.5b's steps are the suite's slowest
        r = big.chat.completions.create(
            model=BIG,
            messages=[{"role": "user", "content": case["ask"]}],
            tools=tools_of(case["tools"]),  # type: ignore[arg-type]
            tool_choice="required",
            temperature=0.7,
            seed=seed,
            max_tokens=200,
        )
        out = r.choices[0]
        assert out.finish_reason == "tool_calls" and out.message.tool_calls, (case, out)
        check_call(out.message.tool_calls[0], case["tools"])


@pytest.mark.parametrize("stream", [False, True])
def test_round_trip_call_result_answer(big: openai.OpenAI, stream: bool) -> None:
    client = big
    tools = tools_of(["get_weather"])
    messages: list[Any] = [
        {"role": "user", "content": "What's the weather in Paris? Answer in one sentence."}
    ]
    first = client.chat.completions.create(
        model=BIG,
        messages=messages,
        tools=tools,
        tool_choice="required",
        max_tokens=80,  # type: ignore[arg-type]
    ).choices[0]
    assert first.message.tool_calls
    call = first.message.tool_calls[0]
    messages.append(first.message.model_dump(exclude_none=True))
    result = {"city": "Paris", "temperature": 21, "unit": "celsius", "sky": "sunny"}
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    kwargs: dict[str, Any] = dict(
        model=BIG, messages=messages, tools=tools, tool_choice="auto", max_tokens=60, temperature=0
    )
    if stream:
        text, calls, finish = streamed(client.chat.completions.create(stream=True, **kwargs))
    else:
        out = client.chat.completions.create(**kwargs).choices[0]
        text, calls, finish = out.message.content or "", out.message.tool_calls or [], out.finish_reason
    assert not calls and finish in ("stop", "length")
    assert "21" in text, text  # the answer reads the tool's result from the history


def test_tool_errors_are_400s_naming_tools(client: openai.OpenAI) -> None:
    bad = [
        {
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"type": "object", "propertis": {}}},
                }
            ]
        },
        {"tools": tools_of(["add"]), "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        {"tools": tools_of(["add", "add"])},
    ]
    for extra in bad:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=MODELS[0], messages=[{"role": "user", "content": "hi"}], max_tokens=4, **extra
            )
        assert err.value.body["param"] == "tools", err.value.body  # type: ignore[index]


def test_the_tool_loop_example_runs(big: openai.OpenAI, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    path = Path(__file__).parents[2] / "examples" / "tool_loop.py"
    spec = importlib.util.spec_from_file_location("tool_loop", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    text = example.answer(big, BIG, "What's the weather in Paris? Answer in one sentence.")
    assert text.strip() and "<tool_call>" not in text
    assert 'called get_weather({"city": "Paris"})' in capsys.readouterr().out
