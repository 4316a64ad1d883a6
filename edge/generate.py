"""The generation loop, built on the `Decoder` contract alone (any backend gets it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from devices.base import Decoder
from edge.errors import ContextOverflowError, GenerationCancelled
from edge.sampling import Sampler, SamplingConfig

if TYPE_CHECKING:
    from models.tokenizer import Tokenizer


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings; the text ends before the first one
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (got {self.max_tokens})")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")


@dataclass
class GenerationStats:
    n_prompt_tokens: int = 0
    n_tokens: int = 0
    ttft_ms: float = 0.0  # prompt in -> first new token chosen
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0  # single-token forwards timed in decode_s
    stop_reason: str = ""  # "eos" | "stop" | "length" | "context" | "cancelled"

    @property
    def prefill_tok_s(self) -> float:
        return self.n_prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0


class _StopMatcher:
    """Holds back text that may be the start of a stop string, so a stop string is never streamed."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.pending = ""
        self.hit = False

    def feed(self, text: str) -> str:
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit = True
            out, self.pending = self.pending[:cut], ""
            return out
        hold = max(
            (k for s in self.stops for k in range(len(s) - 1, 0, -1) if self.pending.endswith(s[:k])),
            default=0,
        )
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Generation:
    """One generation: iterate it for text pieces; afterwards `.text`, `.token_ids`, `.stats` hold the result.

    The decoder is reset and the prompt prefilled when iteration starts. `cancel` is polled between tokens;
    when it returns True the generation ends with stop_reason "cancelled" (or raises GenerationCancelled with
    `raise_on_cancel`); the decoder stays usable either way.
    """

    def __init__(
        self,
        decoder: Decoder,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int],
        config: GenerationConfig | None = None,
        *,
        cancel: Callable[[], bool] | None = None,
        raise_on_cancel: bool = False,
    ) -> None:
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.prompt_ids = list(prompt_ids)
        self.config = config or GenerationConfig()
        self.cancel = cancel
        self.raise_on_cancel = raise_on_cancel
        self.token_ids: list[int] = []
        self.text = ""
        self.stats = GenerationStats(n_prompt_tokens=len(self.prompt_ids))

    def _check_fits(self) -> None:
        n, ctx = len(self.prompt_ids), self.decoder.n_ctx
        if n == 0:
            raise ContextOverflowError(
                "the prompt is empty after tokenization", hint="give a non-empty prompt"
            )
        if n >= ctx:
            raise ContextOverflowError(
                f"the prompt has {n} tokens but the context holds {ctx} (one more is needed to answer)",
                hint="shorten the prompt or raise --ctx-size",
            )

    def __iter__(self) -> Iterator[str]:
        cfg, dec, tok = self.config, self.decoder, self.tokenizer
        self._check_fits()
        sampler = Sampler(cfg.sampling)
        stopper = _StopMatcher(cfg.stop)
        stream = tok.stream()
        eog = frozenset() if cfg.ignore_eos else tok.eog_ids
        history = list(self.prompt_ids)
        stats = self.stats

        dec.reset()
        t0 = time.perf_counter()
        logits = dec.forward(self.prompt_ids, last_only=True)[-1]
        t1 = time.perf_counter()
        stats.prefill_s = t1 - t0
        t_decode = 0.0
        while True:
            if len(self.token_ids) >= cfg.max_tokens:
                stats.stop_reason = "length"
                break
            if self.cancel is not None and self.cancel():
                stats.stop_reason = "cancelled"
                break
            token = sampler(logits, history)
            if not self.token_ids:
                stats.ttft_ms = (time.perf_counter() - t0) * 1000.0
            if token in eog:
                stats.stop_reason = "eos"
                break
            self.token_ids.append(token)
            history.append(token)
            piece = stopper.feed(stream.push(token))
            if piece:
                self.text += piece
                yield piece
            if stopper.hit:
                stats.stop_reason = "stop"
                break
            if len(self.token_ids) >= cfg.max_tokens:
                stats.stop_reason = "length"
                break
            if dec.position >= dec.n_ctx:
                stats.stop_reason = "context"
                break
            ts = time.perf_counter()
            logits = dec.forward([token], last_only=True)[-1]
            t_decode += time.perf_counter() - ts
            stats.decode_steps += 1
        stats.n_tokens = len(self.token_ids)
        stats.decode_s = t_decode
        if not stopper.hit:
            tail = stopper.feed(stream.flush())
            tail += "" if stopper.hit else stopper.flush()
            if tail:
                self.text += tail
                yield tail
        if stats.stop_reason == "cancelled" and self.raise_on_cancel:
            raise GenerationCancelled("generation cancelled", hint="the model is ready for the next prompt")

    def run(self) -> str:
        """Consume the whole generation and return its text."""
        for _ in self:
            pass
        return self.text
