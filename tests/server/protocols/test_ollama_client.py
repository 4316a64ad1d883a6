"""Ollama's API through the real `ollama` client, unchanged: list, show, chat (streamed and not), generate,
`format` as a JSON Schema (the answer validates), tools (a forced-shape call with valid arguments), ps and
version; Ollama's error shape for an unknown tag and for images."""

from __future__ import annotations

import json

import httpx
import jsonschema
import ollama
import psutil
import pytest

from edge.devices.mapped import release_heap
from edge.server import Server
from tests.server.protocols.conftest import CITY, MODEL, WEATHER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(protocol_server: Server) -> ollama.Client:
    return ollama.Client(host=protocol_server.url, timeout=120)


def test_list_and_show(client: ollama.Client) -> None:
    names = [m.model for m in client.list().models]
    assert f"{MODEL}:latest" in names
    entry = next(m for m in client.list().models if m.model == f"{MODEL}:latest")
    assert entry.size > 100_000_000 and entry.details is not None and entry.details.family == "qwen2"
    shown = client.show(f"{MODEL}:latest")
    assert shown.capabilities is not None and "tools" in shown.capabilities
    assert shown.modelinfo is not None and shown.modelinfo["qwen2.context_length"] == 2048
    assert shown.template is not None and "<|im_start|>" in shown.template
    assert shown.details is not None and shown.details.quantization_level == "Q4_K_M"
    running = client.ps().models
    assert [m.model for m in running] == [f"{MODEL}:latest"]


def test_chat_streamed_matches_unstreamed(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "Name three colours."}]
    options = {"temperature": 0, "num_predict": 12}
    whole = client.chat(MODEL, messages=messages, options=options)
    parts = list(client.chat(f"{MODEL}:latest", messages=messages, options=options, stream=True))
    assert whole.message.role == "assistant" and whole.message.content
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert parts[-1].eval_count == whole.eval_count and whole.prompt_eval_count > 5
    assert whole.done_reason in ("stop", "length")


def test_generate_with_system_and_stop(client: ollama.Client) -> None:
    out = client.generate(
        MODEL,
        prompt="Count from 1 to 9, one per line.",
        system="You are terse.",
        options={"temperature": 0, "num_predict": 24, "stop": ["5"]},
    )
    assert out.done and out.response and "5" not in out.response and "4" in out.response
    raw = client.generate(MODEL, prompt="def add(a, b):\n    return", raw=True, options={"num_predict": 8})
    assert raw.done and raw.eval_count is not None and 0 < raw.eval_count <= 8


def test_format_schema_is_kept(client: ollama.Client) -> None:
    messages = [{"role": "user", "content": "Tell me about Paris as JSON."}]
    out = client.chat(MODEL, messages=messages, format=CITY, options={"num_predict": 60})  # sampled at T=0.8
    jsonschema.validate(json.loads(out.message.content), CITY)


def test_tools(client: ollama.Client) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the current weather in a city",
                "parameters": WEATHER,
            },
        }
    ]
    messages = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]
    out = client.chat(MODEL, messages=messages, tools=tools, options={"temperature": 0})
    calls = out.message.tool_calls or []
    assert calls, out.message
    assert calls[0].function.name == "get_weather"
    jsonschema.validate(dict(calls[0].function.arguments), WEATHER)
    parts = list(client.chat(MODEL, messages=messages, tools=tools, options={"temperature": 0}, stream=True))
    streamed = [c for p in parts for c in (p.message.tool_calls or [])]
    assert [c.function.name for c in streamed] == [c.function.name for c in calls]
    # the round trip: the call and its result in the history, answered in text
    history = [
        *messages,
        out.message,
        {"role": "tool", "content": '{"temperature": 21}', "tool_name": "get_weather"},
    ]
    answer = client.chat(MODEL, messages=history, options={"temperature": 0, "num_predict": 16})
    assert answer.message.content and not answer.message.tool_calls


def test_errors_in_ollama_shape(protocol_server: Server, client: ollama.Client) -> None:
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(f"{MODEL}:7b", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 404 and "latest" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(MODEL, messages=[{"role": "user", "content": "hi", "images": ["aGk="]}])
    assert info.value.status_code == 400 and "images" in info.value.error
    r = httpx.post(protocol_server.url + "/api/copy", json={"source": MODEL, "destination": "x"})
    assert r.status_code == 400 and "not supported" in r.json()["error"]
    r = httpx.post(
        protocol_server.url + "/api/chat", json={"model": MODEL, "messages": [], "options": {"mirostat": 2}}
    )
    assert r.status_code == 400 and "mirostat" in r.json()["error"]
    assert httpx.get(protocol_server.url + "/api/version").json()["version"]


def _rss_settled() -> int:
    """The server's RSS (it runs in this process) with no garbage waiting: cycles collected, glibc's free heap
    pages returned, as the server does after an unload."""
    release_heap()
    return int(psutil.Process().memory_info().rss)


def test_keep_alive_zero_gives_the_memory_back_and_reloads(client: ollama.Client) -> None:
    from edge.models.catalog import CATALOG

    rss = psutil.Process().memory_info().rss  # the server runs in this process
    client.generate(MODEL, keep_alive=0)  # Ollama's unload: no prompt, keep_alive 0
    assert client.ps().models == []
    freed = rss - psutil.Process().memory_info().rss
    assert freed > 0.8 * CATALOG[MODEL].size, f"{freed / 2**20:.0f} MiB freed"
    again = client.generate(MODEL, prompt="Hi", options={"num_predict": 2})  # loads it again
    assert again.done and [m.model for m in client.ps().models] == [f"{MODEL}:latest"]
    # unloaded again, the server is back within 10% of before that load: what stays after the first unload
    # is the runtimes' code and one-time state (ONNX Runtime's environment, the tokenizer and grammar
    # libraries), loaded once per process as a runner binary is
    client.generate(MODEL, keep_alive=0)
    assert client.ps().models == []
    idle = _rss_settled()  # unloaded: before the next load
    client.generate(MODEL, prompt="Hi", options={"num_predict": 2})
    assert client.ps().models and _rss_settled() > idle + 0.5 * CATALOG[MODEL].size  # it did load
    client.generate(MODEL, keep_alive=0)
    after = _rss_settled()
    assert after <= 1.1 * idle, f"{after >> 20} MiB after the unload, {idle >> 20} MiB before the load"
    assert client.generate(
        MODEL, prompt="Hi", options={"num_predict": 2}
    ).done  # loaded, as the others expect
