"""What the request core gives every protocol layer, on the tiny model: a client that leaves an Ollama,
Anthropic or Responses stream cancels its generation within one decode step, stopping the server ends a
running one in that protocol's "cut short" words, the API key is checked (Anthropic's x-api-key too),
Ollama's tags resolve or are refused in Ollama's error shape, and keep_alive unloads a model that loads
again on demand."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from edge.server import Server
from edge.server.config import parse_duration
from tests.server.conftest import LONG_CTX
from tests.server.test_concurrency import LONG_LIMITS, last_record, scheduler, wait_idle

HI = [{"role": "user", "content": "w1"}]
# each protocol's endpoint and a long greedy streamed request on the tiny model
LONG: dict[str, tuple[str, dict[str, Any]]] = {
    "ollama": (
        "/api/chat",
        {"model": "tiny.gguf:latest", "messages": HI, "options": {"num_predict": 30_000, "temperature": 0}},
    ),
    "anthropic": (
        "/v1/messages",
        {"model": "tiny.gguf", "messages": HI, "max_tokens": 30_000, "temperature": 0, "stream": True},
    ),
    "responses": (
        "/v1/responses",
        {"model": "tiny.gguf", "input": "w1", "max_output_tokens": 30_000, "temperature": 0, "stream": True},
    ),
}


TOKEN = {
    "ollama": '"done":false',
    "anthropic": "text_delta",
    "responses": "output_text.delta",
}  # a token's line


@pytest.mark.parametrize("protocol", sorted(LONG))
def test_disconnect_mid_stream_cancels(start_server: Callable[..., Server], protocol: str) -> None:
    s = start_server(n_ctx=LONG_CTX, limits=LONG_LIMITS)
    path, body = LONG[protocol]
    with httpx.stream("POST", s.url + path, json=body) as r:
        assert r.status_code == 200
        tokens = 0
        for line in r.iter_lines():
            tokens += TOKEN[protocol] in line and not line.startswith("event:")
            if tokens == 3:
                break
    wait_idle(scheduler(s))
    record = last_record(scheduler(s))
    assert record.stop_reason == "cancelled" and 3 <= record.n_tokens < 30_000
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


def _loaded(server: Server) -> list[str]:
    return [m["name"] for m in httpx.get(server.url + "/api/ps").json()["models"]]


def _wait_unloaded(server: Server, timeout: float = 10.0) -> float:
    t0 = time.monotonic()
    while _loaded(server):
        assert time.monotonic() - t0 < timeout, "the model stayed loaded"
        time.sleep(0.05)
    return time.monotonic() - t0


def test_keep_alive_zero_unloads_and_the_next_request_loads_again(server: Server) -> None:
    chat = {"model": "tiny.gguf", "messages": HI, "stream": False, "options": {"num_predict": 2}}
    assert _loaded(server) == ["tiny.gguf:latest"]
    ps = httpx.get(server.url + "/api/ps").json()["models"][0]
    assert ps["expires_at"].startswith("2318")  # kept for ever by default
    assert httpx.post(server.url + "/api/chat", json={**chat, "keep_alive": 0}).json()["done"]
    _wait_unloaded(server)
    again = httpx.post(server.url + "/api/chat", json={**chat, "keep_alive": "5m"})
    assert again.status_code == 200 and again.json()["eval_count"] == 2
    ps = httpx.get(server.url + "/api/ps").json()["models"][0]
    assert ps["name"] == "tiny.gguf:latest" and not ps["expires_at"].startswith("2318")
    other = httpx.post(
        server.url + "/v1/chat/completions", json={"model": "tiny.gguf", "messages": HI, "max_tokens": 2}
    )
    assert other.status_code == 200  # every protocol finds it loaded again
    unload = httpx.post(server.url + "/api/generate", json={"model": "tiny.gguf", "keep_alive": 0})
    assert unload.json()["done_reason"] == "unload" and not _loaded(server)
    assert httpx.post(server.url + "/api/chat", json={**chat, "keep_alive": "bad"}).status_code == 400


def test_the_servers_keep_alive_unloads_an_idle_model(start_server: Callable[..., Server]) -> None:
    s = start_server(keep_alive_s=0.5)
    assert (
        httpx.post(
            s.url + "/v1/messages", json={"model": "tiny.gguf", "messages": HI, "max_tokens": 2}
        ).status_code
        == 200
    )
    assert 0.0 <= _wait_unloaded(s) < 5.0
    assert (
        httpx.post(
            s.url + "/v1/responses", json={"model": "tiny.gguf", "input": "w1", "max_output_tokens": 2}
        ).status_code
        == 200
    )


@pytest.mark.parametrize(
    "given, seconds",
    [
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("250ms", 0.25),
        ("0", 0.0),
        (0, 0.0),
        (-1, None),
        ("-1", None),
        ("10", 10.0),
    ],
)
def test_parse_duration(given: str | int, seconds: float | None) -> None:
    assert parse_duration(given) == seconds


def test_parse_duration_refuses_what_is_not_one() -> None:
    for bad in ("5 minutes", "m", "", "1x"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)
