"""A graph build's progress (an own graph, `edge convert`'s partitions, a device plan): what `edge.load`'s
`on_progress` and the displays see while a model is built once for a backend.

The caller names where progress goes with `reporting(on_progress)` (a context, so the layers between the API
and the builders need not carry it); the builders report through `BuildTask`. `on_progress(done, total,
phase)` gets phase "build" with done/total counted in the build's steps (one per layer and one for the head
as they are built, one per graph pass, one for writing each graph), first (0, total) as the build starts
(total may grow once, when the build knows its passes) and last (total, total). A cached graph reports
nothing; a load may build more than one (a draft model's graph). Then the runtime opens the graph (`opening`):
phase "compile", (0, 1) and (1, 1); on stderr a line only when that takes over a second. Without a callback it goes to stderr (never stdout: `edge run --json` keeps stdout one
object): a line naming what is built, that it happens once per model and where it is cached, then a bar on a
terminal or a plain line every few seconds elsewhere (a server's log, a script, CI), and the time it took.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import IO, TypeAlias

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = [
    "BUILD_PHASE",
    "COMPILE_PHASE",
    "BuildProgress",
    "BuildTask",
    "StderrBuildProgress",
    "cached_note",
    "opening",
    "reporting",
]

BUILD_PHASE = "build"
COMPILE_PHASE = "compile"
BuildProgress: TypeAlias = Callable[[int, int, str], None]  # the pull's shape (models/store.PullProgress)

_SINK: ContextVar[BuildProgress | None] = ContextVar("edge_build_progress", default=None)
_REPORT_S = 0.1  # a callback hears a build at most this often, besides its first and last step


@contextlib.contextmanager
def reporting(on_progress: BuildProgress | None) -> Iterator[None]:
    """Builds started inside report to `on_progress` (None: to stderr, see StderrBuildProgress)."""
    token = _SINK.set(on_progress)
    try:
        yield
    finally:
        _SINK.reset(token)


def cached_note(folder: str | os.PathLike[str]) -> str:
    """The announcement's note for a build kept in the cache."""
    return f"once per model; cached in {folder}"


@contextlib.contextmanager
def opening(what: str, *, after_s: float = 1.0) -> Iterator[None]:
    """A runtime opening a graph: quick when it has its compiled form cached, slow once (OpenVINO compiling,
    ORT optimizing and prepacking). A callback hears phase "compile", (0, 1) then (1, 1); without one, a line
    on stderr once it has taken `after_s`, and its time when done (nothing for a quick open)."""
    sink = _SINK.get()
    if sink is not None:
        sink(0, 1, COMPILE_PHASE)
        yield
        sink(1, 1, COMPILE_PHASE)
        return
    t0, done, said = time.monotonic(), threading.Event(), threading.Event()

    def announce() -> None:
        if not done.wait(after_s):
            said.set()
            print(
                f"opening {what} (the runtime prepares its weights; OpenVINO caches its compiled form)",
                file=sys.stderr,
                flush=True,
            )

    thread = threading.Thread(target=announce, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        if said.is_set():
            print(f"opened {what} in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)


class StderrBuildProgress:
    """The default display of a build: its announcement, then a bar on a terminal or a plain line every
    `every_s` seconds elsewhere, then one line with the time it took."""

    def __init__(self, what: str, note: str, stream: IO[str] | None = None, *, every_s: float = 5.0) -> None:
        self.what, self.note = what, note
        self.stream = stream or sys.stderr
        self.every_s = every_s
        self._bar: Progress | None = None
        self._task = 0
        self._t0 = self._last_t = time.monotonic()

    def start(self, total: int) -> None:
        print(f"building {self.what} ({self.note})", file=self.stream, flush=True)
        if self.stream.isatty():
            self._bar = Progress(
                TextColumn("[bold]building"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("steps"),
                TimeElapsedColumn(),
                transient=True,
                console=Console(file=self.stream),
                redirect_stdout=False,  # what the command prints to stdout stays there (edge run --json)
            )
            self._bar.start()
            self._task = self._bar.add_task("build", total=total or None)

    def __call__(self, done: int, total: int, phase: str) -> None:
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total or None)
            return
        now = time.monotonic()
        if now - self._last_t >= self.every_s and done < total:
            self._last_t = now
            print(f"building: {done}/{total} steps, {now - self._t0:.0f} s", file=self.stream, flush=True)

    def finish(self, ok: bool) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        took = time.monotonic() - self._t0
        line = (
            f"built {self.what} in {took:.0f} s" if ok else f"building {self.what} stopped after {took:.0f} s"
        )
        print(line, file=self.stream, flush=True)


class BuildTask:
    """One build's reporter: `with BuildTask(what, note, total) as task: ... task.step()`. `total` may grow
    while the build learns its size (`task.add(n)`; 0: not known yet). A task started inside another (a
    device plan's conversion) counts in the outer one: the caller sees one build."""

    def __init__(self, what: str, note: str, total: int = 0) -> None:
        self.what, self.note = what, note
        self.done, self.total = 0, total
        self._outer: BuildTask | None = None
        self._display: StderrBuildProgress | None = None
        self._callback: BuildProgress | None = None
        self._last = 0.0

    def __enter__(self) -> BuildTask:
        self._outer = _ACTIVE.get()
        if self._outer is not None:
            self._outer.add(self.total)
            return self
        self._token = _ACTIVE.set(self)
        sink = _SINK.get()
        if sink is None:
            self._display = StderrBuildProgress(self.what, self.note)
            self._display.start(self.total)
        self._callback = sink or self._display
        self._report(force=True)
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._outer is not None:
            return
        _ACTIVE.reset(self._token)
        if exc_type is None:
            self.done = self.total
            self._report(force=True)
        if self._display is not None:
            self._display.finish(exc_type is None)

    def add(self, n: int) -> None:
        if self._outer is not None:
            self._outer.add(n)
            return
        self.total += n
        self._report(force=True)

    def step(self, n: int = 1) -> None:
        if self._outer is not None:
            self._outer.step(n)
            return
        self.done = min(self.total, self.done + n)
        self._report()

    def _report(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if self._callback is not None and (force or now - self._last >= _REPORT_S):
            self._last = now
            self._callback(self.done, self.total, BUILD_PHASE)


_ACTIVE: ContextVar[BuildTask | None] = ContextVar("edge_build_task", default=None)
