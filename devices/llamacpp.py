"""llama.cpp as a backend: a whole-model `Decoder` over the GGUF itself (the speed and correctness reference)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge.devices.base import Capabilities, Decoder, KVFill
from edge.devices.llamacpp_batch import LlamaCppBatch, Native, batches, checked_ids, remove_cells
from edge.devices.memory import check_slots_fit, file_weight_bytes_per_token, llamacpp_memory
from edge.errors import BackendUnavailableError, DeviceError, ModelFormatError
from edge.kvcache import RollbackError
from edge.models.checked import CheckedModel, as_checked

INSTALL_LLAMACPP = 'pip install "edge-llm[llamacpp]"'  # an extra: it builds llama.cpp from source


@dataclass(frozen=True)
class LlamaCppOptions:
    n_ctx: int = 4096
    n_batch: int = 512
    n_threads: int | None = None  # None: physical cores
    device: str = "cpu"  # "cpu" | "gpu" (llama.cpp layer offload, when its build has it)
    seed: int = 0
    # llama.cpp's use_extra_bufts model parameter: weights repacked for its matrix kernels (AMX, the CPU repack
    # buffer); False keeps them as in the file. devices/native_check.py decides it per machine (issue #29)
    extra_bufts: bool = True
    kv_dtype: str = "f16"  # its K and V cache's type: f16 (llama.cpp's default) | f32


def import_llama_cpp():  # type: ignore[no-untyped-def]
    try:
        import llama_cpp
    except Exception as exc:
        raise BackendUnavailableError(
            f"the llamacpp backend is unavailable: {exc}", hint=INSTALL_LLAMACPP
        ) from None
    return llama_cpp


_LOAD_LOCK = threading.Lock()
_GGML_TYPES = {"f32": 0, "f16": 1}  # ggml_type's GGML_TYPE_F32 / GGML_TYPE_F16 (llama_context_params.type_k)


class _NoChatFormatter:
    """Stands in for llama-cpp-python's Jinja2ChatFormatter while a model loads (see _loading)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def to_chat_handler(self) -> object:
        def refuse(*args: object, **kwargs: object) -> None:
            raise BackendUnavailableError("llama-cpp-python's chat API is not used by edge")

        return refuse


@contextlib.contextmanager
def _loading(llama_cpp: object, extra_bufts: bool) -> Iterator[None]:
    """While a model loads: no chat template compiled, and the model parameters Llama() does not take.

    llama-cpp-python compiles every chat template of the file when a model loads (for its chat API, which
    edge does not use) in a jinja2 sandbox without limits: `{{ 'x' * 800000000 }}` is folded at compile time
    (3 GB, 8 s), a deep nesting raises a bare SyntaxError. edge renders templates itself, within limits.
    Llama() builds its llama_model_params from llama_model_default_params() and has no use_extra_bufts
    argument (0.3.36), so the defaults it reads are edge's for the load."""
    fmt = llama_cpp.llama_chat_format  # type: ignore[attr-defined]
    low = llama_cpp.llama_cpp  # type: ignore[attr-defined]
    with _LOAD_LOCK:
        saved, saved_params = fmt.Jinja2ChatFormatter, low.llama_model_default_params

        def params() -> object:
            p = saved_params()
            p.use_extra_bufts = extra_bufts
            return p

        fmt.Jinja2ChatFormatter, low.llama_model_default_params = _NoChatFormatter, params
        try:
            yield
        finally:
            fmt.Jinja2ChatFormatter, low.llama_model_default_params = saved, saved_params


class LlamaCppDecoder:
    """`Decoder` on llama.cpp. Rollback removes KV cells through llama.cpp's sequence API; a recurrent or
    hybrid model's state (Mamba, RWKV, Jamba) cannot be cut at a position: it rolls back only to empty."""

    backend = "llamacpp"

    def __init__(self, model: CheckedModel | str | Path, options: LlamaCppOptions | None = None) -> None:
        opts = options or LlamaCppOptions()
        source = as_checked(model).source()
        path = source.path  # llama.cpp reads only what edge's checks passed
        # the context's K and V from the file's metadata, as the load's memory check sizes them (slots)
        self._kv_bytes = llamacpp_memory(source.gguf, opts.n_ctx, opts.kv_dtype).kv_cache
        self._weights_read = file_weight_bytes_per_token(source.gguf)  # the blocks as stored
        self._kv_dtype = opts.kv_dtype
        llama_cpp = import_llama_cpp()
        if opts.device not in ("cpu", "gpu"):
            raise DeviceError(f"llamacpp runs on cpu or gpu, not {opts.device!r}", hint="use --device cpu")
        if opts.device == "gpu" and not llama_cpp.llama_supports_gpu_offload():
            raise DeviceError(
                "this llama.cpp build has no GPU offload",
                hint="use --device cpu, or a GPU build of llama-cpp-python",
            )
        import psutil

        threads = opts.n_threads or psutil.cpu_count(logical=False) or 1
        try:
            with _loading(llama_cpp, opts.extra_bufts):
                self._llama = llama_cpp.Llama(
                    model_path=str(path),
                    n_ctx=opts.n_ctx,
                    n_batch=opts.n_batch,
                    n_ubatch=opts.n_batch,
                    n_threads=threads,
                    n_threads_batch=threads,
                    n_gpu_layers=-1 if opts.device == "gpu" else 0,
                    logits_all=False,
                    seed=opts.seed,
                    type_k=_GGML_TYPES[opts.kv_dtype],
                    type_v=_GGML_TYPES[opts.kv_dtype],
                    verbose=False,
                )
        except ValueError as exc:  # llama-cpp-python's way of saying the model did not load
            raise ModelFormatError(
                f"llama.cpp could not load {path}: {exc}",
                hint="check the file with `edge tokenize` or re-pull it",
            ) from None
        self._lib = llama_cpp
        self._ctx = self._llama._ctx
        self._memory = self._ctx.memory
        self._batch = self._llama._batch
        self._lock = threading.Lock()
        self.options = opts
        self.device = opts.device
        self.vocab_size: int = self._llama.n_vocab()
        self.n_ctx: int = self._llama.n_ctx()
        self.n_batch = opts.n_batch
        self.position = 0
        # a transformer's KV: cut at any position, shared by slots; a recurrent model's state: neither
        self._batches = batches(llama_cpp, self._llama._model.model)

    def _check_open(self) -> None:
        # NOTE: llama.cpp's context is freed by close(); touching it afterwards is a segfault, not an error
        if self._llama is None:
            raise DeviceError("the llama.cpp model is closed", hint="load the model again")

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        self._check_open()
        toks = checked_ids(tokens, self.position, self.n_ctx, self.vocab_size)
        with self._lock:
            self._check_open()  # again under the lock: close() may have run meanwhile
            rows: list[np.ndarray] = []
            for i in range(0, len(toks), self.n_batch):
                chunk = toks[i : i + self.n_batch]
                self._batch.set_batch(batch=chunk, n_past=self.position, logits_all=not last_only)
                try:
                    self._ctx.decode(self._batch)
                except RuntimeError as exc:
                    raise self._failed(exc) from exc
                self.position += len(chunk)
                if not last_only:
                    ptr = self._ctx.get_logits()
                    rows.append(np.ctypeslib.as_array(ptr, shape=(len(chunk), self.vocab_size)).copy())
            if last_only:
                ptr = self._ctx.get_logits_ith(-1)
                rows.append(np.ctypeslib.as_array(ptr, shape=(1, self.vocab_size)).copy())
            return rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)

    def _failed(self, exc: RuntimeError) -> DeviceError:
        """A decode failed: the half-written batch dropped (the whole KV where llama.cpp cannot cut it)."""
        at = self.position
        with contextlib.suppress(RollbackError):  # refused: _cut left position matching the KV
            self._cut(at)
        lost = "" if self.position == at else f"; the KV could not be cut back to {at} and was emptied"
        return DeviceError(
            f"llamacpp failed on {self.device} at position {at}: {exc}{lost}",
            hint="reset() and retry, or load the model again (on another device)",
        )

    def _cut(self, start: int) -> None:
        """Drop the KV from `start` on. Where llama.cpp refuses (RollbackError) the KV is emptied unless it
        still ends at `position`, so that `position` always counts what the KV holds."""
        try:
            remove_cells(self._lib, self._memory, 0, start)
        except RollbackError as exc:
            # NOTE: llama.cpp refuses before it changes anything; a decode that failed half-way may have
            # advanced a recurrent state past `position`, which no cut can undo
            if self._lib.llama_memory_seq_pos_max(self._memory, 0) == self.position - 1:
                kept = f"the KV still holds all {self.position} tokens"
            else:
                self._lib.llama_memory_clear(self._memory, True)
                self.position, kept = 0, "the KV was emptied"
            raise RollbackError(f"{exc}; {kept}") from None
        self.position = start

    def rollback(self, n: int) -> None:
        if not 0 <= n <= self.position:
            raise ValueError(f"cannot roll back {n} tokens with {self.position} in the cache")
        if n == 0:
            return
        with self._lock:
            self._check_open()
            self._cut(self.position - n)

    def reset(self) -> None:
        with self._lock:
            self._check_open()
            self._ctx.kv_cache_clear()
            self.position = 0

    def capabilities(self) -> Capabilities:
        # seq_rm removes any suffix of a transformer's cache; a recurrent state only wholly (rollback(position)),
        # so 0 there: nothing drafts on it. No sinks, one whole model
        rollback = None if self._batches else 0
        batching = self if self._batches else None
        return Capabilities(max_rollback=rollback, batching=batching, weights_read=self._weights_read)

    def slots(self, n: int) -> list[Decoder]:
        """`Batching`: n sequences on this model, decoded in one native batch a step
        (devices/llamacpp_batch.py). This decoder hands its model over: it is closed afterwards."""
        with self._lock:
            self._check_open()
            check_slots_fit(n, self._kv_bytes)  # refused here, this decoder still runs
            llama, self._llama = self._llama, None
        native = Native(
            self._lib,
            llama,
            self.n_ctx,
            self.n_batch,
            self.vocab_size,
            self.device,
            self._kv_dtype,
            close=llama.close,
        )
        try:
            engine = LlamaCppBatch(native, n)
        except BaseException:
            llama.close()
            raise
        return list(engine.slots())

    def kv_fill(self) -> KVFill:
        return KVFill(self.position, self.n_ctx, self.position, ring=False, dtype=self._kv_dtype)

    def close(self) -> None:
        llama = getattr(self, "_llama", None)
        if llama is not None:
            with self._lock:  # not while another thread is inside decode
                self._llama = None  # type: ignore[assignment]
                llama.close()

    def __enter__(self) -> LlamaCppDecoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
