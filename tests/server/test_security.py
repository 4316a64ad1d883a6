"""The server's promises: loopback unless a key is set, the key checked, foreign Host headers refused (DNS
rebinding), CORS off by default, bodies bounded, hostile chat templates contained, no file paths as models."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

import edge
from edge.server import Limits, Server, ServerConfig, UnsafeBindError
from edge.server.config import check_bind, is_loopback
from edge.server.security import host_name
from tests.tiny_models import TinySpec, write_tiny_model

HI = [{"role": "user", "content": "hi"}]
CHAT = {"model": "tiny.gguf", "messages": HI, "max_tokens": 4}


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_non_loopback_bind_without_key_is_refused(host: str) -> None:
    with pytest.raises(UnsafeBindError, match="API key"):
        check_bind(ServerConfig(host=host))
    check_bind(ServerConfig(host=host, api_key="k"))  # with a key it is the user's choice
    with pytest.raises(UnsafeBindError):  # refused before any model loads or any socket opens
        edge.serve("no-such-model", host=host, block=False, api_key="")


def test_cli_refuses_a_public_bind_with_a_clear_message(tiny_model: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_API_KEY"}
    r = subprocess.run(
        [sys.executable, "-m", "edge.cli", "serve", str(tiny_model), "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert r.returncode == 1
    assert "refusing to listen on 0.0.0.0 without an API key" in r.stderr and "--api-key" in r.stderr


def test_loopback_names() -> None:
    assert all(
        is_loopback(h) for h in ["127.0.0.1", "127.8.0.1", "::1", "[::1]", "localhost", "app.localhost"]
    )
    assert not any(is_loopback(h) for h in ["0.0.0.0", "10.0.0.1", "evil.example", "localhost.evil.example"])
    assert host_name("[::1]:8080") == "::1" and host_name("LocalHost:80") == "localhost"


@pytest.fixture
def keyed(start_server: Callable[..., Server]) -> Server:
    return start_server(api_key="s3cret-key")


def test_api_key_is_required(keyed: Server) -> None:
    url = keyed.url + "/v1/chat/completions"
    assert httpx.post(url, json=CHAT).status_code == 401
    wrong = httpx.post(url, json=CHAT, headers={"Authorization": "Bearer s3cret-kez"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(keyed.url + "/v1/models", headers={"Authorization": "s3cret-key"}).status_code == 401
    ok = httpx.post(url, json=CHAT, headers={"Authorization": "Bearer s3cret-key"})
    assert ok.status_code == 200
    assert httpx.get(keyed.url + "/health").status_code == 200  # liveness only: names no secret


def test_env_key_is_used(start_server: Callable[..., Server], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGE_API_KEY", "from-env")
    s = start_server()
    assert httpx.get(s.url + "/v1/models").status_code == 401
    assert httpx.get(s.url + "/v1/models", headers={"Authorization": "Bearer from-env"}).status_code == 200


def test_foreign_host_header_is_403(server: Server) -> None:
    for host in ["evil.example", "evil.example:8080", "192.168.1.5", "localhost.evil.example"]:
        r = httpx.get(server.url + "/v1/models", headers={"Host": host})
        assert r.status_code == 403, host
        assert r.json()["error"]["code"] == "host_not_allowed"
    for host in ["localhost", f"127.0.0.1:{server.port}", "[::1]:1"]:
        assert httpx.get(server.url + "/v1/models", headers={"Host": host}).status_code == 200


def test_allowed_host(start_server: Callable[..., Server]) -> None:
    s = start_server(allowed_hosts=["my-box.lan"])
    assert httpx.get(s.url + "/v1/models", headers={"Host": "my-box.lan:8080"}).status_code == 200
    assert httpx.get(s.url + "/v1/models", headers={"Host": "other.lan"}).status_code == 403


def test_cors_is_off_unless_asked(server: Server, start_server: Callable[..., Server]) -> None:
    origin = {"Origin": "https://site.example"}
    r = httpx.get(server.url + "/v1/models", headers=origin)
    assert "access-control-allow-origin" not in r.headers
    s = start_server(cors_origins=["https://app.example"], api_key="k")
    pre = httpx.options(
        s.url + "/v1/chat/completions",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "https://app.example"
    r = httpx.get(
        s.url + "/v1/models", headers={"Origin": "https://site.example", "Authorization": "Bearer k"}
    )
    assert "access-control-allow-origin" not in r.headers


def test_a_foreign_web_page_cannot_make_the_server_act(start_server: Callable[..., Server]) -> None:
    """A page on another site can send a simple POST (text/plain, no preflight) whose answer it cannot read, but
    whose work would still be done: a pull, a generation. Its Origin is refused before any handler runs."""
    s = start_server(cors_origins=["https://app.example"])
    body = '{"model": "tiny.gguf", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}'
    simple = {"Content-Type": "text/plain"}
    for origin in ("https://evil.example", "null", "http://192.168.1.10:8080"):
        r = httpx.post(s.url + "/v1/chat/completions", content=body, headers={**simple, "Origin": origin})
        assert r.status_code == 403 and "--cors" in r.json()["error"]["message"], origin
        r = httpx.post(s.url + "/api/pull", content='{"model": "smollm2-135m"}', headers={"Origin": origin})
        assert r.status_code == 403, origin
    for origin in (
        "https://app.example",
        "http://localhost:5173",
        "http://127.0.0.1:3000",
        "app://obsidian.md",
    ):
        r = httpx.post(s.url + "/v1/chat/completions", json=CHAT, headers={"Origin": origin})
        assert r.status_code == 200, (origin, r.text)
    assert httpx.post(s.url + "/v1/chat/completions", json=CHAT).status_code == 200  # no Origin: no page


def test_oversize_body_is_413(start_server: Callable[..., Server]) -> None:
    s = start_server(limits=Limits(max_body_bytes=64 * 1024))
    big = {**CHAT, "messages": [{"role": "user", "content": "w1 " * 40_000}]}
    r = httpx.post(s.url + "/v1/chat/completions", json=big)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed body is counted
        yield b'{"model": "tiny.gguf", "messages": [{"role": "user", "content": "'
        for _ in range(200):
            yield b"w1 " * 1000
        yield b'"}]}'

    r = httpx.post(
        s.url + "/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 413


def test_messages_prompt_tokens_and_max_tokens_are_bounded(start_server: Callable[..., Server]) -> None:
    s = start_server(limits=Limits(max_messages=4, max_prompt_tokens=200, max_tokens=64))
    url = s.url + "/v1/chat/completions"
    r = httpx.post(url, json={**CHAT, "messages": HI * 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    r = httpx.post(url, json={**CHAT, "messages": [{"role": "user", "content": "w1 " * 300}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    r = httpx.post(url, json={**CHAT, "max_tokens": 65})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = httpx.post(s.url + "/v1/completions", json={"model": "tiny.gguf", "prompt": "w1 " * 300})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "name",
    ["/etc/passwd", "../tiny.gguf", "tiny", "~/.cache/edge/models/x.gguf", "C:\\x.gguf", "smollm2-135m"],
)
def test_a_path_or_unserved_name_is_404(server: Server, tiny_model: Path, name: str) -> None:
    for model in (name, str(tiny_model)):
        r = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "model": model})
        assert r.status_code == 404, model
        assert r.json()["error"]["code"] == "model_not_found"
    r = httpx.post(server.url + "/v1/completions", json={"model": str(tiny_model), "prompt": "x"})
    assert r.status_code == 404


def test_hostile_chat_template_cannot_execute(start_server: Callable[..., Server], tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    hostile = (
        "{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}"
        "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    )
    path = write_tiny_model(tmp_path / "hostile.gguf", TinySpec(chat_template=hostile))
    s = start_server(models=[str(path)])
    r = httpx.post(s.url + "/v1/chat/completions", json={**CHAT, "model": "hostile.gguf"})
    assert r.status_code == 500 and r.json()["error"]["code"] == "template_error"
    assert "unsafe" in r.json()["error"]["message"]
    assert not marker.exists()
    ok = httpx.post(
        s.url + "/v1/completions", json={"model": "hostile.gguf", "prompt": "w1", "max_tokens": 2}
    )
    assert ok.status_code == 200  # the server goes on: raw completions need no template
