"""The options of `edge.load` (LoadOptions) and of each generation call (GenerateOptions), and cancellation."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

from edge.devices.precision import check_kv_dtype
from edge.errors import GrammarError
from edge.generate import GenerationConfig
from edge.grammar import Grammar, grammar_of
from edge.sampling import SamplingConfig

__all__ = ["Cancel", "GenerateOptions", "LoadOptions", "cancel_poller"]


@dataclass(frozen=True)
class LoadOptions:
    """What `edge.load` takes besides the model (its keywords, one field each)."""

    # auto: the backend that measures fastest for this model here (devices/auto.py); None means auto too
    backend: str | None = "auto"
    device: str = "cpu"  # cpu | gpu | npu | auto | hetero:[backend:]device,...
    # split by phase: "prefill=B:D[:P],decode=B:D[:P]" (devices/phase_split.py); None: one backend runs both
    plan: str | None = None
    # A device kind to run on when the asked-for one is absent (announced); True means "cpu".
    fallback: bool | str = False
    emulate: bool = False  # --device npu: the NPU-shaped static graphs compiled on the CPU
    n_ctx: int = 4096
    n_threads: int | None = None
    precision: str = "fast"  # fast | exact (see devices.registry.PRECISIONS)
    # Bytes of memory to assume free when checking that the model fits (tests pin it); None measures it.
    available_memory: int | None = None
    # Speculative decoding: auto (prompt lookup, plus a compatible catalog draft model already pulled, on
    # the target's own-graph backend; greedy generations are drafted only where drafting cannot change them:
    # edge.speculative.drafts_greedy), none, ngram or a draft model (catalog name or path); the named draft's
    # [backend:]device (auto's runs on the target's backend), and the most tokens drafted per target forward.
    draft: str | None = "auto"
    draft_device: str = "cpu"
    draft_k: int = 16
    # Sequences the caller will run at once (`Model.slots`): above 1, auto chooses among the backends that
    # batch them in one forward (the own graphs), unless only llama.cpp runs the file.
    parallel: int = 1
    # The KV cache's type: auto (f32 on the own graphs on a CPU, f16 on llama.cpp and OpenVINO's GPU), f32, or f16 (half
    # the memory; the K/V rounded to fp16, as llama.cpp keeps them): devices/precision.kv_dtype_for
    kv_dtype: str = "auto"

    def __post_init__(self) -> None:
        check_kv_dtype(self.kv_dtype)
        if self.parallel < 1:
            raise ValueError(f"parallel must be >= 1 (got {self.parallel})")


@dataclass(frozen=True)
class GenerateOptions:
    """Per-call options; every `Model` generation method takes them as keyword arguments."""

    max_tokens: int = 256
    temperature: float = 0.0  # 0: greedy (deterministic)
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    # constrained output: an edge.Grammar, or OpenAI's shape ({"type": "json_object"}, {"type": "json_schema",
    # "json_schema": {"name": ..., "schema": {...}}}); the answer is guaranteed to match it
    response_format: Grammar | Mapping[str, Any] | None = None
    # per-token log-probs with this many top alternatives (0..20): Result.logprobs (edge.logprobs)
    logprobs: int | None = None

    def config(self) -> GenerationConfig:
        sampling = SamplingConfig(
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            min_p=self.min_p,
            repeat_penalty=self.repeat_penalty,
            seed=self.seed,
        )
        grammar = None if self.response_format is None else grammar_of(self.response_format)
        if grammar is not None and self.stop:  # a stop string would cut the value short of its schema
            raise GrammarError(
                "stop strings cannot be combined with response_format",
                hint="drop stop: the answer ends where its JSON value is complete",
            )
        return GenerationConfig(
            max_tokens=self.max_tokens,
            stop=tuple(self.stop),
            sampling=sampling,
            grammar=grammar,
            logprobs=self.logprobs,
        )


class _Event(Protocol):
    def is_set(self) -> bool: ...


# A threading.Event (set it to stop) or a callable polled between tokens (return True to stop).
Cancel: TypeAlias = "_Event | Callable[[], bool] | None"


def cancel_poller(cancel: Cancel) -> Callable[[], bool] | None:
    """`cancel` as the callable the generation loop polls."""
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
