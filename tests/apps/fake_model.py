"""A stand-in for `edge.Model` with fixed output and stats, so screenshots of the app do not vary."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from edge.generate import GenerationStats
from edge.model import Result, Stream
from edge.models.chat_template import ChatTemplate
from edge.session import KVState

ANSWER = "Paris is the capital of France.\n\n```python\nprint('bonjour')\n```\n\n- the Seine\n- the Louvre"


class FakeModel:
    name = "fake-135m"
    backend = "llamacpp"
    device = "cpu"
    draft = None
    load_note = None

    def __init__(
        self,
        *,
        fallback: str | None = None,
        chat_template: bool = True,
        delay_s: float = 0.0,
        answer: str = ANSWER,
        template: ChatTemplate | None = None,
    ) -> None:
        self.fallback = fallback
        self.answer = answer
        self.template = template
        self.has_chat_template = chat_template
        self.delay_s = delay_s
        self.calls: list[list[dict[str, str]]] = []
        self.warmed: list[str | None] = []  # the system prompts warm_up was called with
        self.closed = False

    def kv_state(self) -> KVState:
        n = 40 * len(self.calls)
        return KVState(position=n, capacity=4096, fill=n, ring=False)

    def chat_stream(
        self, messages: Sequence[Mapping[str, Any]], *, cancel: Any = None, **options: Any
    ) -> Stream:
        self.calls.append([dict(m) for m in messages])
        is_set: Callable[[], bool] = cancel.is_set if cancel is not None else (lambda: False)
        return Stream(self._pieces(is_set))

    def _pieces(self, is_set: Callable[[], bool]) -> Generator[str, None, Result]:
        words = self.answer.split(" ")
        out = []
        stop = ""
        for i, w in enumerate(words):
            if is_set():
                stop = "cancelled"
                break
            piece = w if i == 0 else " " + w
            out.append(piece)
            yield piece
            if self.delay_s:
                threading.Event().wait(self.delay_s)
        text = "".join(out)
        stats = GenerationStats(
            n_prompt_tokens=30,
            n_cached_tokens=20 if len(self.calls) > 1 else 0,
            n_tokens=len(out),
            ttft_ms=42.0,
            prefill_s=0.01,
            decode_s=0.1,
            decode_steps=len(out) - 1,
            stop_reason=stop or "eos",
        )
        return Result(text, list(range(len(out))), list(range(30)), stats, "llamacpp", "cpu", self.fallback)

    def warm_up(self, system: str | None = None, **options: Any) -> int:
        self.warmed.append(system)
        return 0

    def close(self) -> None:
        self.closed = True

    def stream(self, prompt: str, **options: Any) -> Stream:
        return self.chat_stream([{"role": "user", "content": prompt}], **options)
