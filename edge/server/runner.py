"""Running the server: `edge.serve(...)` for apps that embed it, and `edge serve` on the command line.

The bind is checked before anything loads (no API key, no listening beyond loopback), the models load before
the socket opens, and uvicorn serves the app. SIGINT/SIGTERM (or `Server.stop()`) start the drain (drain.py):
new requests get a 503, those in flight get `grace_s` to finish, then each is ended the OpenAI way (a running
one with its text so far, marked incomplete; a queued one with a 503) and the models are freed. A second
signal ends the grace at once. `run()` then returns normally: `edge serve` exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import FrameType
from typing import Any

from edge.server.config import Limits, LoadSettings, ServerConfig, check_bind
from edge.server.drain import Drain

__all__ = ["Server", "serve"]

log = logging.getLogger("edge.server")

# uvicorn's own wait, once the drain has ended every request: a response still being written to a slow client
UVICORN_BACKSTOP_S = 5.0


def _log_to_stderr() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("edge: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _uvicorn_server(config: Any, on_signal: Callable[[], None]) -> Any:
    """uvicorn, whose SIGINT/SIGTERM start edge's drain instead of its own shutdown (uvicorn is imported here,
    not by every `edge` command that parses its options).
    NOTE: uvicorn's handler sets `should_exit` at once (sse-starlette then cancels every stream), and after
    serving re-raises the signal (exit status 143 for a SIGTERM, a KeyboardInterrupt for a SIGINT)."""
    import uvicorn
    from uvicorn.server import HANDLED_SIGNALS

    class _Uvicorn(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield  # only the main thread receives signals: a server in a thread stops by `Server.stop()`
                return

            def handle(sig: int, frame: FrameType | None) -> None:
                on_signal()

            originals = {sig: signal.signal(sig, handle) for sig in HANDLED_SIGNALS}
            try:
                yield
            finally:
                for sig, original in originals.items():
                    signal.signal(sig, original)

    return _Uvicorn(config)


class Server:
    """A configured server: `start()` in a background thread or `run()` in this one; `url` once bound."""

    def __init__(self, config: ServerConfig, *, grace_s: float = 5.0, log_level: str = "warning") -> None:
        from edge.server.app import create_app
        from edge.server.registry import Registry

        check_bind(config)
        self.config = config
        self.registry = Registry(config)
        self.drain = Drain(self.registry, grace_s, on_drained=self._exit)  # checks grace_s before a load
        self.registry.start()
        try:
            family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
            self._sock = socket.socket(family, socket.SOCK_STREAM)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._sock.bind((config.host, config.port))
        except OSError:
            self.registry.close()
            raise
        self.port: int = self._sock.getsockname()[1]
        import uvicorn

        uv = uvicorn.Config(
            create_app(config, self.registry, self.drain),
            log_level=log_level,
            timeout_graceful_shutdown=UVICORN_BACKSTOP_S,
            lifespan="on",
            access_log=log_level in ("info", "debug"),
        )
        self._server = _uvicorn_server(uv, on_signal=self.drain.ask)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (in the main thread) or `stop()`."""
        log.info("serving %s at %s/v1", ", ".join(self.registry.loaded()), self.url)
        try:
            self._server.run(sockets=[self._sock])
        finally:
            self.registry.close()  # idempotent: the app's shutdown has closed it unless startup failed
            self._sock.close()

    def start(self, timeout: float = 30.0) -> Server:
        """Serve in a background thread; returns once the server accepts connections."""
        self._thread = threading.Thread(target=self.run, name="edge-serve", daemon=True)
        self._thread.start()
        for _ in range(int(timeout * 50)):
            if self._server.started or not self._thread.is_alive():
                break
            threading.Event().wait(0.02)
        if not self._server.started:
            raise RuntimeError("the server did not start")
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Drain (as a SIGTERM does) and wait for the server to end."""
        self.drain.ask()
        if not self._server.started:  # not serving (yet): nothing to drain
            self._exit()
        if self._thread is not None:
            self._thread.join(timeout)

    def _exit(self) -> None:
        self._server.should_exit = True

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    models: str | list[str] | tuple[str, ...] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    api_key: str | None = None,
    cors_origins: tuple[str, ...] | list[str] = (),
    allowed_hosts: tuple[str, ...] | list[str] = (),
    models_max: int | None = None,
    parallel: int = 1,
    limits: Limits | None = None,
    block: bool = True,
    grace_s: float = 5.0,
    keep_alive_s: float | None = None,
    **load: Any,
) -> Server:
    """Serve models over OpenAI's HTTP API (docs/api.md, docs/cli.md "edge serve").

    `models`: catalog names or .gguf paths (default: the catalog default). `load` takes `edge.load`'s keyword
    arguments (device, backend, precision, n_ctx, n_threads, draft, fallback, draft_device). `api_key`
    defaults to $EDGE_API_KEY; without one only loopback hosts may be bound. `block=False` starts it in a
    background thread and returns the `Server` (its `.url`, `.stop()`); `port=0` picks a free port.
    `keep_alive_s`: unload a model idle that long (None: keep it loaded; it loads again on demand).

    >>> server = edge.serve("smollm2-135m", port=0, block=False)      # doctest: +SKIP
    >>> server.url, server.stop()
    """
    names = (models,) if isinstance(models, str) else tuple(models or ())
    key = api_key if api_key is not None else os.environ.get("EDGE_API_KEY") or None
    config = ServerConfig(
        models=names,
        host=host,
        port=port,
        api_key=key,
        cors_origins=tuple(cors_origins),
        allowed_hosts=tuple(allowed_hosts),
        models_max=models_max if models_max is not None else max(1, len(names)),
        parallel=parallel,
        load=replace(LoadSettings(), **load),
        limits=limits or Limits(),
        keep_alive_s=keep_alive_s,
    )
    _log_to_stderr()
    server = Server(config, grace_s=grace_s)
    if block:
        server.run()
        return server
    return server.start()
