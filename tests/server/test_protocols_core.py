"""What the request core gives every protocol layer, on the tiny model: a client that leaves an Ollama, Anthropic
or Responses stream cancels its generation within one decode step, stopping the server ends a running one in
that protocol's "cut short" words, the API key is checked (Anthropic's x-api-key too), and Ollama's tags
resolve or are refused in Ollama's error shape."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from edge.server import Server
from tests.server.conftest import LONG_CTX
from tests.server.test_concurrency import LONG_LIMITS, last_record, scheduler, wait_idle

HI = [{"role": "user", "content": "w1"}]
# each protocol's endpoint and a long greedy streamed request on the tiny model
LONG: dict[str, tuple[str, dict[str, Any]]] = {
    "ollama": ("/api/chat", {"model": "tiny.gguf:latest", "messages": HI,
                             "options": {"num_predict": 30_000, "temperature": 0}}),
    "anthropic": ("/v1/messages", {"model": "tiny.gguf", "messages": HI, "max_tokens": 30_000,
                                   "temperature": 0, "stream": True}),
    "responses": ("/v1/responses", {"model": "tiny.gguf", "input": "w1", "max_output_tokens": 30_000,
                                    "temperature": 0, "stream": True}),
}  # fmt: skip


@pytest.mark.parametrize("protocol", sorted(LONG))
def test_disconnect_mid_stream_cancels(start_server: Callable[..., Server], protocol: str) -> None:
    s = start_server(n_ctx=LONG_CTX, limits=LONG_LIMITS)
    path, body = LONG[protocol]
    with httpx.stream("POST", s.url + path, json=body) as r:
        assert r.status_code == 200
        got = [line for line, _ in zip(r.iter_lines(), range(8), strict=False) if line.strip()]
        assert len(got) >= 4
    wait_idle(scheduler(s))
    record = last_record(scheduler(s))
    assert record.stop_reason == "cancelled" and 2 <= record.n_tokens < 30_000
    assert record.polls_after_cancel is not None and record.polls_after_cancel <= 1


def _last_event(lines: list[str]) -> dict[str, Any]:
    data = [line.removeprefix("data:").strip() for line in lines if line.startswith("data:")]
    return json.loads(data[-1]) if data else json.loads([line for line in lines if line.strip()][-1])


@pytest.mark.parametrize("protocol", sorted(LONG))
def test_stopping_ends_a_stream_as_the_protocol_says_cut(
    start_server: Callable[..., Server], protocol: str
) -> None:
    s = start_server(n_ctx=LONG_CTX, limits=LONG_LIMITS, grace_s=0.3)
    path, body = LONG[protocol]
    lines: list[str] = []

    def read() -> None:
        with httpx.stream("POST", s.url + path, json=body, timeout=30) as r:
            lines.extend(r.iter_lines())

    reader = threading.Thread(target=read)
    reader.start()
    while not scheduler(s).stats()["running"]:
        time.sleep(0.01)
    s.stop()
    reader.join(10)
    assert not reader.is_alive()
    last = _last_event(lines)
    if protocol == "ollama":
        assert last["done"] and last["done_reason"] == "length" and last["edge"]["stop_reason"] == "shutdown"
    elif protocol == "anthropic":
        assert last["type"] == "message_stop"
        delta = _last_event([line for line in lines if "message_delta" in line])
        assert delta["delta"]["stop_reason"] == "max_tokens" and delta["edge"]["stop_reason"] == "shutdown"
    else:
        assert last["type"] == "response.incomplete"
        assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_api_key_and_anthropic_x_api_key(start_server: Callable[..., Server]) -> None:
    s = start_server(api_key="s3cret-key")
    ask = {"model": "tiny.gguf", "messages": HI, "max_tokens": 2}
    no = httpx.post(s.url + "/v1/messages", json=ask)
    assert no.status_code == 401
    assert (
        httpx.post(s.url + "/v1/messages", json=ask, headers={"x-api-key": "s3cret-kez"}).status_code == 401
    )
    ok = httpx.post(s.url + "/v1/messages", json=ask, headers={"x-api-key": "s3cret-key"})
    assert ok.status_code == 200 and ok.json()["type"] == "message"
    assert httpx.get(s.url + "/api/tags").status_code == 401
    tags = httpx.get(s.url + "/api/tags", headers={"Authorization": "Bearer s3cret-key"})
    assert tags.json()["models"][0]["name"] == "tiny.gguf:latest"


def test_ollama_names_and_refusals(server: Server) -> None:
    chat = {"messages": HI, "stream": False, "options": {"num_predict": 2}}
    ok = httpx.post(server.url + "/api/chat", json={**chat, "model": "tiny.gguf:latest"})
    assert ok.status_code == 200 and ok.json()["done"] and ok.json()["eval_count"] == 2
    other = httpx.post(server.url + "/api/chat", json={**chat, "model": "tiny.gguf:7b"})
    assert other.status_code == 404 and "tagged 'latest'" in other.json()["error"]
    unknown = httpx.post(server.url + "/api/generate", json={"model": "llama3", "prompt": "x"})
    assert unknown.status_code == 404 and set(unknown.json()) == {"error"}
    think = httpx.post(server.url + "/api/chat", json={**chat, "model": "tiny.gguf", "think": True})
    assert think.status_code == 400 and "think" in think.json()["error"]
    load = httpx.post(server.url + "/api/generate", json={"model": "tiny.gguf"})  # Ollama's "load it" call
    assert load.json()["done_reason"] == "load"
    for what in ("create", "copy", "push"):
        r = httpx.post(server.url + f"/api/{what}", json={"model": "x"})
        assert r.status_code == 400 and "not supported" in r.json()["error"]
