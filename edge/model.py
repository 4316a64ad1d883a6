"""`Model`: a loaded model, the one object applications (`edge.load`), the CLI, the server and the chat app use.

It holds the tokenizer, the chat template, the decoder and the KV session, serializes generations, renders
prompts and chats, and moves to another device when its own fails mid-run (with fallback). Example::

    import edge

    with edge.load("smollm2-135m") as model:
        print(model.generate("Why is the sky blue?", max_tokens=64).text)
        for piece in model.stream("Write a haiku about the sea"):
            print(piece, end="", flush=True)

See docs/api.md for the whole surface.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from edge.devices.base import BatchStats, Decoder, warm_kernels
from edge.devices.placement import Placement
from edge.devices.planner import Plan
from edge.devices.registry import DecoderOptions, open_decoder, runnable_backends
from edge.drafters import auto_drafts_on, verify_backend
from edge.errors import ContextOverflowError, DeviceError, DeviceLostError, EdgeError, ToolError
from edge.generate import Generation, GenerationConfig, GenerationStats
from edge.logprobs import TokenLogprob
from edge.models.chat_template import ChatTemplate, template_from_metadata
from edge.models.checked import CheckedModel
from edge.options import Cancel, GenerateOptions, LoadOptions, cancel_poller
from edge.reasoning import Thinking, ThinkingConfig, ThinkingPlan, plan_thinking
from edge.session import KVSession, KVState, common_prefix
from edge.speculative import SpeculativeDecoding, drafts_greedy, open_speculative
from edge.tools import CallSplitter, ToolCall, ToolPlan, plan_tools, template_messages

__all__ = ["ChatMessage", "Model", "Result", "Stream"]

ChatMessage = Mapping[str, Any]  # {"role": "system" | "user" | "assistant", "content": str}

log = logging.getLogger("edge")

# First user messages whose rendered chats share what every first turn opens with: different first characters,
# a common word, a leading space and newline, so a merge of the template's last token with the content shows
# (a first turn that still parts sooner only reuses less: the session keeps the common prefix and rolls back)
_OPENING_PROBES = ("Hi", "The", "7", "¿Zürich?", " x", "\nx")
WARM_PIECE = 256  # the opening is prefilled in pieces of this many ids, so close() waits for one at most


def _pieces(start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) in pieces of WARM_PIECE ids, a one-id tail joined to the piece before it: llama.cpp computes
    a one-token batch's K/V with other kernels than a prefill's (edge.session.KVSession.prepare)."""
    bounds = [*range(start, end, WARM_PIECE), end]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]
    return list(itertools.pairwise(bounds))


@dataclass(frozen=True)
class Result:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    stats: GenerationStats
    backend: str
    device: str
    fallback: str | None
    # the calls a chat with tools made (their text is not in `text`, which holds the rest of the answer)
    tool_calls: tuple[ToolCall, ...] = ()
    # per-token log-probs (edge.logprobs), one per token id, when the call asked `logprobs=N`; else None
    logprobs: tuple[TokenLogprob, ...] | None = None
    # a thinking model's thoughts (the text of its <think> block; not in `text`), from `chat`
    reasoning: str = ""


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


def _config(
    config: GenerationConfig | None, options: Mapping[str, Any], tools: ToolPlan | None = None
) -> GenerationConfig:
    """A call's GenerationConfig: the one given, or built from `GenerateOptions` keywords (invalid ones fail
    before the model is taken); with tools, the response_format's grammar inside the tool calls' one."""
    if config is None:
        config = GenerateOptions(**options).config()
    elif options:
        raise TypeError(f"pass a GenerationConfig or keyword options, not both (got {sorted(options)})")
    return config if tools is None else tools.constrain(config)


def _with_calls(pieces: Generator[str, None, Result], plan: ToolPlan) -> Generator[str, None, Result]:
    """A generation's pieces with its tool calls taken out: content pieces are yielded as they are certain, the
    calls land in the Result."""
    splitter = CallSplitter(plan)
    content = _split_pieces(
        pieces, splitter.feed, splitter.finish, lambda x: x if isinstance(x, str) else None
    )
    result, text, calls = yield from content
    return replace(result, text=text, tool_calls=tuple(x for x in calls if isinstance(x, ToolCall)))


def _with_reasoning(
    pieces: Generator[str, None, Result], thinking: ThinkingConfig
) -> Generator[str, None, Result]:
    """A thinking model's pieces with its thoughts taken out: the content is yielded, the thoughts land in the
    Result's `reasoning`."""
    splitter = thinking.splitter()
    content = _split_pieces(pieces, splitter.feed, splitter.finish, lambda p: None if p[0] else p[1])
    result, text, thoughts = yield from content
    return replace(result, text=text, reasoning="".join(t for _, t in thoughts))


def _split_pieces(
    pieces: Generator[str, None, Result],
    feed: Callable[[str], list[Any]],
    finish: Callable[[], list[Any]],
    content_of: Callable[[Any], str | None],
) -> Generator[str, None, tuple[Result, str, list[Any]]]:
    """`pieces` through a streaming splitter: the content (what `content_of` gives text for) is yielded as the
    splitter is sure of it; returns the generation's Result, the whole content and the other parts, in order."""
    text: list[str] = []
    others: list[Any] = []

    def sort(parts: list[Any]) -> list[str]:
        content = []
        for part in parts:
            piece = content_of(part)
            if piece is None:
                others.append(part)
            else:
                content.append(piece)
        text.extend(content)
        return content

    try:
        while True:
            try:
                piece = next(pieces)
            except StopIteration as stop:
                result: Result = stop.value
                break
            yield from sort(feed(piece))
        yield from sort(finish())
    finally:
        pieces.close()
    return result, "".join(text), others


def _asked_thinking(thinking: Thinking | bool | None) -> Thinking | None:
    return Thinking(on=thinking, param="thinking") if isinstance(thinking, bool) else thinking


def chat_template_of(checked: CheckedModel) -> ChatTemplate | None:
    """The model's chat template, compiled (None for a base model); a hostile one raises TemplateError."""
    tok = checked.tokenizer
    bos = tok.decode([tok.bos_id]) if tok.bos_id is not None else ""
    eos = tok.decode([tok.eos_id]) if tok.eos_id is not None else ""
    return template_from_metadata(checked.gguf.metadata, bos_token=bos, eos_token=eos)


class Model:
    """A loaded model (`edge.load` makes one). Thread-safe: concurrent calls are queued, one generation at a
    time per model, so tokens of two calls never mix in one KV cache. Each call reuses the KV the previous one
    left where the prompts share a prefix (a chat's earlier turns), so a turn prefills only its new text.

    >>> import edge, threading
    >>> stop = threading.Event()
    >>> with edge.load("smollm2-135m") as m:                       # doctest: +SKIP
    ...     r = m.chat([{"role": "user", "content": "Hi!"}], max_tokens=32, cancel=stop)
    ...     print(r.text, r.stats.ttft_ms, r.backend, r.device)
    """

    def __init__(
        self,
        checked: CheckedModel,
        decoder: Decoder,
        placement: Placement,
        *,
        device_plan: Plan | None = None,
        options: LoadOptions | None = None,
    ) -> None:
        self.checked = checked  # what a device switch opens again, unchecked never
        self.name = checked.name
        self.path = checked.path
        self.gguf = checked.gguf
        self.tokenizer = checked.tokenizer
        self.template: ChatTemplate | None = chat_template_of(checked)
        self.decoder = decoder
        self.placement = placement
        self.device_plan = device_plan  # the planner's plan, when the device request went through it
        self.options = options or LoadOptions()  # n_ctx, threads and fallback for a device switch
        self.session = KVSession(decoder)  # the ids the KV holds: each prompt prefills only its new suffix
        self.speculative: SpeculativeDecoding | None = None  # edge.load(..., draft=...) sets it
        self._lock = threading.RLock()
        self._closing = threading.Event()  # close() was called: a warm-up stops at its next piece
        self._busy = False  # a generation is running (the RLock alone lets one thread interleave two)
        self._closed = False
        self._handed_over = False  # `slots` gave the decoder to a batch engine

    # -- what was loaded -------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self.placement.backend

    @property
    def backend_choice(self) -> str | None:
        """Why auto chose `backend` (measured here, the recorded prior, ...); None when the backend was named."""
        choice = self.placement.auto
        return None if choice is None else choice.explain()

    @property
    def device(self) -> str:
        return self.placement.device

    @property
    def fallback(self) -> str | None:
        """None, or what replaced what: "npu -> cpu" when the requested device was absent, "ort:gpu failed ->
        ort:cpu" after a device failed mid-run (loaded with fallback; the failing call raised DeviceLostError)."""
        return self.placement.fallback

    @property
    def load_note(self) -> str | None:
        """What the load chose for the caller beyond the device, said once: the KV cache kept in f16 where
        `kv_dtype="auto"`'s f32 would not fit in memory; None when it chose nothing."""
        return self.placement.note

    @property
    def plan(self) -> str | None:
        """The planner's plan and why (what `edge run --explain` prints) when the device request went through
        it (auto, hetero:..., an emulated NPU); None for one whole-model device."""
        return None if self.device_plan is None else self.device_plan.explain()

    @property
    def has_chat_template(self) -> bool:
        """False for a base model: `chat` then runs as plain completion over the messages' contents."""
        return self.template is not None

    @property
    def draft(self) -> str | None:
        return None if self.speculative is None else self.speculative.name

    def kv_state(self) -> KVState:
        """Position and fill of the KV cache (ring buffer fill and wrap where the backend has one)."""
        with self._lock:
            return self.session.state()

    def reset(self) -> None:
        """Forget the KV cache (the next call prefills its whole prompt)."""
        with self._lock:
            self.session.invalidate()

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """One generation at a time: other threads wait; a second one started by the same thread (two
        streams iterated in turn) would interleave tokens into one KV cache, so it is refused."""
        with self._lock:
            if self._handed_over:
                raise EdgeError(
                    f"{self.name} was split into slots: generate on the slots", hint="see Model.slots"
                )
            if self._busy:
                raise EdgeError(
                    "this model is already generating (an unfinished stream in this thread)",
                    hint="consume or close the first stream before starting another",
                )
            self._busy = True
            try:
                yield
            finally:
                self._busy = False

    # -- prompts ---------------------------------------------------------------------------------
    def encode_prompt(self, text: str) -> list[int]:
        """Token ids of a full prompt text: special-token text parsed, BOS added when the model wants one."""
        ids = self.tokenizer.encode(text, parse_special=True)
        tok = self.tokenizer
        if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
            ids.insert(0, tok.bos_id)
        return ids

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        tools: ToolPlan | None = None,
        thinking: ThinkingPlan | None = None,
        *,
        generation: bool = True,
    ) -> str:
        """The conversation as the prompt text; with `tools` (`tool_plan`), written the way they say; with
        `thinking` (`thinking_plan`), its switch given to the template. `generation` False: without the
        template's opening of the answer."""
        messages = template_messages(messages) if tools is None else tools.messages(messages)
        if self.template is None:
            # a base model: plain completion over the concatenated contents
            return "".join(str(m.get("content", "")) for m in messages)
        extra = {} if tools is None else tools.template_kwargs()
        if thinking is not None:
            extra.update(thinking.template_kwargs())
        return self.template.render(messages, add_generation_prompt=generation, **extra)

    def thinking_config(
        self, messages: Sequence[ChatMessage], prompt: str, tools: ToolPlan | None, thinking: ThinkingPlan
    ) -> ThinkingConfig:
        """Where the answer of `prompt` (the conversation rendered) starts, read from the text the template adds
        after the conversation alone, so that think tags a message holds (a user quoting one) do not count."""
        head = self.render_chat(messages, tools, thinking, generation=False)
        return thinking.config(prompt[len(head) :] if prompt.startswith(head) else prompt)

    def thinking_plan(self, asked: Thinking | None = None) -> ThinkingPlan | None:
        """What a request's thinking means for this model (ThinkingError where it asks a model that does not
        think); None where nothing of thinking applies."""
        return plan_thinking(None if self.template is None else self.template.thinking, asked)

    def tool_plan(
        self, tools: Sequence[Any] | None, tool_choice: Any = None, parallel: bool | None = None
    ) -> ToolPlan | None:
        """What OpenAI's `tools` / `tool_choice` / `parallel_tool_calls` mean for this model (ToolError where they
        are invalid or the model cannot call tools); None where there are none."""
        return plan_tools(self.template, self.tokenizer, tools, tool_choice, parallel)

    def system_span(self, messages: Sequence[ChatMessage]) -> int:
        """How many leading ids of the conversation's rendered prompt are its system prompt (kept when older
        turns leave the window): the leading system messages rendered alone, or a default system prompt the
        template adds (a user turn and an assistant turn rendered first share it). 0 when there is none."""
        if self.template is None:
            return 0
        try:
            system = [m for m in messages[:1] if m.get("role") == "system"]
            if system:
                head = self.encode_prompt(self.template.render(system, add_generation_prompt=False))
                return common_prefix(head, self.encode_prompt(self.render_chat(messages)))
            # NOTE: minus 1: the turn opener (e.g. <|im_start|>) the two share after the default system prompt
            a, b = ({"role": r, "content": "x"} for r in ("user", "assistant"))
            user = self.encode_prompt(self.template.render([a], add_generation_prompt=False))
            assistant = self.encode_prompt(self.template.render([b], add_generation_prompt=False))
            return max(0, common_prefix(user, assistant) - 1)
        except EdgeError:  # a template that refuses these shapes: pin nothing beyond the default sink
            return 0

    def prompt_ids(self, prompt: str, *, raw: bool = False, system: str | None = None) -> list[int]:
        if raw or self.template is None:
            return self.encode_prompt(prompt)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        return self.encode_prompt(self.render_chat(messages))

    def chat_ids(self, messages: Sequence[ChatMessage], tools: ToolPlan | None = None) -> list[int]:
        """The prompt ids of a conversation: the chat template with the generation prompt, or for a base model
        the contents concatenated."""
        return self.encode_prompt(self.render_chat(messages, tools))

    # -- generation ------------------------------------------------------------------------------
    def generate(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        *,
        system: str | None = None,
        raw: bool = False,
        on_text: Callable[[str], None] | None = None,
        cancel: Cancel = None,
        reuse: bool = True,
        **options: Any,
    ) -> Result:
        """Answer one prompt (the chat template applied unless `raw` or a base model).

        `options` are `GenerateOptions` fields (max_tokens, temperature, top_k, top_p, min_p, repeat_penalty,
        seed, stop, response_format, logprobs: `result.logprobs`), or `config` a whole GenerationConfig.
        `reuse` (default True) keeps the KV of the previous call up to the common prefix; False prefills from
        scratch. `on_text` gets each text piece as it comes; `cancel` (a threading.Event or a callable) stops
        the generation within one token, with `result.stats.stop_reason == "cancelled"`.

        >>> m.generate("2+2=", raw=True, max_tokens=4).text          # doctest: +SKIP
        '4'
        """
        if "tools" in options or "tool_choice" in options:  # a tool request is a one-turn chat
            return self.chat(
                self._turn_of(prompt, raw, system),
                config,
                on_text=on_text,
                cancel=cancel,
                reuse=reuse,
                **options,
            )
        ids = self.prompt_ids(prompt, raw=raw, system=system)
        return self._run(ids, _config(config, options), on_text, cancel, reuse)

    def _turn_of(self, prompt: str, raw: bool, system: str | None) -> list[dict[str, str]]:
        if raw:
            raise ToolError("tools need the chat template; drop raw=True")
        return [
            *([{"role": "system", "content": system}] if system else []),
            {"role": "user", "content": prompt},
        ]

    def stream(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        *,
        system: str | None = None,
        raw: bool = False,
        cancel: Cancel = None,
        reuse: bool = True,
        **options: Any,
    ) -> Stream:
        """Like `generate`, as an iterator of text pieces (`Stream`; its `.result` is set at the end).

        >>> for piece in m.stream("Name three colours", max_tokens=24):   # doctest: +SKIP
        ...     print(piece, end="", flush=True)
        """
        if "tools" in options or "tool_choice" in options:
            return self.chat_stream(
                self._turn_of(prompt, raw, system), config, cancel=cancel, reuse=reuse, **options
            )
        ids = self.prompt_ids(prompt, raw=raw, system=system)
        return self._stream(ids, _config(config, options), cancel, reuse)

    def chat(
        self,
        messages: Sequence[ChatMessage],
        config: GenerationConfig | None = None,
        *,
        on_text: Callable[[str], None] | None = None,
        cancel: Cancel = None,
        reuse: bool = True,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        parallel_tool_calls: bool | None = None,
        thinking: Thinking | bool | None = None,
        **options: Any,
    ) -> Result:
        """Answer the last message of a conversation (the whole list is the prompt; append the answer and the
        next user message for the next turn: the earlier turns' KV is reused). When the conversation outgrows
        the context its oldest turns are dropped and the system prompt kept (`result.stats.window_note`).

        `tools` / `tool_choice` / `parallel_tool_calls` as in OpenAI's API: the calls the model makes are in
        `result.tool_calls` (arguments valid against their schema, guaranteed by constrained decoding), the rest
        of the answer in `result.text`. A history may hold assistant messages with `tool_calls` and
        `{"role": "tool", "content": ..., "tool_call_id": ...}` results.

        A thinking model's thoughts are in `result.reasoning`, apart from `result.text`; `thinking` turns them
        on or off (a `Thinking` also sets a token budget; None: the template's default). Asking a model that
        does not think is a ThinkingError.

        >>> msgs = [{"role": "user", "content": "Name a fruit."}]             # doctest: +SKIP
        >>> msgs.append({"role": "assistant", "content": m.chat(msgs).text})
        >>> msgs.append({"role": "user", "content": "Another one?"})
        >>> m.chat(msgs).stats.n_cached_tokens > 0
        True
        """
        plan = self.tool_plan(tools, tool_choice, parallel_tool_calls)
        think = self.thinking_plan(_asked_thinking(thinking))
        stream = self._chat_stream(messages, config, options, cancel, reuse, plan, think)
        with stream:
            for piece in stream:
                if on_text is not None:
                    on_text(piece)
        assert stream.result is not None
        return stream.result

    def chat_stream(
        self,
        messages: Sequence[ChatMessage],
        config: GenerationConfig | None = None,
        *,
        cancel: Cancel = None,
        reuse: bool = True,
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        parallel_tool_calls: bool | None = None,
        thinking: Thinking | bool | None = None,
        **options: Any,
    ) -> Stream:
        """`chat` as an iterator of text pieces (`Stream`); with tools, the pieces are the answer's text and the
        calls are in `.result.tool_calls`; a thinking model's thoughts are in `.result.reasoning`."""
        plan = self.tool_plan(tools, tool_choice, parallel_tool_calls)
        think = self.thinking_plan(_asked_thinking(thinking))
        return self._chat_stream(messages, config, options, cancel, reuse, plan, think)

    def _chat_stream(
        self,
        messages: Sequence[ChatMessage],
        config: GenerationConfig | None,
        options: Mapping[str, Any],
        cancel: Cancel,
        reuse: bool,
        plan: ToolPlan | None,
        think: ThinkingPlan | None = None,
    ) -> Stream:
        config = _config(config, options, plan)
        text = self.render_chat(messages, plan, think)
        ids = self.encode_prompt(text)
        if think is not None:  # the grammar, if any, applies after the thinking
            config = replace(config, thinking=self.thinking_config(messages, text, plan, think))
        keep = self.system_span(messages if plan is None else plan.messages(messages))
        pieces = self.stream_ids(ids, config, cancel=cancel_poller(cancel), reuse=reuse, keep=keep)
        if config.thinking is not None:
            pieces = _with_reasoning(pieces, config.thinking)
        return Stream(pieces if plan is None or not plan.active else _with_calls(pieces, plan))

    def _run(
        self,
        ids: Sequence[int],
        config: GenerationConfig,
        on_text: Callable[[str], None] | None,
        cancel: Cancel,
        reuse: bool,
        keep: int | None = None,
    ) -> Result:
        stream = self._stream(ids, config, cancel, reuse, keep)
        with stream:
            for piece in stream:
                if on_text is not None:
                    on_text(piece)
        assert stream.result is not None
        return stream.result

    def _stream(
        self,
        ids: Sequence[int],
        config: GenerationConfig,
        cancel: Cancel,
        reuse: bool,
        keep: int | None = None,
    ) -> Stream:
        """`keep`: a conversation's system prompt span (kept when older turns leave the window), None for a
        single prompt (too long for the context stays an error)."""
        if keep is None:
            self._check_prompt_fits(ids)
        return Stream(self.stream_ids(ids, config, cancel=cancel_poller(cancel), reuse=reuse, keep=keep))

    def _check_prompt_fits(self, ids: Sequence[int]) -> None:
        """A single prompt must fit the KV whole, on every backend: an own graph's ring buffer would otherwise
        drop the prompt's start before the model answered (llama.cpp's linear cache refuses it itself)."""
        capacity = self.decoder.kv_fill().capacity
        if len(ids) >= capacity:
            raise ContextOverflowError(
                f"the prompt has {len(ids)} tokens but the context holds {capacity} (one more is needed to answer)",
                hint="shorten the prompt or raise --ctx-size",
            )

    def stream_ids(
        self,
        ids: Sequence[int],
        config: GenerationConfig | None = None,
        *,
        cancel: Callable[[], bool] | None = None,
        reuse: bool = True,
        keep: int | None = None,
        logprobs_into: list[TokenLogprob] | None = None,
    ) -> Generator[str, None, Result]:
        """Yield text pieces for a prompt already tokenized (a rendered chat); the generator returns the
        Result (`result = yield from model.stream_ids(ids)`), so no other thread's call can replace it.

        With `reuse` the KV the previous call left is kept up to the common prefix (edge.session) and only the
        rest is prefilled. NOTE: llama.cpp's logits depend on how a prompt is split into batches (bit-exact
        for Q4_1 splits of >= 2 tokens, not for K-quants), so reuse may flip a near-tie; reuse=False always
        prefills from scratch.
        `keep`: the ids are a conversation whose first `keep` ids are its system prompt (`system_span`): when it
        outgrows the context its oldest turns are dropped and those kept (`KVSession.window`).
        `logprobs_into`: with config.logprobs set, a list the entries are appended to as tokens come.
        """
        with self._turn():
            if not reuse:
                self.session.invalidate()
            gen = self._generation(ids, config, cancel, keep, logprobs_into)
            yield from self._guarded(gen)
            return self._result(gen)

    def _generation(
        self,
        ids: Sequence[int],
        config: GenerationConfig | None,
        cancel: Callable[[], bool] | None,
        keep: int | None,
        logprobs_into: list[TokenLogprob] | None = None,
    ) -> Generation:
        spec = self.speculative
        sampling = (config or GenerationConfig()).sampling
        return Generation(
            self.decoder,
            self.tokenizer,
            ids,
            config,
            cancel=cancel,
            decoding=spec if spec is not None and spec.applies(sampling) else None,
            session=self.session,
            keep=keep,
            logprobs_into=logprobs_into,
        )

    def _guarded(self, gen: Generation) -> Iterator[str]:
        """Iterate `gen`; a backend failing mid-run (DeviceError from the decoder) leaves the KV untrusted (the
        session resets it) and, with fallback, moves the model to another device before the error is raised."""
        try:
            yield from gen
        except DeviceError as exc:
            if self._closed or isinstance(exc, DeviceLostError):
                raise
            raise self._device_lost(exc, gen) from exc

    def _device_lost(self, exc: DeviceError, gen: Generation) -> DeviceLostError:
        p = self.placement
        failed = f"{p.backend}:{p.device}"
        if not self.options.fallback:
            return DeviceLostError(
                f"{failed} failed mid-generation: {exc.message}",
                failed=failed,
                hint="load the model again, or load it with fallback (--fallback) to continue on another device",
            )
        for backend, device in _takeover_candidates(p.backend, p.device):
            try:
                decoder = open_decoder(
                    backend,
                    self.checked,
                    device,
                    DecoderOptions(
                        n_ctx=self.options.n_ctx,
                        n_threads=self.options.n_threads,
                        precision=self.options.precision,
                        kv_dtype=p.kv_dtype or self.options.kv_dtype,  # auto's f16 where f32 did not fit
                    ),
                )
            except Exception:  # that one is unusable too (absent SDK, no such device): try the next
                continue
            moved = Placement(backend, device, f"{failed} failed -> {backend}:{device}", kv_dtype=p.kv_dtype)
            self._switch(decoder, moved)
            self._prefill_again(gen)
            return DeviceLostError(
                f"{failed} failed mid-generation ({exc.message}); switched to {backend}:{device}",
                failed=failed,
                switched_to=f"{backend}:{device}",
                hint=f"send the prompt again: the model now runs on {backend}:{device}",
            )
        return DeviceLostError(
            f"{failed} failed mid-generation ({exc.message}) and no other device could take over",
            failed=failed,
            hint="load the model again",
        )

    def _switch(self, decoder: Decoder, placement: Placement) -> None:
        old = self.decoder
        self.decoder, self.placement, self.device_plan = decoder, placement, None
        self.session = self.session.moved_to(decoder)
        spec = self.speculative
        if spec is not None:
            auto = self.options.draft == "auto"
            if auto and not auto_drafts_on(verify_backend(decoder, placement.backend)):  # as open_drafters
                self.speculative = None
                with contextlib.suppress(Exception):
                    spec.close()
            else:
                greedy = drafts_greedy(self.options.draft, self.options.precision, decoder)
                self.speculative = SpeculativeDecoding(decoder, spec.drafters, spec.config, greedy=greedy)
        with contextlib.suppress(Exception):  # the failed backend may not even close cleanly
            old.close()

    def _prefill_again(self, gen: Generation) -> None:
        """Re-prefill the conversation the failed call was answering (as it was fed: cut when it had outgrown
        the context), so sending it again prefills only its last ids; a failure here leaves an empty session."""
        prompt_ids = gen.prompt_ids
        if len(prompt_ids) < 2:
            return
        sinks = self.decoder.capabilities().sinks
        try:
            if gen.keep is not None and sinks is not None:
                sinks.set_sink(gen.keep)  # the ring geometry the conversation's next call asks for
            self.session.prepare(prompt_ids)
            self.decoder.forward(prompt_ids, last_only=True)
            self.session.settle(prompt_ids)
        except Exception:
            self.session.invalidate()

    def _result(self, gen: Generation) -> Result:
        p = self.placement
        lps = tuple(gen.logprobs) if gen.config.logprobs is not None else None
        return Result(
            gen.text,
            list(gen.token_ids),
            gen.prompt_ids,
            gen.stats,
            p.backend,
            p.device,
            p.fallback,
            logprobs=lps,
        )

    # -- warm-up ---------------------------------------------------------------------------------
    def warm_up(self, system: str | None = None, *, cancel: threading.Event | None = None) -> int:
        """Pay the first answer's fixed costs before the user asks (`edge chat` and `edge serve` call this in a
        thread right after load, while the user types): where the backend prepares its kernels on their first
        runs (OpenVINO's CPU plugin repacks the weights then), a many-row and a one-row forward run once and are
        forgotten; then the ids every conversation with this `system` prompt opens with (the template's system
        turn, or its default one, up to the user's text) are prefilled, and the first chat reuses them from the
        KV; a draft model gets the same. A generation called meanwhile waits for it; `cancel` or `close()` stops
        it within one forward.

        Only on a model whose KV is empty (a warm-up never replaces a conversation). Returns the ids the KV holds
        afterwards. A template or backend that fails here is logged, not raised: the first answer then runs as
        it would have without a warm-up and reports the error itself."""

        def stopped() -> bool:
            return self._closing.is_set() or (cancel is not None and cancel.is_set())

        with self._turn():
            if self._closed or stopped() or self.decoder.position != 0:
                return 0
            try:
                if self.decoder.capabilities().first_run_costs:
                    warm_kernels(self.decoder)
                opening, keep = self._opening(system)
                if stopped() or len(opening) < 2 or len(opening) > self.decoder.n_ctx // 2:
                    return 0
                fed = self.session.window(opening, keep=keep)  # the sinks the chat will ask for
                for start, stop in _pieces(self.session.prepare(fed), len(fed)):
                    if stopped():
                        break
                    self.decoder.forward(fed[start:stop], last_only=True)
                self.session.settle(fed)
            except Exception as exc:  # the first answer meets it again and reports it (a device fallback too)
                log.warning("warm-up of %s stopped: %s", self.name, exc)
                self.session.invalidate()
                return 0
            held = self.decoder.position
            # NOTE: a lazy (fallback) draft model is warmed too: this is time the user spends typing
            for drafter in [] if self.speculative is None else self.speculative.drafters:
                if stopped():
                    break
                try:
                    drafter.warm_up(fed[:held])
                except Exception as exc:  # the draft's own first use reports it; the target's KV is fine
                    log.warning("warm-up of the draft %s stopped: %s", drafter.name, exc)
            return held

    def _opening(self, system: str | None) -> tuple[list[int], int]:
        """The ids every first turn with this system prompt starts with, and the system span a chat of it keeps
        (what `chat` passes as `keep`); no ids when the template refuses such a chat."""
        head: list[ChatMessage] = [{"role": "system", "content": system}] if system else []
        try:
            chats = [self.chat_ids([*head, {"role": "user", "content": c}]) for c in _OPENING_PROBES]
        except EdgeError:
            return [], 0
        n = min(common_prefix(chats[0], ids) for ids in chats[1:])
        return chats[0][:n], self.system_span([*head, {"role": "user", "content": _OPENING_PROBES[0]}])

    # -- batching --------------------------------------------------------------------------------
    @property
    def batches(self) -> bool:
        """Whether `slots` can split this model (its decoder declares `Capabilities.batching`)."""
        return self.decoder.capabilities().batching is not None

    def slots(self, n: int) -> list[Model]:
        """n Models on this one's weights, for n generations at once (continuous batching: each has its own KV
        cache; their forwards from concurrent threads run packed into one graph run, devices/batch.py). This
        model hands its decoder over and is closed; the last slot closed frees the weights. Drafting: prompt
        lookup where this model drafted (a draft model would need a copy per slot: refused)."""
        batching = self.decoder.capabilities().batching
        if batching is None:
            raise EdgeError(
                f"{self.name} on {self.backend} cannot run several sequences in one forward",
                hint="load it on a backend that batches (ort, openvino, llamacpp) for slots",
            )
        if n < 1:
            raise ValueError(f"slots needs n >= 1 (got {n})")
        draft = self.options.draft
        if self.speculative is not None and draft not in ("auto", "ngram"):
            raise EdgeError(
                f"draft model {draft} with {n} slots: each slot would need its own copy of it",
                hint="use --draft ngram or auto (prompt lookup) with --parallel",
            )
        lookup = self.speculative is not None
        with self._lock:
            if self._closed or self._busy:
                raise EdgeError("slots of a closed or busy model", hint="call slots() right after load")
            decoders = batching.slots(n)
            self._closed = self._handed_over = True  # the engine closes the decoder with its last slot
            self._closing.set()
            if self.speculative is not None:
                self.speculative.close()
                self.speculative = None
        models: list[Model] = []
        try:
            for d in decoders:
                models.append(self._slot_model(d, lookup=lookup))
        except BaseException:
            for d in decoders:  # the last one closed stops the engine and frees the weights
                d.close()
            raise
        return models

    def adopt_prefix(self, other: Model, ids: Sequence[int]) -> int:
        """Before a generation of `ids` on this slot: where `other` (a sibling slot, generating or not) holds a
        longer prefix of them than this one does, copy its KV instead of computing it. Returns the ids copied."""
        copy = self.decoder.capabilities().prefix_copy
        if copy is None or other is self:
            return 0
        taken: list[int] = []

        def count() -> int:
            # NOTE: read with this KV still; a generating sibling's prompt so far stays in place (it appends,
            # and the copy is voided where its KV moved otherwise meanwhile: SlotDecoder.copy_prefix_from)
            held = other.session.holding()
            n = min(common_prefix(held, ids), len(ids) - 2)  # prepare feeds the last two again
            if n <= common_prefix(self.session.held, ids):
                return 0
            taken[:] = held[:n]
            return n

        with self._lock:
            if self._busy or self._closed or other._closed:
                return 0
            return copy.copy_prefix_from(other.decoder, count, lambda n: self.session.adopt(taken[:n]))

    @property
    def batch_engine(self) -> BatchStats | None:
        """A slot's: what the engine packing its steps with the other slots' has run; None for no slot."""
        slot = self.decoder.capabilities().batch_slot
        return None if slot is None else slot.engine

    def ridden(self) -> tuple[int, int] | None:
        """A slot's (steps it rode in, pieces those steps carried in all): their ratio is the batch it saw;
        None for a model that is no slot."""
        slot = self.decoder.capabilities().batch_slot
        return None if slot is None else slot.ridden

    def _slot_model(self, decoder: Decoder, *, lookup: bool) -> Model:
        # NOTE: no fallback per slot: each would open a whole copy of the weights when the shared graph fails
        options = replace(self.options, fallback=False)
        m = Model(self.checked, decoder, self.placement, device_plan=self.device_plan, options=options)
        if lookup:
            o = self.options
            m.speculative = open_speculative(
                "ngram",
                decoder,
                self.tokenizer,
                self.name,
                target_backend=self.backend,
                target_path=self.path,
                draft_k=o.draft_k,
                n_ctx=o.n_ctx,
                precision=o.precision,
                greedy=drafts_greedy(o.draft, o.precision, decoder),
            )
        return m

    # -- lifetime --------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the model (waits for a running generation, or for a warm-up's current forward)."""
        self._closing.set()
        with self._lock:
            self._closed = True
            try:
                if self.speculative is not None:
                    self.speculative.close()
            finally:
                if not self._handed_over:
                    self.decoder.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<edge.Model {self.name} on {self.backend}:{self.device}>"


def _takeover_candidates(backend: str, device: str) -> list[tuple[str, str]]:
    """Where a model whose (backend, device) failed mid-run goes next: the same backend on the CPU, then
    every runnable backend on the CPU in the registry's fallback order (llama.cpp, the reference, first)."""
    order = [(backend, "cpu")] + [(b, "cpu") for b in runnable_backends()]
    out: list[tuple[str, str]] = []
    for c in order:
        if c != (backend, device) and c not in out:
            out.append(c)
    return out
