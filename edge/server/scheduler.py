"""Fair, bounded scheduling of generations on a model's replicas or batch slots.

Requests for one model wait in one FIFO queue (bounded: `QueueFull` beyond it, a 429) and run on the first
free replica, one generation per replica at a time, in a worker thread per replica. With `--parallel N` on a
backend that batches, the "replicas" are N slots of one model (`Model.slots`): each has its own KV cache, and
their workers' forwards meet in the batch engine, which runs them packed into one graph run a step
(devices/batch.py), so every active request joins each step (continuous batching). When several replicas
are free, the request goes to the one whose KV cache already holds the longest prefix of its prompt, so a
conversation that sends its history again keeps reusing its KV (edge.session) even when clients interleave.
Slots go further: where another slot, generating or not, holds a longer prefix (a system prompt every client
sends), its KV is copied into the chosen one before the request runs (`Model.adopt_prefix`).

Pieces of text go back to the event loop through an asyncio queue; a request that is cancelled (its client
disconnected, or the server is stopping) sets the job's event, which the generation polls between tokens.
At the end of a shutdown's grace (drain.py) `cut` ends every job: a queued one fails with `ServerStopping`, a
running one stops at its next token and keeps its text so far (`Job.shutdown` says why it stopped).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge.errors import EdgeError
from edge.model import Model, Result
from edge.session import common_prefix

__all__ = ["Done", "Failed", "Job", "JobRecord", "QueueFull", "Scheduler", "ServerStopping"]


class QueueFull(EdgeError):
    """Every replica (or slot) is busy and the queue is full; `retry_after` is an estimate in seconds."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, hint=f"retry after {retry_after} s")
        self.retry_after = retry_after


class ServerStopping(EdgeError):
    """The server is shutting down: it takes no new request, and this one had not started when the grace ended."""

    def __init__(self, message: str = "the server is shutting down") -> None:
        super().__init__(message, hint="send it again once the server is back, or to another one")


@dataclass(frozen=True)
class Done:
    result: Result


@dataclass(frozen=True)
class Failed:
    error: BaseException


@dataclass(eq=False)  # identity: jobs sit in sets and queues
class Job:
    """One generation: `run(model, cancel)` is called on a worker thread with a replica or slot and must return
    the Result; it reports text pieces through `emit`."""

    prompt_ids: Sequence[int]
    run: Callable[[Model, Callable[[], bool], Callable[[str], None]], Result]
    loop: asyncio.AbstractEventLoop
    items: asyncio.Queue[str | Done | Failed] = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.monotonic)
    started: float | None = None
    polls: int = 0  # cancel polls by the generation: one per token (and per prefill chunk)
    polls_at_cancel: int | None = None
    shutdown: bool = False  # cancelled by the end of a shutdown's grace (not by its client)
    batch: float | None = None  # on a batch slot: the mean pieces of the steps it rode in
    # the sibling slots: the one holding the longest prefix of the prompt is copied from before it runs
    siblings: tuple[Model, ...] = ()
    copied: int = 0  # prompt ids copied from a sibling

    def cancel(self) -> None:
        if not self.cancelled.is_set():
            self.polls_at_cancel = self.polls
            self.cancelled.set()

    def poll(self) -> bool:
        self.polls += 1
        return self.cancelled.is_set()

    def put(self, item: str | Done | Failed) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone (server stopped): nobody is listening
            self.loop.call_soon_threadsafe(self.items.put_nowait, item)

    @property
    def queue_ms(self) -> float:
        return 0.0 if self.started is None else (self.started - self.enqueued) * 1000


@dataclass(frozen=True)
class JobRecord:
    """What a finished job did (kept for /health and tests)."""

    stop_reason: str
    n_tokens: int
    polls_after_cancel: int | None  # polls between the cancel and the end: 1 means it stopped at the next


class _Worker:
    def __init__(self, scheduler: Scheduler, model: Model, index: int) -> None:
        self.scheduler = scheduler
        self.model = model
        self.inbox: deque[Job | None] = deque()
        self.ready = threading.Condition()
        self.thread = threading.Thread(
            target=self._loop, name=f"edge-serve-{model.name}-{index}", daemon=True
        )
        self.thread.start()

    def give(self, job: Job | None) -> None:
        with self.ready:
            self.inbox.append(job)
            self.ready.notify()

    def held(self) -> list[int]:
        # read from the dispatching thread: a warm-up or a generation may be moving it (then the choice of
        # replica or source is merely less good: adopt_prefix reads it again, and keeps a copy only where the
        # source's copied positions did not move meanwhile)
        return self.model.session.holding()

    def _loop(self) -> None:
        while True:
            with self.ready:
                while not self.inbox:
                    self.ready.wait()
                job = self.inbox.popleft()
            if job is None:
                return
            self._run(job)
            self.scheduler._finished(self, job)

    def _adopt(self, job: Job) -> None:
        """Copy the longest prefix of the job's prompt a sibling slot holds, where it beats this slot's own
        (read now, not at dispatch: a sibling may have prefilled more since)."""
        if not job.siblings:
            return
        ids = job.prompt_ids
        held = {m: common_prefix(m.session.holding(), ids) for m in job.siblings}
        best = max(held, key=held.__getitem__)
        if held[best] > common_prefix(self.model.session.holding(), ids):
            job.copied = self.model.adopt_prefix(best, ids)  # it counts again, with this KV still

    def _run(self, job: Job) -> None:
        job.started = time.monotonic()
        if job.cancelled.is_set():  # nobody waits for it, or the shutdown cut it before it began
            job.put(Failed(ServerStopping() if job.shutdown else asyncio.CancelledError()))
            return
        before = self.model.ridden()
        try:
            self._adopt(job)
            result = job.run(self.model, job.poll, job.put)
        except BaseException as exc:  # handed to the request; the worker goes on
            job.put(Failed(exc))
            return
        after = self.model.ridden()
        if before is not None and after is not None and after[0] > before[0]:
            job.batch = (after[1] - before[1]) / (after[0] - before[0])
        job.put(Done(result))
        after = None if job.polls_at_cancel is None else job.polls - job.polls_at_cancel
        self.scheduler._record(JobRecord(result.stats.stop_reason, result.stats.n_tokens, after))


class Scheduler:
    """The queue and the workers of one model name (each worker owns one replica, or one slot of a batch)."""

    def __init__(self, replicas: Sequence[Model], queue_size: int, *, batched: bool = False) -> None:
        if not replicas:
            raise ValueError("a scheduler needs at least one replica")
        self.name = replicas[0].name
        self.batched = batched  # the replicas are slots of one batch engine (Model.slots)
        self.queue_size = queue_size
        self._lock = threading.Lock()
        self.render_lock = threading.Lock()  # chat templates render one at a time (see app._render)
        self._queue: deque[Job] = deque()
        self._workers = [_Worker(self, m, i) for i, m in enumerate(replicas)]
        self._idle = list(self._workers)
        self._running: set[Job] = set()
        self._closed = False
        self.records: deque[JobRecord] = deque(maxlen=256)
        self.completed = 0
        self._mean_s = 1.0  # running mean of a job's duration, for Retry-After
        self.last_used = time.monotonic()

    @property
    def replicas(self) -> list[Model]:
        return [w.model for w in self._workers]

    def submit(self, job: Job) -> None:
        with self._lock:
            if self._closed:
                raise ServerStopping()
            if not self._idle and len(self._queue) >= self.queue_size:
                waves = (len(self._queue) + len(self._running)) / len(self._workers)
                raise QueueFull(
                    f"{self.name}: {len(self._running)} requests running and {len(self._queue)} waiting",
                    retry_after=max(1, round(self._mean_s * waves)),
                )
            self._queue.append(job)
            self.last_used = time.monotonic()
            self._dispatch()

    def withdraw(self, job: Job) -> None:
        """A request left before its job started: take it out of the queue."""
        with self._lock, contextlib.suppress(ValueError):
            self._queue.remove(job)
        job.cancel()

    def _dispatch(self) -> None:
        # FIFO: the oldest job goes first, to the free replica that holds the longest prefix of its prompt
        while self._queue and self._idle:
            job = self._queue.popleft()
            worker = max(self._idle, key=lambda w: common_prefix(w.held(), job.prompt_ids))
            if self.batched:  # another slot, busy or not, may hold more of it: copied before it runs
                job.siblings = tuple(w.model for w in self._workers if w is not worker)
            self._idle.remove(worker)
            self._running.add(job)
            worker.give(job)

    def _finished(self, worker: _Worker, job: Job) -> None:
        with self._lock:
            self._running.discard(job)
            if job.started is not None:
                self._mean_s = 0.8 * self._mean_s + 0.2 * (time.monotonic() - job.started)
            self.completed += 1
            self.last_used = time.monotonic()
            if not self._closed:
                self._idle.append(worker)
                self._dispatch()

    def _record(self, record: JobRecord) -> None:
        self.records.append(record)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self._running or self._queue)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                "mode": "slots" if self.batched else "replicas",
                "replicas": len(self._workers),
                "running": len(self._running),
                "queued": len(self._queue),
                "completed": self.completed,
            }
        engine = self._workers[0].model.batch_engine
        if engine is not None:
            out["batch"] = {
                "steps": engine.steps,
                "mean_batch": round(engine.mean_batch, 2),
                "tokens": engine.tokens,
                "mixed_steps": engine.mixed_steps,
                "prefill_runs": engine.prefill_runs,
            }
        return out

    def cut(self) -> tuple[int, int]:
        """End every job now: the queued fail with ServerStopping, the running stop at their next token with
        their text so far. Returns how many (running, queued) were cut."""
        with self._lock:
            queued, self._queue = list(self._queue), deque()
            running = list(self._running)
        for job in queued:
            job.cancel()
            job.put(Failed(ServerStopping()))
        for job in running:
            job.shutdown = True  # set before the cancel: the worker reads it once it sees the cancel
            job.cancel()
        return len(running), len(queued)

    def close(self, *, timeout: float = 10.0) -> None:
        """Cancel what runs and what waits, stop the workers and free the replicas."""
        with self._lock:
            self._closed = True
        self.cut()
        for w in self._workers:
            w.give(None)
        for w in self._workers:
            w.thread.join(timeout)
        for m in self.replicas:
            m.close()
