"""The Python API for applications: `edge.load(...)` returns a `Model` to generate, stream and chat with.

A thin facade over `edge.model` (the engine): keyword options instead of config objects, cancellation by an
event or a callback, and multi-turn chat that reuses the KV cache of earlier turns. Example::

    import edge

    with edge.load("smollm2-135m") as model:
        print(model.generate("Why is the sky blue?", max_tokens=64).text)
        for piece in model.stream("Write a haiku about the sea"):
            print(piece, end="", flush=True)

See docs/api.md for the whole surface.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from edge.generate import GenerationConfig
from edge.model import LoadOptions, Result
from edge.model import Model as Engine
from edge.model import load as load_engine
from edge.models.store import PullProgress
from edge.sampling import SamplingConfig
from edge.session import KVState

__all__ = ["ChatMessage", "GenerateOptions", "Model", "PullProgress", "Result", "Stream", "load"]

ChatMessage = Mapping[str, Any]  # {"role": "system" | "user" | "assistant", "content": str}


class _Event(Protocol):
    def is_set(self) -> bool: ...


# A threading.Event (set it to stop) or a callable polled between tokens (return True to stop).
Cancel: TypeAlias = "_Event | Callable[[], bool] | None"


@dataclass(frozen=True)
class GenerateOptions:
    """Per-call options; every `Model` method takes them as keyword arguments."""

    max_tokens: int = 256
    temperature: float = 0.0  # 0: greedy (deterministic)
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def config(self) -> GenerationConfig:
        sampling = SamplingConfig(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            seed=self.seed,
        )
        return GenerationConfig(max_tokens=self.max_tokens, stop=tuple(self.stop), sampling=sampling)


def _poller(cancel: Cancel) -> Callable[[], bool] | None:
    if cancel is None:
        return None
    is_set = getattr(cancel, "is_set", None)
    if callable(is_set):
        return is_set  # type: ignore[no-any-return]
    if callable(cancel):
        return cancel
    raise TypeError(
        f"cancel must be a threading.Event-like object or a callable, not {type(cancel).__name__}"
    )


class Stream:
    """Text pieces as they are generated; after iteration `.result` holds the `Result`.

    Iterating holds the model (other calls wait); `close()` or leaving a `with` block early stops the
    generation and frees it::

        with model.stream("Tell me a story") as s:
            for piece in s:
                print(piece, end="")
        print(s.result.stats.decode_tok_s)
    """

    def __init__(self, pieces: Generator[str, None, Result]) -> None:
        self._pieces = pieces
        self.result: Result | None = None

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        try:
            return next(self._pieces)
        except StopIteration as stop:
            self.result = stop.value
            raise StopIteration from None

    def close(self) -> None:
        self._pieces.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Model:
    """A loaded model. Thread-safe: concurrent calls are queued, one generation at a time per model, so tokens
    of two calls never mix in one KV cache. Each call reuses the KV the previous one left where the prompts
    share a prefix (a chat's earlier turns), so a turn prefills only its new text.

    >>> import edge, threading
    >>> stop = threading.Event()
    >>> with edge.load("smollm2-135m") as m:                       # doctest: +SKIP
    ...     r = m.chat([{"role": "user", "content": "Hi!"}], max_tokens=32, cancel=stop)
    ...     print(r.text, r.stats.ttft_ms, r.backend, r.device)
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- what was loaded -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def backend(self) -> str:
        return self.engine.placement.backend

    @property
    def backend_choice(self) -> str | None:
        """Why auto chose `backend` (measured here, the recorded prior, ...); None when the backend was named."""
        choice = self.engine.placement.auto
        return None if choice is None else choice.explain()

    @property
    def device(self) -> str:
        return self.engine.placement.device

    @property
    def fallback(self) -> str | None:
        """None, or what replaced what: "npu -> cpu" when the requested device was absent, "ort:gpu failed ->
        ort:cpu" after a device failed mid-run (loaded with fallback; the failing call raised DeviceLostError)."""
        return self.engine.placement.fallback

    @property
    def plan(self) -> str | None:
        """The planner's plan and why (what `edge run --explain` prints) when the device request went through
        it (auto, hetero:..., an emulated NPU); None for one whole-model device."""
        plan = self.engine.plan
        return None if plan is None else plan.explain()

    @property
    def has_chat_template(self) -> bool:
        """False for a base model: `chat` then runs as plain completion over the messages' contents."""
        return self.engine.template is not None

    @property
    def draft(self) -> str | None:
        spec = self.engine.speculative
        return None if spec is None else spec.name

    def kv_state(self) -> KVState:
        """Position and fill of the KV cache (ring buffer fill and wrap where the backend has one)."""
        with self.engine._lock:
            return self.engine.session.state()

    def reset(self) -> None:
        """Forget the KV cache (the next call prefills its whole prompt)."""
        with self.engine._lock:
            self.engine.session.invalidate()

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str,
        *,
        system: str | None = None,
        raw: bool = False,
        on_text: Callable[[str], None] | None = None,
        cancel: Cancel = None,
        **options: Any,
    ) -> Result:
        """Answer one prompt (the chat template applied unless `raw` or a base model).

        `options` are `GenerateOptions` fields (max_tokens, temperature, top_k, top_p, min_p, repeat_penalty,
        seed, stop) and `reuse` (default True: keep the KV of the previous call up to the common prefix;
        False: prefill from scratch). `on_text` gets each text piece as it comes; `cancel` (a threading.Event
        or a callable) stops the generation within one token, with `result.stats.stop_reason == "cancelled"`.

        >>> m.generate("2+2=", raw=True, max_tokens=4).text          # doctest: +SKIP
        '4'
        """
        ids = self.engine.prompt_ids(prompt, raw=raw, system=system)
        return self._run(ids, on_text, cancel, options)

    def stream(
        self,
        prompt: str,
        *,
        system: str | None = None,
        raw: bool = False,
        cancel: Cancel = None,
        **options: Any,
    ) -> Stream:
        """Like `generate`, as an iterator of text pieces (`Stream`; its `.result` is set at the end).

        >>> for piece in m.stream("Name three colours", max_tokens=24):   # doctest: +SKIP
        ...     print(piece, end="", flush=True)
        """
        ids = self.engine.prompt_ids(prompt, raw=raw, system=system)
        return self._stream(ids, cancel, options)

    def chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        on_text: Callable[[str], None] | None = None,
        cancel: Cancel = None,
        **options: Any,
    ) -> Result:
        """Answer the last message of a conversation (the whole list is the prompt; append the answer and the
        next user message for the next turn: the earlier turns' KV is reused). When the conversation outgrows
        the context its oldest turns are dropped and the system prompt kept (`result.stats.window_note`).

        >>> msgs = [{"role": "user", "content": "Name a fruit."}]             # doctest: +SKIP
        >>> msgs.append({"role": "assistant", "content": m.chat(msgs).text})
        >>> msgs.append({"role": "user", "content": "Another one?"})
        >>> m.chat(msgs).stats.n_cached_tokens > 0
        True
        """
        keep = self.engine.system_span(messages)
        return self._run(self.chat_ids(messages), on_text, cancel, options, keep)

    def chat_stream(
        self, messages: Sequence[ChatMessage], *, cancel: Cancel = None, **options: Any
    ) -> Stream:
        """`chat` as an iterator of text pieces (`Stream`)."""
        ids = self.chat_ids(messages)
        return self._stream(ids, cancel, options, self.engine.system_span(messages))

    def chat_ids(self, messages: Sequence[ChatMessage]) -> list[int]:
        """The prompt ids of a conversation: the chat template with the generation prompt, or for a base model
        the contents concatenated."""
        return self.engine.encode_prompt(self.engine.render_chat(messages))

    def _run(
        self,
        ids: Sequence[int],
        on_text: Callable[[str], None] | None,
        cancel: Cancel,
        options: Mapping[str, Any],
        keep: int | None = None,
    ) -> Result:
        stream = self._stream(ids, cancel, options, keep)
        with stream:
            for piece in stream:
                if on_text is not None:
                    on_text(piece)
        assert stream.result is not None
        return stream.result

    def _stream(
        self, ids: Sequence[int], cancel: Cancel, options: Mapping[str, Any], keep: int | None = None
    ) -> Stream:
        """`keep`: a conversation's system prompt span (kept when older turns leave the window), None for a
        single prompt (too long for the context stays an error)."""
        opts = dict(options)
        reuse = bool(opts.pop("reuse", True))
        config = GenerateOptions(**opts).config()  # invalid options fail before the model is taken
        return Stream(self.engine.stream_ids(ids, config, cancel=_poller(cancel), reuse=reuse, keep=keep))

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the model (waits for a running generation)."""
        self.engine.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<edge.Model {self.name} on {self.backend}:{self.device}>"


def load(
    model: str | None = None,
    *,
    device: str = "cpu",
    backend: str | None = "auto",
    draft: str | None = "auto",
    fallback: bool | str = False,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    draft_device: str = "cpu",
    emulate: bool = False,
    precision: str = "fast",
    on_progress: PullProgress | None = None,
) -> Model:
    """Load a catalog model (pulled and checked on first use) or a local .gguf file.

    `device`: cpu | gpu | npu | auto | hetero:[backend:]device,... (e.g. "hetero:openvino:cpu,ort:cpu": the
    layers split into partitions across the listed devices by the planner); an absent device raises
    `edge.DeviceError` listing what exists, unless `fallback=True` (or a device kind, "cpu") — then
    `model.fallback` says what replaced what. `emulate=True` with device="npu" runs the NPU-shaped (static)
    graphs on the CPU. `backend`: auto (default: the backend that measures fastest for this model on this
    machine; `model.backend_choice` says why) | llamacpp | ort | openvino. `draft`: speculative decoding: "auto"
    (prompt lookup, plus a compatible draft model already pulled, on the own-graph backends), "none", "ngram" or
    a draft model. `precision`: "fast" (int8 activations where a graph backend has them, as
    llama.cpp computes) or "exact" (fp32 math on the file's own blocks). `on_progress(done_bytes, total_bytes,
    phase)` sees the pull of a catalog model not downloaded yet: phase "download" while it arrives, then
    "verified" once; None shows it on stderr.

    >>> import edge
    >>> with edge.load("smollm2-135m", device="cpu") as m:           # doctest: +SKIP
    ...     print(m.generate("Hello", max_tokens=8).text)
    """
    opts = LoadOptions(
        backend=backend,
        device=device,
        fallback=fallback,
        emulate=emulate,
        n_ctx=n_ctx,
        n_threads=n_threads,
        precision=precision,
        draft=draft,
        draft_device=draft_device,
    )
    return Model(load_engine(model, opts, on_progress=on_progress))
