"""The generation loop, built on the `Decoder` contract alone (any backend gets it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from edge.devices.base import Decoder
from edge.errors import ContextOverflowError, GenerationCancelled
from edge.history import window_note
from edge.logprobs import TokenLogprob, check_top, choice_logprobs
from edge.sampling import Sampler, SamplingConfig

if TYPE_CHECKING:
    from edge.fastforward import ForcedStats
    from edge.grammar import Constraint, Grammar
    from edge.models.tokenizer import Tokenizer
    from edge.reasoning import ThinkingConfig
    from edge.session import KVSession
    from edge.speculative import DraftStats


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 256
    stop: tuple[str, ...] = ()  # stop strings; the text ends before the first one
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    ignore_eos: bool = False
    # With a `cancel` callable the prompt is fed in chunks of this many tokens and `cancel` polled between
    # them, so a long prefill stops within one chunk (a multiple of the backends' own batch sizes).
    prefill_chunk: int = 512
    # constrained output (edge/grammar.py): every token is sampled from what the grammar admits next
    grammar: Grammar | None = None
    # with a grammar: the tokens it forces are fed in one forward and verified, not drawn one step each
    # (edge/fastforward.py); False decodes them one step each (edge bench compares the two)
    fast_forward: bool = True
    # per-token log-probs with this many alternatives (0..20, edge.logprobs); None: not recorded (no cost)
    logprobs: int | None = None
    # a thinking model's block (edge/reasoning.py): the grammar applies after it closes, a budget is kept
    thinking: ThinkingConfig | None = None

    def __post_init__(self) -> None:
        if self.logprobs is not None:
            check_top(self.logprobs)
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0 (got {self.max_tokens})")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (got {self.prefill_chunk})")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")


@dataclass
class GenerationStats:
    n_prompt_tokens: int = 0
    n_cached_tokens: int = 0  # prompt tokens the KV cache already held (reused, not prefilled)
    n_tokens: int = 0
    ttft_ms: float = 0.0  # prompt in -> first new token chosen
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0  # tokens chosen by the steps timed in decode_s (one per step without a draft)
    stop_reason: str = (
        ""  # "eos" | "stop" | "grammar" (its value complete) | "length" | "context" | "cancelled"
    )
    draft: DraftStats | None = None  # speculative decoding's statistics, when a draft was used
    forced: ForcedStats | None = None  # a grammar's forced tokens, when fast-forward decoded them
    # Older turns that left the window (cut before the prefill or evicted by the ring) and the system prompt
    # tokens kept in their place; 0 while the conversation fits.
    n_dropped_tokens: int = 0
    n_kept_tokens: int = 0

    @property
    def window_note(self) -> str | None:
        """What the stats line says when older turns left the window, else None."""
        return window_note(self.n_dropped_tokens, self.n_kept_tokens)

    @property
    def prefill_tok_s(self) -> float:
        prefilled = self.n_prompt_tokens - self.n_cached_tokens
        return prefilled / self.prefill_s if self.prefill_s > 0 else 0.0

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


class Decoding(Protocol):
    """How the loop gets its next tokens: one per target forward (`PlainDecoding`) or several
    (`edge.speculative.SpeculativeDecoding`). The loop owns prefill, stop rules, EOS and streaming."""

    def begin(
        self,
        prompt_ids: Sequence[int],
        logits: np.ndarray,
        sampling: SamplingConfig,
        constraint: Constraint | None = None,
        forcing: bool = True,
    ) -> None:
        """Start after the decoder was reset and fed the prompt; `logits` is its last position's row. With a
        `constraint`, every token is drawn from what it admits and advances it; `forcing`: the tokens it
        admits alone are fed without a draw where the strategy can (edge.fastforward)."""
        ...

    def step(self, history: Sequence[int], budget: int) -> list[int]:
        """The next 1..budget tokens; `history` is the prompt and every token returned so far."""
        ...

    def draft_stats(self) -> DraftStats | None: ...

    def forced_stats(self) -> ForcedStats | None:
        """What forcing did (None: nothing was forced)."""
        ...


class PlainDecoding:
    """One sampled token per single-token forward."""

    def __init__(self, decoder: Decoder, logprobs: int | None = None) -> None:
        self.decoder = decoder
        self.n_logprobs = logprobs  # None: none recorded
        self.logprobs: list[tuple[int, float, list[tuple[int, float]]]] = []  # one per step, when asked
        self._sampler = Sampler(SamplingConfig())
        self._logits: np.ndarray | None = None
        self._constraint: Constraint | None = None

    def begin(
        self,
        prompt_ids: Sequence[int],
        logits: np.ndarray,
        sampling: SamplingConfig,
        constraint: Constraint | None = None,
        forcing: bool = True,
    ) -> None:
        self._sampler = Sampler(sampling)
        self._logits = logits
        self._constraint = constraint

    def step(self, history: Sequence[int], budget: int) -> list[int]:
        if self._logits is None:  # feed the token the previous step chose
            self._logits = self.decoder.forward([history[-1]], last_only=True)[-1]
        grammar = self._constraint
        row = self._sampler.prepare(self._logits, history, None if grammar is None else grammar.allowed())
        token = self._sampler.draw(row)
        if self.n_logprobs is not None:  # the one extra softmax, only when asked
            self.logprobs.append((token, *choice_logprobs(row, token, self.n_logprobs)))
        if grammar is not None:
            grammar.advance(token)
        self._logits = None
        return [token]

    def draft_stats(self) -> DraftStats | None:
        return None

    def forced_stats(self) -> None:
        return None


class Generation:
    """One generation: iterate it for text pieces; afterwards `.text`, `.token_ids`, `.stats` hold the result.

    The decoder is reset and the prompt prefilled when iteration starts; with a `session` (edge.session) the
    KV the decoder already holds is reused and only the prompt's new suffix is prefilled. `cancel` is polled
    between prefill chunks and between tokens; when it returns True the generation ends with stop_reason
    "cancelled" (or raises GenerationCancelled with `raise_on_cancel`); the decoder stays usable either way.
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
        decoding: Decoding | None = None,
        session: KVSession | None = None,
        keep: int | None = None,
        logprobs_into: list[TokenLogprob] | None = None,
    ) -> None:
        self.decoder = decoder
        self.keep = keep  # a conversation's system prompt span (KVSession.window); None: a plain prompt
        self.decoding = decoding  # None: plain decoding on `decoder`
        self.session = session  # None: reset the decoder; else reuse the KV it holds (edge.session)
        self.tokenizer = tokenizer
        self.prompt_ids = list(prompt_ids)
        self.config = config or GenerationConfig()
        self.cancel = cancel
        self.raise_on_cancel = raise_on_cancel
        self.token_ids: list[int] = []
        # one per token in token_ids, with config.logprobs set (`logprobs_into`: a list to fill as they come)
        self.logprobs: list[TokenLogprob] = [] if logprobs_into is None else logprobs_into
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
        if self.session is None:
            return self._generate()
        return self.session.track(self, self._generate())

    def _generate(self) -> Iterator[str]:
        cfg, dec, tok = self.config, self.decoder, self.tokenizer
        if self.session is not None and self.prompt_ids:  # a conversation too long drops its oldest turns
            self.prompt_ids = self.session.window(self.prompt_ids, keep=self.keep, reserve=cfg.max_tokens)
            self.stats.n_prompt_tokens = len(self.prompt_ids)
        self._check_fits()
        decoding, constraint = self._decoding()
        stopper = _StopMatcher(cfg.stop)
        stream = tok.stream()
        eog = frozenset() if cfg.ignore_eos else tok.eog_ids
        history = list(self.prompt_ids)
        stats = self.stats

        if self.session is None:
            dec.reset()
        else:
            stats.n_cached_tokens = self.session.prepare(self.prompt_ids)
        t0 = time.perf_counter()
        logits = self._prefill(stats.n_cached_tokens)
        t1 = time.perf_counter()
        stats.prefill_s = t1 - t0
        if logits is not None:
            decoding.begin(self.prompt_ids, logits, cfg.sampling, constraint, cfg.fast_forward)
        t_decode = 0.0
        while logits is not None:
            if len(self.token_ids) >= cfg.max_tokens:
                stats.stop_reason = "length"
                break
            if self.cancel is not None and self.cancel():
                stats.stop_reason = "cancelled"
                break
            ts = time.perf_counter()
            tokens = decoding.step(history, cfg.max_tokens - len(self.token_ids))
            if not self.token_ids:
                stats.ttft_ms = (time.perf_counter() - t0) * 1000.0
            else:
                t_decode += time.perf_counter() - ts
                stats.decode_steps += len(tokens)
            reason = ""
            for i, token in enumerate(tokens):
                if token in eog:
                    reason = "eos"
                    break
                self.token_ids.append(token)
                history.append(token)
                self._record(decoding)
                piece = stopper.feed(stream.push(token))
                if piece:
                    self.text += piece
                    yield piece
                if stopper.hit:
                    reason = "stop"
                    break
                # the grammar has taken all of the step's tokens (fast-forward): it completes at the last
                if constraint is not None and i == len(tokens) - 1 and constraint.done:
                    reason = "grammar"
                    break
                if len(self.token_ids) >= cfg.max_tokens:
                    reason = "length"
                    break
            if not reason and dec.position >= dec.n_ctx:
                reason = "context"
            if reason:
                stats.stop_reason = reason
                break
        stats.n_tokens = len(self.token_ids)
        stats.decode_s = t_decode
        stats.draft = decoding.draft_stats()
        stats.forced = decoding.forced_stats()
        if self.session is not None:
            kv = self.session.state()
            stats.n_dropped_tokens, stats.n_kept_tokens = kv.dropped, kv.kept if kv.dropped else 0
        if not stopper.hit:
            tail = stopper.feed(stream.flush())
            tail += "" if stopper.hit else stopper.flush()
            if tail:
                self.text += tail
                yield tail
        if stats.stop_reason == "cancelled" and self.raise_on_cancel:
            raise GenerationCancelled("generation cancelled", hint="the model is ready for the next prompt")

    def _decoding(self) -> tuple[Decoding, Constraint | None]:
        """How tokens are chosen, and the grammar's state when the output is constrained (compiled here,
        before the prefill's cost)."""
        grammar, dec, lp = self.config.grammar, self.decoder, self.config.logprobs
        thinking = self.config.thinking
        gated = thinking is not None and (
            thinking.gated or (grammar is not None and thinking.start != "answer")
        )
        if grammar is None and not gated:
            # logprobs force plain decoding: a draft's accepted tokens have no recorded target row
            return (self.decoding if lp is None else None) or PlainDecoding(dec, lp), None
        from edge.grammar import compile_grammar

        constraint = None if grammar is None else compile_grammar(grammar, self.tokenizer, dec.vocab_size)
        if gated:
            from edge.reasoning import ThinkingGate

            assert thinking is not None
            constraint = ThinkingGate(thinking, self.tokenizer, dec.vocab_size, constraint)  # type: ignore[assignment]
        if lp is not None:  # each token's own row, so one per forward
            return PlainDecoding(dec, lp), constraint
        if self.decoding is not None:  # speculative: drafts masked by the grammar, its forced tokens lead
            return self.decoding, constraint
        if not self.config.fast_forward:
            return PlainDecoding(dec), constraint
        from edge.speculative import SpeculativeDecoding

        return SpeculativeDecoding(dec, []), constraint  # no drafter: the forced tokens only (fast-forward)

    def _record(self, decoding: Decoding) -> None:
        """The entry of the token just appended, when logprobs are asked."""
        if self.config.logprobs is None or not isinstance(decoding, PlainDecoding):
            return
        token, logprob, top = decoding.logprobs[len(self.token_ids) - 1]
        first = len(self.token_ids) == 1
        entry = self._entry(token, logprob, first)
        alts = tuple(self._entry(i, v, first) for i, v in top)
        self.logprobs.append(TokenLogprob(entry.token, logprob, entry.bytes, token, alts))

    def _entry(self, token: int, logprob: float, first: bool) -> TokenLogprob:
        # the first token as the text has it (a SentencePiece answer's leading space is stripped)
        tok = self.tokenizer
        raw = tok.decode_bytes([token]) if first else tok.token_bytes(token)
        return TokenLogprob(raw.decode("utf-8", "replace"), logprob, tuple(raw), token)

    def _prefill(self, cached: int = 0) -> np.ndarray | None:
        """The last prompt position's logits, or None when cancelled between chunks. The decoder already
        holds the first `cached` prompt ids."""
        dec, ids = self.decoder, self.prompt_ids[cached:]
        if self.cancel is None:
            return dec.forward(ids, last_only=True)[-1]
        step = self.config.prefill_chunk
        logits = None
        for start in range(0, len(ids), step):
            if self.cancel():
                self.stats.stop_reason = "cancelled"
                return None
            logits = dec.forward(ids[start : start + step], last_only=True)[-1]
        return logits

    def run(self) -> str:
        """Consume the whole generation and return its text."""
        for _ in self:
            pass
        return self.text
