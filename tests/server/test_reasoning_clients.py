"""Reasoning through the real server and the real `openai` and `ollama` clients, on a tiny Qwen3-shaped GGUF
with Qwen3's real chat template. Its random weights never close a think block by themselves, so the answers
that must end are made to: a thinking budget forces the close, a schema constrains what follows it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import ollama
import openai
import pytest

from edge.server import Server
from tests.edge.test_reasoning import qwen3_spec
from tests.tiny_models import write_tiny_model

MODEL = "qwen3-tiny.gguf"
HI = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
FORMAT = {"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("serve-qwen3") / MODEL, qwen3_spec())


@pytest.fixture
def qwen3_server(start_server: Callable[..., Server], qwen3_path: Path, tiny_model: Path) -> Server:
    return start_server(models=[str(qwen3_path), str(tiny_model)])


def _openai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)


def test_openai_reasoning_content_apart_streamed_and_not(qwen3_server: Server) -> None:
    c = _openai(qwen3_server)
    ask = {"model": MODEL, "messages": HI, "temperature": 0, "max_tokens": 64, "response_format": FORMAT}
    extra = {"thinking_budget_tokens": 6}
    whole = c.chat.completions.create(**ask, extra_body=extra).choices[0].message  # type: ignore[call-overload]
    reasoning = (whole.model_extra or {})["reasoning_content"]
    assert reasoning and "think>" not in reasoning + (whole.content or "")
    assert json.loads(whole.content or "")["ok"] in (True, False)

    thought, said = [], []
    for chunk in c.chat.completions.create(**ask, extra_body=extra, stream=True):  # type: ignore[call-overload]
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        thought.append((delta.model_extra or {}).get("reasoning_content") or "")
        said.append(delta.content or "")
    assert ("".join(thought), "".join(said)) == (reasoning, whole.content)


def test_openai_thinking_off_answers_at_once(qwen3_server: Server) -> None:
    c = _openai(qwen3_server)
    for extra in ({"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
        out = c.chat.completions.create(  # type: ignore[call-overload]
            model=MODEL, messages=HI, temperature=0, max_tokens=32, response_format=FORMAT, extra_body=extra
        )
        message = out.choices[0].message
        assert "reasoning_content" not in (message.model_extra or {})  # no thoughts: no field, as llama.cpp
        assert json.loads(message.content or "")["ok"] in (True, False)


def test_openai_refusals_name_the_field(qwen3_server: Server) -> None:
    c = _openai(qwen3_server)
    cases = [
        ("tiny.gguf", {"reasoning_effort": "high"}, "does not think"),
        (MODEL, {"chat_template_kwargs": {"enable_thinkin": False}}, "enable_thinking"),
        (MODEL, {"reasoning_effort": "none", "thinking_budget_tokens": 8}, "needs thinking on"),
    ]
    for model, extra, says in cases:
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model=model, messages=HI, max_tokens=4, extra_body=extra)  # type: ignore[call-overload]
        assert says in str(err.value)


def test_ollama_thinking_apart_and_cut_by_num_predict(qwen3_server: Server) -> None:
    client = ollama.Client(host=qwen3_server.url)
    opts = {"temperature": 0, "num_predict": 8}
    whole = client.chat(MODEL, messages=HI, think=True, options=opts)
    # never closed within num_predict: all of it is thinking, none of it content, no tag in either
    assert whole.message.thinking and whole.message.content == "" and whole.done_reason == "length"
    assert "think>" not in whole.message.thinking
    parts = list(client.chat(MODEL, messages=HI, think=True, options=opts, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == whole.message.thinking
    off = client.chat(MODEL, messages=HI, think=False, format=SCHEMA, options={"temperature": 0})
    assert not off.message.thinking and json.loads(off.message.content)["ok"] in (True, False)
    assert "thinking" in client.show(MODEL).capabilities
    gen = client.generate(MODEL, prompt="hi", think=True, options=opts)
    assert gen.thinking == whole.message.thinking and gen.response == ""


def test_ollama_think_on_a_model_that_does_not_think_is_a_400(qwen3_server: Server) -> None:
    client = ollama.Client(host=qwen3_server.url)
    with pytest.raises(ollama.ResponseError) as err:
        client.chat("tiny.gguf", messages=HI, think=True)
    assert err.value.status_code == 400 and "does not think" in err.value.error


def test_anthropic_thinking_blocks_when_enabled(qwen3_server: Server) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=qwen3_server.url, api_key="x", max_retries=0, timeout=60)
    ask = {"model": MODEL, "max_tokens": 48, "messages": HI, "extra_body": {"top_k": 1}}  # greedy
    whole = client.messages.create(**ask, thinking={"type": "enabled", "budget_tokens": 5})  # type: ignore[arg-type]
    kinds = [b.type for b in whole.content]
    assert kinds[0] == "thinking" and "text" in kinds
    thought = whole.content[0].thinking  # type: ignore[union-attr]
    assert thought and "think>" not in thought
    with client.messages.stream(**ask, thinking={"type": "enabled", "budget_tokens": 5}) as stream:  # type: ignore[arg-type]
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    plain = client.messages.create(**ask)  # type: ignore[arg-type]
    assert [b.type for b in plain.content] == [
        "text"
    ]  # not enabled: the template's block closed, no thoughts
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(  # type: ignore[call-overload]
            model="tiny.gguf", max_tokens=8, messages=HI, thinking={"type": "enabled", "budget_tokens": 1024}
        )
    assert "does not think" in str(err.value)


def test_responses_reasoning_item_streamed_and_not(qwen3_server: Server) -> None:
    c = _openai(qwen3_server)
    ask = {"model": MODEL, "input": "hi", "temperature": 0, "max_output_tokens": 12}
    # Responses has no budget: this random model thinks until max_output_tokens, all of it a reasoning item
    whole = c.responses.create(**ask, reasoning={"effort": "low"})  # type: ignore[call-overload]
    assert [o.type for o in whole.output] == ["reasoning"] and whole.status == "incomplete"
    thought = whole.output[0].content[0].text  # type: ignore[union-attr,index]
    assert thought and "think>" not in thought
    events = list(c.responses.create(**ask, reasoning={"effort": "low"}, stream=True))  # type: ignore[call-overload]
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == thought and events[-1].type == "response.incomplete"  # what the SDK's helper refuses
    assert events[-1].response.output[0].content[0].text == thought  # type: ignore[union-attr]
    fmt = {"format": {"type": "json_schema", "name": "ok", "schema": SCHEMA}}
    off = c.responses.create(**{**ask, "max_output_tokens": 32}, text=fmt, reasoning={"effort": "none"})  # type: ignore[call-overload]
    assert [o.type for o in off.output] == ["message"] and json.loads(off.output_text)["ok"] in (True, False)
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(**ask, reasoning={"effort": "low", "summary": "detailed"})  # type: ignore[call-overload]
    assert "summar" in str(err.value)


def test_openai_tool_call_after_the_thinking(qwen3_server: Server) -> None:
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {
            "type": "string", "maxLength": 8}}, "required": ["city"], "additionalProperties": False}},
    }  # fmt: skip
    c = _openai(qwen3_server)
    for stream in (False, True):
        ask = {"model": MODEL, "messages": HI, "temperature": 0, "max_tokens": 96, "tools": [tool]}
        out = c.chat.completions.create(  # type: ignore[call-overload]
            **ask, tool_choice="required", extra_body={"thinking_budget_tokens": 4}, stream=stream
        )
        if stream:
            chunks = [ch.choices[0].delta for ch in out if ch.choices]
            reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in chunks)
            calls = [tc for d in chunks for tc in d.tool_calls or []]
        else:
            message = out.choices[0].message
            reasoning, calls = (message.model_extra or {})["reasoning_content"], message.tool_calls or []
        assert reasoning and "think>" not in reasoning
        assert len(calls) == 1 and calls[0].function.name == "get_weather"
        assert isinstance(json.loads(calls[0].function.arguments)["city"], str)
