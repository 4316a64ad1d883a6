"""The thread of a continuous-batching engine: the slots' waiting pieces, run together a step at a time.

Slots (one per sequence) hand pieces of their forwards to `run` from their own threads and wait for the
answer; the loop thread takes what waits (`select`: at most one prompt chunk a step, see devices/batch.py)
and gives it to the engine's `_step`. After a step it waits up to `linger` for the slots that were in it (each
samples its next token meanwhile), so steady decoding stays in one batch instead of splitting into
alternating halves; a slot that does not come back (its generation ended) stops being waited for. What the
step runs (a packed graph, a native multi-sequence batch) is the engine's: devices/batch.py,
devices/llamacpp_batch.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

from edge.errors import DeviceError
from edge.kvcache.staging import WINDOW

__all__ = ["CHUNK_TARGET_S", "LINGER_S", "MIN_CHUNK", "StepLoop", "chunk_for", "select"]

LINGER_S = 0.01  # how long a step waits for the slots of the last one (a sampling step takes ~1-5 ms)
# A prompt chunk beside streaming slots: sized to run in about this long at the measured prompt rate, so the
# others' next tokens wait that long, not a whole chunk's time (qwen2.5-coder-0.5b on 2 Zen 5 cores: 434 ms
# for 256 tokens on ORT, 857 on llama.cpp)
CHUNK_TARGET_S = 0.2
# ...but not below this many tokens: ORT prefills as fast in 64-token chunks as in 256 (584 against 590
# tok/s; 33: 520), llama.cpp 13% slower (260 against 299; 33: 211) (the 0.5b, 1,024 tokens, 2 cores)
MIN_CHUNK = 64


class Piece(Protocol):
    """One slot's share of a step, as the loop sees it."""

    slot: Any
    chunk: bool  # a prompt chunk: at most one rides in a step
    n: int  # its tokens
    urgent: bool  # a short prompt's piece, or not the first piece of its forward (select)
    done: threading.Event
    out: Any
    error: BaseException | None


P = TypeVar("P", bound=Piece)


class StepLoop:
    """Slots opened, pieces waiting, and the thread that runs them (see the module docstring). Counts what
    it ran for /health and tests (`BatchStats`)."""

    def __init__(self, *, linger: float = LINGER_S, name: str = "edge-batch-engine") -> None:
        self.linger = linger
        self._cond = threading.Condition()
        self._waiting: list[Any] = []
        self._expected: set[int] = set()  # slots (ids) of the last step, waited for up to `linger`
        self._open = 0
        self._closed = False
        self.steps = 0  # runs made, and the pieces and tokens they carried (for /health and tests)
        self.pieces = 0
        self.tokens = 0
        # runs that carried a many-token piece (a prompt chunk, a verify) beside other slots' one-token steps
        self.mixed_steps = 0
        self.prefill_runs = 0  # runs of a phase split's prefill half (devices/batch.py)
        self._rested = 3  # steps without a prompt chunk since the last one that carried one
        self._made = 0  # slots made: each slot's index
        # the chunk steps' seconds and chunk tokens, older steps weighing less: their ratio is the prompt rate
        self._chunk_time, self._chunk_tokens = 0.0, 0.0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _open_slot(self) -> int:
        """Count a new slot open; its index (the order packed runs keep)."""
        with self._cond:
            if self._closed:
                raise DeviceError("the batch engine is closed", hint="load the model again")
            self._open += 1
            self._made += 1
            return self._made

    # -- what slots call -------------------------------------------------------------------------------
    def run(self, piece: P) -> Any:
        with self._cond:
            if self._closed:
                raise DeviceError("the batch engine is closed", hint="load the model again")
            self._waiting.append(piece)
            self._cond.notify_all()
        piece.done.wait()
        if piece.error is not None:
            raise piece.error
        assert piece.out is not None
        return piece.out

    def _release_slot(self) -> bool:
        """A slot closed; True for the last one, once the thread has stopped (the engine then frees what it
        shares)."""
        with self._cond:
            self._open -= 1
            last = self._open == 0
            if last:
                self._closed = True
                self._cond.notify_all()
        if last:
            self._thread.join()
        return last

    def chunk_tokens(self, slot: object, full: int, left: int) -> int:
        """How many of the `left` tokens of `slot`'s forward its next piece carries (at most `full`, its
        decoder's chunk): all that fit in one piece anyway (a decode step: no lock taken), `full` while no
        other slot streams (the last step carried none, none waits: a slot whose request just ended still
        counts for one step), else `chunk_for`'s share at the measured prompt rate."""
        if left <= min(full, MIN_CHUNK):
            return full
        with self._cond:
            others = any(s != id(slot) for s in self._expected) or any(
                p.slot is not slot for p in self._waiting
            )
            seconds = self._chunk_time / self._chunk_tokens if self._chunk_tokens else None
        return chunk_for(full, others, seconds)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def mean_batch(self) -> float:
        return self.pieces / self.steps if self.steps else 0.0

    # -- the thread ------------------------------------------------------------------------------------
    def _step(self, batch: list[Any]) -> None:
        """Run one step's pieces: each gets its `out` or `error`, and its `done` set."""
        raise NotImplementedError

    def _loop(self) -> None:
        try:
            while True:
                batch = self._gather()
                if batch is None:
                    return
                began = time.perf_counter()
                self._step(batch)
                self._timed(batch, time.perf_counter() - began)
        finally:  # however the thread ends, nobody waits for it: the pieces still waiting fail
            with self._cond:
                self._closed, waiting, self._waiting = True, self._waiting, []
            for p in waiting:
                p.error = DeviceError("the batch engine stopped", hint="load the model again")
                p.done.set()

    def _timed(self, batch: list[Any], seconds: float) -> None:
        """A step that carried a prompt chunk of at least MIN_CHUNK tokens adds to the prompt rate: the whole
        step's time, which the other slots waited (their rows' run included), per chunk token. A prompt's
        short last piece is left out (a step's fixed cost over few tokens). The slots were answered before
        this is noted: a piece cut meanwhile takes the rate one step older."""
        chunk = next((p for p in batch if p.chunk and p.error is None and p.n >= MIN_CHUNK), None)
        if chunk is None:
            return
        with self._cond:
            self._chunk_time = self._chunk_time / 2 + seconds
            self._chunk_tokens = self._chunk_tokens / 2 + chunk.n

    def _gather(self) -> list[Any] | None:
        """The pieces of the next step: wait for one, then up to `linger` for the last step's slots."""
        with self._cond:
            while not self._waiting and not self._closed:
                self._cond.wait()
            if self._closed and not self._waiting:
                return None
            deadline = time.monotonic() + self.linger
            while not self._closed and not self._expected <= {id(p.slot) for p in self._waiting}:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch, self._rested = select(self._waiting, self._rested)
            self._waiting = [p for p in self._waiting if p not in batch]
            self._expected = {id(p.slot) for p in batch}
            return batch


class _Waiting(Protocol):
    chunk: bool
    urgent: bool


W = TypeVar("W", bound=_Waiting)


def select(waiting: Sequence[W], rested: int) -> tuple[list[W], int]:
    """The pieces of the next step, in arrival order, and the next call's `rested` (steps without a prompt
    chunk since the last one that carried one). One chunk a step; while other pieces wait, none right after a
    chunk's step, nor for two steps more while an urgent piece waits (devices/batch.py's docstring)."""
    others = [p for p in waiting if not p.chunk]
    urgent = any(p.urgent for p in others)
    allowed = not others or rested >= 3 or (rested >= 1 and not urgent)
    batch, took = [], False
    for p in waiting:
        if p.chunk:
            if took or not allowed:
                continue
            took = True
        batch.append(p)
    return batch, 0 if took else rested + 1


def chunk_for(full: int, others: bool, seconds_per_token: float | None) -> int:
    """A prompt piece's tokens (at most `full`, the decoder's chunk): all of them while no other slot streams
    (`others`); beside streaming ones what runs in about CHUNK_TARGET_S at `seconds_per_token` (None: not
    measured yet), in whole staging windows, at least MIN_CHUNK."""
    floor = min(full, MIN_CHUNK)
    if not others:
        return full
    if seconds_per_token is None or seconds_per_token <= 0:
        return floor
    fits = int(CHUNK_TARGET_S / seconds_per_token) // WINDOW * WINDOW
    return max(floor, min(full, fits))
