"""The checks every request passes before a handler sees it, as one pure ASGI middleware.

- Host: the `Host` header must be a loopback name or one the user allowed, else 403. A web page on another
  site can make the browser resolve its own name to 127.0.0.1 (DNS rebinding); its requests then carry that
  name, not ours.
- API key: with a key, every request but `GET /health` needs `Authorization: Bearer KEY` or, as Anthropic's
  clients send it, `x-api-key: KEY` (401), compared in constant time.
- Origin: a request a browser sends from a web page (it carries `Origin`) is refused (403) unless the page's
  origin is a loopback http(s) one or one `--cors-origin` allows. Without CORS a page cannot read the answer, but a
  simple POST still runs: a page on another site could otherwise start a multi-GB `/api/pull` or load the
  CPU. Desktop apps' own schemes (`app://`, `file://`, `tauri://`, `vscode-webview://`) pass, as with Ollama's
  default origins; `Origin: null` (a sandboxed frame) does not, unless `--cors-origin` names it.
- Body size: a declared or streamed body beyond the limit is a 413 before it is all read.

CORS (off unless origins are given) is Starlette's CORSMiddleware, placed outside this one so preflights pass.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from edge.server.config import is_loopback
from edge.server.protocol import error_body

__all__ = ["Guard", "host_name"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

OPEN_PATHS = frozenset({"/health"})


class BodyTooLarge(Exception):
    pass


def host_name(header: str) -> str:
    """The name in a Host header, without its port ("[::1]:8080" -> "::1")."""
    h = header.strip().lower()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


class Guard:
    def __init__(
        self,
        app: ASGIApp,
        *,
        api_key: str | None,
        allowed_hosts: tuple[str, ...],
        max_body_bytes: int,
        cors_origins: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.origins = frozenset(o.rstrip("/").lower() for o in cors_origins)
        self.key = None if not api_key else f"Bearer {api_key}".encode()
        self.raw_key = None if not api_key else api_key.encode()
        self.allowed = frozenset(h.lower().strip("[]") for h in allowed_hosts)
        self.max_body = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        host = host_name(headers.get("host", b"").decode("latin-1"))
        if not (is_loopback(host) or host in self.allowed or "*" in self.allowed):
            await _reject(send, 403, f"host {host!r} is not allowed", "forbidden", "host_not_allowed")
            return
        origin = headers.get("origin")
        if origin is not None and not self._origin_ok(origin.decode("latin-1")):
            await _reject(
                send, 403, f"origin {origin.decode('latin-1')!r} is not allowed: a web page on another site may "
                "not use this server (allow a page's origin with --cors-origin ORIGIN)", "forbidden", "origin_not_allowed",
            )  # fmt: skip
            return
        if self.key is not None and scope["path"] not in OPEN_PATHS and scope["method"] != "OPTIONS":
            given = headers.get("authorization", b"")
            assert self.raw_key is not None
            anthropic = hmac.compare_digest(headers.get("x-api-key", b""), self.raw_key)
            if not (hmac.compare_digest(given, self.key) or anthropic):
                await _reject(
                    send, 401, "a valid API key is required (Authorization: Bearer KEY)",
                    "invalid_request_error", "invalid_api_key",
                )  # fmt: skip
                return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _reject(send, 413, f"the request body is over {self.max_body} bytes", "invalid_request_error",
                          "request_too_large")  # fmt: skip
            return
        await self._with_body_limit(scope, receive, send)

    def _origin_ok(self, origin: str) -> bool:
        given = origin.strip().rstrip("/").lower()
        if "*" in self.origins or given in self.origins:
            return True
        parts = urlsplit(given)
        if parts.scheme not in ("http", "https"):
            return given != "null" and bool(
                parts.scheme
            )  # a desktop app's own scheme; null: a sandboxed frame
        host = (parts.hostname or "").strip("[]")
        return is_loopback(host)

    async def _with_body_limit(self, scope: Scope, receive: Receive, send: Send) -> None:
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge
            return message

        async def tracking(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited, tracking)
        except BodyTooLarge:
            if not started:
                await _reject(send, 413, f"the request body is over {self.max_body} bytes",
                              "invalid_request_error", "request_too_large")  # fmt: skip


async def _reject(send: Send, status: int, message: str, type_: str, code: str) -> None:
    body = json.dumps(error_body(message, type_, code=code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
