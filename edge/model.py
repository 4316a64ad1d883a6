"""Loading a model (file checks, tokenizer, template, backend) and running prompts on it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edge.devices.base import Decoder
from edge.devices.placement import Placement
from edge.devices.planned import DeviceRequest, PlannedOptions, open_requested
from edge.devices.planner import Plan
from edge.devices.registry import DecoderOptions, open_decoder
from edge.drafters import open_drafters
from edge.errors import DeviceError, DeviceLostError, EdgeError, InsufficientMemoryError
from edge.generate import Generation, GenerationConfig, GenerationStats
from edge.models.arch import check_block_count
from edge.models.artifact import is_artifact, open_artifact
from edge.models.catalog import CATALOG
from edge.models.chat_template import ChatTemplate, template_from_metadata
from edge.models.gguf_file import GGUFFile, open_gguf
from edge.models.store import PullProgress, resolve_model
from edge.models.tokenizer import Tokenizer, load_tokenizer
from edge.session import KVSession, common_prefix
from edge.speculative import SpecConfig, SpeculativeDecoding


@dataclass(frozen=True)
class LoadOptions:
    # auto: the backend that measures fastest for this model here (devices/auto.py); None means auto too
    backend: str | None = "auto"
    device: str = "cpu"  # cpu | gpu | npu | auto | hetero:[backend:]device,...
    # A device kind to run on when the asked-for one is absent (announced); True means "cpu".
    fallback: bool | str = False
    emulate: bool = False  # --device npu: the NPU-shaped static graphs compiled on the CPU
    n_ctx: int = 4096
    n_threads: int | None = None
    precision: str = "fast"  # fast | exact (see devices.registry.PRECISIONS)
    # Bytes of memory to assume free when checking that the model fits (tests pin it); None measures it.
    available_memory: int | None = None
    # Speculative decoding: auto (prompt lookup, plus a compatible catalog draft model already pulled, on
    # the own-graph backends; see edge.drafters.open_drafters), none, ngram or a draft model (catalog name
    # or path); the draft's [backend:]device, and the most tokens drafted per target forward.
    draft: str | None = "auto"
    draft_device: str = "cpu"
    draft_k: int = 16


@dataclass(frozen=True)
class Result:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    stats: GenerationStats
    backend: str
    device: str
    fallback: str | None


class Model:
    """A loaded model. Calls are serialized: two threads never interleave tokens into one KV cache."""

    def __init__(
        self,
        name: str,
        path: Path,
        gguf: GGUFFile,
        decoder: Decoder,
        placement: Placement,
        *,
        tokenizer: Tokenizer | None = None,
    ) -> None:
        self.name = name
        self.path = path
        self.gguf = gguf
        self.tokenizer: Tokenizer = tokenizer or load_tokenizer(gguf.metadata)
        tok = self.tokenizer
        bos = tok.decode([tok.bos_id]) if tok.bos_id is not None else ""
        eos = tok.decode([tok.eos_id]) if tok.eos_id is not None else ""
        self.template: ChatTemplate | None = template_from_metadata(
            gguf.metadata, bos_token=bos, eos_token=eos
        )
        self.decoder = decoder
        self.placement = placement
        self.session = KVSession(decoder)  # the ids the KV holds: each prompt prefills only its new suffix
        self._lock = threading.RLock()
        self._busy = False  # a generation is running (the RLock alone lets one thread interleave two)
        self.speculative: SpeculativeDecoding | None = None  # load(..., LoadOptions(draft=...)) sets it
        self.plan: Plan | None = None  # the planner's plan, when the device request went through it
        self.options = LoadOptions()  # load() sets them: n_ctx, threads and fallback for a device switch
        self._closed = False

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """One generation at a time: other threads wait; a second one started by the same thread (two
        streams iterated in turn) would interleave tokens into one KV cache, so it is refused."""
        with self._lock:
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

    def render_chat(self, messages: Sequence[Mapping[str, Any]]) -> str:
        if self.template is None:
            # a base model: plain completion over the concatenated contents
            return "".join(str(m.get("content", "")) for m in messages)
        return self.template.render(messages, add_generation_prompt=True)

    def system_span(self, messages: Sequence[Mapping[str, Any]]) -> int:
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

    # -- generation ------------------------------------------------------------------------------
    def stream(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        *,
        raw: bool = False,
        cancel: Callable[[], bool] | None = None,
    ) -> Iterator[str]:
        """Yield text pieces as they are generated; the lock is held until the generator finishes."""
        ids = self.prompt_ids(prompt, raw=raw)
        with self._turn():
            self.session.invalidate()  # a from-scratch prefill (stream_ids reuses the KV)
            gen = self._generation(ids, config, cancel, None)
            yield from self._guarded(gen)
            self.last = self._result(gen)

    def generate(
        self,
        prompt: str,
        config: GenerationConfig | None = None,
        *,
        raw: bool = False,
        on_text: Callable[[str], None] | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> Result:
        ids = self.prompt_ids(prompt, raw=raw)
        with self._turn():
            self.session.invalidate()  # a from-scratch prefill (stream_ids reuses the KV)
            gen = self._generation(ids, config, cancel, None)
            for piece in self._guarded(gen):
                if on_text is not None:
                    on_text(piece)
            return self._result(gen)

    def stream_ids(
        self,
        ids: Sequence[int],
        config: GenerationConfig | None = None,
        *,
        cancel: Callable[[], bool] | None = None,
        reuse: bool = True,
        keep: int | None = None,
    ) -> Generator[str, None, Result]:
        """Yield text pieces for a prompt already tokenized (a rendered chat); the generator returns the
        Result (`result = yield from model.stream_ids(ids)`), so no other thread's call can replace it.

        With `reuse` the KV the previous call left is kept up to the common prefix (edge.session) and only the
        rest is prefilled. NOTE: llama.cpp's logits depend on how a prompt is split into batches (bit-exact
        for Q4_1 splits of >= 2 tokens, not for K-quants), so reuse may flip a near-tie; reuse=False always
        prefills from scratch, as `generate` and `stream` do.
        `keep`: the ids are a conversation whose first `keep` ids are its system prompt (`system_span`): when it
        outgrows the context its oldest turns are dropped and those kept (`KVSession.window`).
        """
        with self._turn():
            if not reuse:
                self.session.invalidate()
            gen = self._generation(ids, config, cancel, keep)
            yield from self._guarded(gen)
            return self._result(gen)

    def _generation(
        self,
        ids: Sequence[int],
        config: GenerationConfig | None,
        cancel: Callable[[], bool] | None,
        keep: int | None,
    ) -> Generation:
        return Generation(
            self.decoder,
            self.tokenizer,
            ids,
            config,
            cancel=cancel,
            decoding=self.speculative,
            session=self.session,
            keep=keep,
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
                    self.path,
                    device,
                    DecoderOptions(
                        n_ctx=self.options.n_ctx,
                        n_threads=self.options.n_threads,
                        precision=self.options.precision,
                    ),
                )
            except Exception:  # that one is unusable too (absent SDK, no such device): try the next
                continue
            self._switch(
                decoder, Placement(backend, device, fallback=f"{failed} failed -> {backend}:{device}")
            )
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
        self.decoder, self.placement, self.plan = decoder, placement, None
        self.session = self.session.moved_to(decoder)
        if self.speculative is not None:
            spec = self.speculative
            self.speculative = SpeculativeDecoding(decoder, spec.drafters, spec.config)
        with contextlib.suppress(Exception):  # the failed backend may not even close cleanly
            old.close()

    def _prefill_again(self, gen: Generation) -> None:
        """Re-prefill the conversation the failed call was answering (as it was fed: cut when it had outgrown
        the context), so sending it again prefills only its last ids; a failure here leaves an empty session."""
        prompt_ids = gen.prompt_ids
        if len(prompt_ids) < 2:
            return
        set_sink = getattr(self.decoder, "set_sink", None)
        try:
            if gen.keep is not None and callable(set_sink):
                set_sink(gen.keep)  # the ring geometry the conversation's next call asks for
            self.session.prepare(prompt_ids)
            self.decoder.forward(prompt_ids, last_only=True)
            self.session.settle(prompt_ids)
        except Exception:
            self.session.invalidate()

    def _result(self, gen: Generation) -> Result:
        p = self.placement
        return Result(
            gen.text, list(gen.token_ids), gen.prompt_ids, gen.stats, p.backend, p.device, p.fallback
        )

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self.speculative is not None:
                self.speculative.close()
            self.decoder.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _takeover_candidates(backend: str, device: str) -> list[tuple[str, str]]:
    """Where a model whose (backend, device) failed mid-run goes next: the same backend on the CPU, then
    llama.cpp (the reference) on the CPU, then the other graph backends on the CPU."""
    order = [(backend, "cpu"), ("llamacpp", "cpu"), ("ort", "cpu"), ("openvino", "cpu")]
    out: list[tuple[str, str]] = []
    for c in order:
        if c != (backend, device) and c not in out:
            out.append(c)
    return out


@dataclass(frozen=True)
class MemoryEstimate:
    weights: int  # tensor data, mapped from the file
    kv_cache: int  # f16 K and V for n_ctx tokens on every layer
    scratch: int  # compute buffers (llama.cpp's attention scores for one batch dominate)

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.scratch


def estimate_memory(gguf: GGUFFile, n_ctx: int, n_batch: int = 512) -> MemoryEstimate:
    """What loading `gguf` with a context of n_ctx tokens takes, from the file's own hyper-parameters.

    Hyper-parameters that are missing or not positive integers count as 0 (the tensor data still counts):
    this is a fail-fast check, not a validation of the file.
    """
    md = gguf.metadata
    arch = md.get("general.architecture")

    def num(key: str, default: int) -> int:
        v = md.get(f"{arch}.{key}", default)
        if isinstance(v, np.ndarray) and v.size and v.dtype.kind in "iu":
            v = int(v.max())  # per-layer values (e.g. KV heads per layer)
        ok = isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v > 0
        return int(v) if ok else default

    n_layer = num("block_count", 0)
    n_embd = num("embedding_length", 0)
    n_head = num("attention.head_count", 1)
    n_head_kv = num("attention.head_count_kv", n_head)
    k_len = num("attention.key_length", n_embd // n_head)
    v_len = num("attention.value_length", k_len)
    weights = sum(t.nbytes for t in gguf.tensors.values())
    n_ctx = -(-n_ctx // 256) * 256  # llama.cpp pads the context to a multiple of 256
    kv = 2 * n_ctx * n_layer * n_head_kv * (k_len + v_len)
    scratch = 4 * min(n_batch, n_ctx) * (n_head * n_ctx + 8 * n_embd) + (32 << 20)
    return MemoryEstimate(weights, kv, scratch)


def check_memory(gguf: GGUFFile, n_ctx: int, available: int | None = None) -> MemoryEstimate:
    """Raise InsufficientMemoryError, before anything is allocated, when the model cannot fit."""
    import psutil

    need = estimate_memory(gguf, n_ctx)
    free = psutil.virtual_memory().available if available is None else available
    if need.total > free:
        mib = 1 << 20
        raise InsufficientMemoryError(
            f"{gguf.path.name} needs about {need.total // mib} MiB of memory (weights {need.weights // mib} MiB, "
            f"KV cache for {n_ctx} tokens {need.kv_cache // mib} MiB, buffers {need.scratch // mib} MiB) "
            f"but {free // mib} MiB is available",
            needed=need.total,
            available=free,
            hint="close other programs, lower --ctx-size, or use a smaller (more quantized) model",
        )
    return need


def load(
    model: str | None = None, options: LoadOptions | None = None, *, on_progress: PullProgress | None = None
) -> Model:
    """Load a catalog model (pulled on first use; `on_progress` sees the pull, None shows it on stderr) or a
    local .gguf file."""
    from edge.models.catalog import DEFAULT_MODEL

    opts = options or LoadOptions()
    name = model or DEFAULT_MODEL
    path = resolve_model(name, on_progress=on_progress)
    artifact = open_artifact(path) if is_artifact(path) else None  # `edge convert -o DIR` output
    if artifact is not None:
        gguf = artifact.metadata  # tokenizer, template and hyper-parameters; the weights are its partitions
    else:
        gguf = open_gguf(path)  # validates the whole file layout before any native code sees it
        # NOTE: llama.cpp aborts the whole process (GGML_ASSERT) on some lying metadata, e.g. a vocabulary
        # with the same text twice or a block_count beyond the tensors: both are checked here, before it
        # reads them.
        check_block_count(gguf.metadata, gguf.tensors)
        check_memory(gguf, opts.n_ctx, opts.available_memory)
    tokenizer = load_tokenizer(gguf.metadata)
    fallback = "cpu" if opts.fallback is True else (opts.fallback or None)
    request = DeviceRequest(opts.backend, opts.device, fallback, opts.emulate)
    decoder, placement, plan = open_requested(
        path, request, PlannedOptions(n_ctx=opts.n_ctx, threads=opts.n_threads, precision=opts.precision)
    )
    try:
        display = name if name in CATALOG else path.name
        loaded = Model(display, path, gguf, decoder, placement, tokenizer=tokenizer)
        loaded.plan = plan
        loaded.options = opts
        spec = SpecConfig(k_max=opts.draft_k)  # invalid options fail before a draft loads
        drafters = open_drafters(
            opts.draft,
            loaded.tokenizer,
            display,
            decoder.vocab_size,
            target_backend=placement.backend,
            target_path=path,
            device=opts.draft_device,
            n_ctx=opts.n_ctx,
            n_threads=opts.n_threads,
            precision=opts.precision,
        )
        if drafters:
            loaded.speculative = SpeculativeDecoding(decoder, drafters, spec)
        return loaded
    except BaseException:
        decoder.close()
        raise
