"""Stopping without losing a request: the drain that SIGINT/SIGTERM or `Server.stop()` start.

While it drains the server still listens, but a new generation is a 503 (`server_shutting_down`, /health too),
and the requests it holds, queued ones included, have `grace_s` to finish. At the end of the grace the
schedulers cut what is left (`Scheduler.cut`): a running request ends with its text so far, `finish_reason`
"length" and `edge.stop_reason` "shutdown"; a queued one with a 503 (an SSE error event once its stream has
begun). Only once every response is written is uvicorn told to exit.
NOTE: uvicorn's own shutdown would cancel the tasks left at its timeout (a 500 and a traceback), and
sse-starlette cancels every stream as soon as uvicorn's `should_exit` is set (no final chunk, no [DONE]).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `edge serve --help` and every other command import this module: keep it light
    from edge.server.registry import Registry
    from edge.server.security import ASGIApp, Receive, Scope, Send

__all__ = ["Drain"]

log = logging.getLogger("edge.server")

CUT_S = 10.0  # after the cut: each generation stops at its next token, then writes its last event


class Drain:
    """The server's shutdown: `ask()` starts it (a second `ask()` ends the grace at once), `run()` does it on
    the server's loop, then calls `on_drained` (which lets uvicorn exit)."""

    def __init__(self, registry: Registry, grace_s: float, on_drained: Callable[[], None]) -> None:
        if grace_s < 0:
            raise ValueError(f"the grace period (grace_s, --grace) must be >= 0 s, not {grace_s}")
        self.registry = registry
        self.grace_s = grace_s
        self._on_drained = on_drained
        self.stopping = False  # the handlers start no new generation once it is set
        self.in_flight = 0  # POST requests (generations) not answered yet (counted by `track`)
        self._asks = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asked: asyncio.Event | None = None

    def track(self, app: ASGIApp) -> ASGIApp:
        """`app`, counting the generation requests in flight (until their response is written)."""

        async def tracked(scope: Scope, receive: Receive, send: Send) -> None:
            # only generations hold the drain: a load balancer polling /health must not keep it waiting
            if scope["type"] != "http" or scope.get("method") != "POST":
                await app(scope, receive, send)
                return
            self.in_flight += 1
            try:
                await app(scope, receive, send)
            finally:
                self.in_flight -= 1

        return tracked

    def ask(self) -> None:
        """Start the drain; safe from a signal handler and from any thread."""
        self._asks += 1
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server has stopped already
                loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        self.stopping = True
        if self._asked is not None:
            self._asked.set()

    async def run(self) -> None:
        """Wait for `ask()`, drain, hand over to uvicorn's exit. Runs for the app's life (its lifespan)."""
        self._asked = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if self._asks:  # asked before the loop ran
            self._begin()
        await self._asked.wait()
        try:
            await self._drain()
        except Exception:  # the server must still exit: a signal is all the user has to stop it
            log.exception("the drain failed; stopping now")
        finally:
            self._on_drained()

    async def _drain(self) -> None:
        running, queued = self._counts()
        log.info(
            "stopping: %d running and %d queued request(s) get %.1f s to finish (Ctrl+C again: end them now)",
            running, queued, self.grace_s,
        )  # fmt: skip
        await self._settle(self.grace_s, hurry=True)
        if self.in_flight:
            running = queued = 0
            for sched in self.registry.loaded().values():
                r, q = sched.cut()
                running, queued = running + r, queued + q
            log.info(
                "grace over: %d running request(s) end with their text so far, %d queued get a 503",
                running, queued,
            )  # fmt: skip
            await self._settle(CUT_S, hurry=False)

    async def _settle(self, seconds: float, *, hurry: bool) -> None:
        """Until no request is in flight, `seconds` have passed, or (`hurry`) `ask()` came again."""
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while self.in_flight and loop.time() < end and not (hurry and self._asks > 1):
            await asyncio.sleep(0.02)

    def _counts(self) -> tuple[int, int]:
        stats = [s.stats() for s in self.registry.loaded().values()]
        return sum(s["running"] for s in stats), sum(s["queued"] for s in stats)
