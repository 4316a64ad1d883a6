"""Text a generation worker produced that the UI has not shown yet.

The worker only appends here and never waits for the UI; a UI timer takes what is new a few times a second.
NOTE: a blocking `call_from_thread` per token tied the decode speed to the Markdown re-render (4-12 tok/s
instead of ~100 on 2 cores); batching on the UI side keeps the model at full speed.
"""

from __future__ import annotations

import threading
import time

from edge.apps.tui.stats import Live


class Pending:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parts: list[str] = []
        self._t0 = time.perf_counter()
        self._first = 0.0
        self._last = 0.0
        self.pieces = 0

    def push(self, piece: str) -> None:
        """Called by the worker for each text piece."""
        now = time.perf_counter()
        with self._lock:
            self._parts.append(piece)
            self.pieces += 1
            self._first = self._first or now
            self._last = now

    def take(self) -> tuple[str, Live | None]:
        """Called by the UI: the text since the last call, and the live stats (None before the first piece)."""
        with self._lock:
            text = "".join(self._parts)
            self._parts.clear()
            if not self.pieces:
                return text, None
            live = Live(self.pieces, 1e3 * (self._first - self._t0), self._last - self._first)
        return text, live
