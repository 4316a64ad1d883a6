"""Speculative decoding on the `Decoder` contract: a drafter proposes k tokens, the target scores them plus one
in a single forward, and the tokens it agrees with are kept (Leviathan et al. 2023, Chen et al. 2023).

Greedy: a drafted token is kept when it is the target's argmax, so the output is the target's own. Sampling:
the rejection rule keeps the target's distribution exactly (accept with min(1, p/q), else draw from
norm(max(0, p - q)); the bonus token after a fully accepted draft comes from p). Rejected tokens are rolled
back in the target here and in the draft model by the drafter; k never exceeds a decoder's rollback limit.

k is chosen each round to maximise expected tokens per second, from the running acceptance rate and the
draft and verify costs measured on this machine (Leviathan et al. section 3.4 with a measured verify cost:
on a CPU a k+1 token forward costs far more than one decode step); k = 0 is a plain decode step.

Several drafters (`--draft auto`: prompt lookup, then a draft model) are asked in turn each round, each with
its own acceptance and cost estimates (the target's verify costs are shared): the first that drafts a token
is verified; a drafter that finds nothing (lookup without a match) costs nothing and the next is asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from edge.devices.base import Decoder, rollback_limit
from edge.drafters import Draft, Drafter
from edge.fastforward import FF_MAX, ForcedStats
from edge.kvcache.staging import piece_sizes
from edge.sampling import Sampler, SamplingConfig, probabilities

if TYPE_CHECKING:
    from edge.grammar import Constraint
    from edge.models.tokenizer import Tokenizer

__all__ = [
    "AcceptRule",
    "AdaptiveK",
    "DraftStats",
    "SpecConfig",
    "SpeculativeDecoding",
    "drafts_greedy",
    "greedy_guarantee",
    "open_speculative",
    "rejection_rule",
]

# (p, q, token, rng) -> None when `token` is accepted, else the token to emit instead (the round ends there).
# p: target distribution at the token's position; q: the draft's (None: a deterministic draft, q = one-hot).
AcceptRule = Callable[[np.ndarray, "np.ndarray | None", int, np.random.Generator], "int | None"]

# Until a verify size has been measured, each token beyond the largest measured one is assumed to cost this
# fraction of a single decode step: optimistic (batched matmuls are cheaper per token), so larger k gets tried
# once and then judged on its measured cost.
_OPTIMISTIC_MARGINAL = 0.25
_EMA_DOWN, _EMA_UP = 0.5, 0.1  # weight of a new cost measurement below / above the estimate
# alpha before any evidence, and how many tokens' worth of evidence that belief is worth: optimistic, so a
# draft is tried, and quickly overruled by what is measured
_PRIOR_ALPHA, _PRIOR_WEIGHT = 0.8, 1.0
# ... and for a copied passage (a draft of kind >= 1: lookup whose preceding tokens agree too), a belief worth
# more: its first token is right most of the time (78-95% of lookups matching 4+ tokens of context on edit
# prompts, qwen2.5-coder-1.5b), so one early miss must not switch copying off (a weight of 1 did: alpha 0.4)
_PRIOR_WEIGHT_COPIED = 4.0
_EXPLORE_AFTER = 32  # plain steps in a row before drafting is probed again
PLAIN_FOR_ESTIMATE = 8  # plain steps timed before DraftStats.speedup_estimate compares against them


def open_speculative(
    draft: str | None,
    target: Decoder,
    tokenizer: Tokenizer,
    target_name: str,
    *,
    target_backend: str,
    target_path: Path,
    draft_device: str = "cpu",
    draft_k: int = 16,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    precision: str = "fast",
    greedy: bool | None = None,
    kv_dtype: str = "auto",
) -> SpeculativeDecoding | None:
    """Speculative decoding as `--draft` asks (edge.drafters.open_drafters), or None where nothing drafts.
    `greedy`: whether greedy generations draft; None: `drafts_greedy`."""
    from edge.drafters import open_drafters

    config = SpecConfig(k_max=draft_k)  # invalid options fail before a draft loads
    drafters = open_drafters(
        draft,
        tokenizer,
        target_name,
        target.vocab_size,
        target_backend=target_backend,
        target_path=target_path,
        device=draft_device,
        n_ctx=n_ctx,
        n_threads=n_threads,
        precision=precision,
        kv_dtype=kv_dtype,
    )
    if not drafters:
        return None
    if greedy is None:
        greedy = drafts_greedy(draft, precision, target)
    return SpeculativeDecoding(target, drafters, config, greedy=greedy)


def drafts_greedy(draft: str | None, precision: str | None, target: Decoder) -> bool:
    """Whether greedy generations draft: always for a drafter asked for by name; for auto only where drafting
    cannot change them: a batch-invariant target (ORT's staged graph at --precision fast: a verify's rows equal
    one-token decoding bit for bit) or --precision exact (fp32: near-ties within ~1e-4 logits; docs/performance.md),
    or where it changes them no more than batching already does (a slot of a batch-invariant graph: BatchSlot)."""
    caps = target.capabilities()
    slot = caps.batch_slot
    return (
        draft != "auto"
        or precision == "exact"
        or caps.batch_invariant
        or (slot is not None and slot.rows_invariant)
    )


def greedy_guarantee(backend: str, precision: str | None, batch_invariant: bool = False) -> str:
    """What greedy speculative decoding promises on this backend (docs/performance.md, "Speculative decoding"): the
    target's own tokens wherever its top two logits are further apart than the difference between its
    batched (verify) and one-token (decode) logits, which depends on how the backend computes; none at all
    on a batch-invariant decoder."""
    if batch_invariant:
        return "identical to the target alone: a batched verify gives each token the logits decoding gives"
    if backend == "llamacpp":
        return (
            "target's tokens except near-ties: llama.cpp's batched verify rounds differently from its decode"
        )
    if precision == "exact":
        return "target's tokens except near-ties within ~1e-4 logits (fp32 batched vs one-token sums)"
    return "target's tokens except near-ties within int8 activation rounding (up to ~1 logit)"


@dataclass(frozen=True)
class SpecConfig:
    k_max: int = 16  # drafted tokens per round at most (the target scores k + 1)
    adaptive: bool = True  # False: draft k_max tokens every round (capped by limits), for experiments
    k_probe: int = 4  # the first drafting round's k, which measures the draft's cost
    decay: float = 0.95  # per-token forgetting of the acceptance estimate (about the last 20 tokens)

    def __post_init__(self) -> None:
        if self.k_max < 1 or self.k_probe < 1:
            raise ValueError(f"draft k must be >= 1 (got k_max={self.k_max}, k_probe={self.k_probe})")
        if not 0.0 < self.decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1] (got {self.decay})")


def rejection_rule(p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator) -> int | None:
    """The speculative sampling rule: accept with min(1, p/q), else draw from norm(max(0, p - q))."""
    q_tok = 1.0 if q is None else float(q[token])
    if rng.random() * q_tok < p[token]:
        return None
    if q is None:
        residual = p.copy()
        residual[token] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    if total <= 0.0:  # p == q up to rounding: rejection had probability ~0
        residual, total = p, p.sum()
    return int(rng.choice(residual.shape[0], p=residual / total))


@dataclass
class DraftStats:
    method: str  # "ngram" or the draft model's name
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0  # target forwards that verified at least one drafted token
    plain_steps: int = 0  # decode steps without a draft (k = 0)
    tokens: int = 0  # tokens the decode steps produced (accepted drafts + one per step)
    k_chosen: int = 0  # sum of k over the rounds, for the mean
    draft_s: float = 0.0
    verify_s: float = 0.0  # target forwards of the rounds with a draft
    step_s: float = 0.0  # whole decode steps: drafting, target forwards, acceptance
    target_step_s: float = 0.0  # measured cost of one plain single-token target step (running average)
    plain_s: float = 0.0  # whole plain steps (as step_s counts them), for the speedup estimate
    # with several drafters: name -> [drafted, accepted, rounds]
    sources: dict[str, list[int]] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Drafted tokens accepted per round (the bonus or correction token not counted)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_target_forward(self) -> float:
        steps = self.rounds + self.plain_steps
        return self.tokens / steps if steps else 0.0

    @property
    def speedup_estimate(self) -> float | None:
        """Decode rate achieved over the rate of plain single-token steps, both measured in this generation
        as whole steps (sampling and bookkeeping included, so a generation that never drafted reads 1.0);
        with fewer than PLAIN_FOR_ESTIMATE plain steps, over the target's measured one-token forward. None when
        neither was timed (a fixed k)."""
        if not self.step_s:
            return None
        if self.plain_steps >= PLAIN_FOR_ESTIMATE:
            return self.tokens / self.step_s * (self.plain_s / self.plain_steps)
        if not self.target_step_s:
            return None
        return self.tokens / self.step_s * self.target_step_s

    def summary(self, *, brief: bool = False) -> str:
        """One line for the CLI: `draft NAME: 63% of 190 accepted, 2.9 tok/forward, k 4.1, ~1.4x`; brief (the
        chat app's stats bar): `draft NAME: 63% accepted, 2.9 tok/forward`. A generation that drafted nothing
        (prompt lookup found no match) says so, not `0% of 0`."""
        if not self.drafted:
            return f"draft {self.method}: nothing drafted"
        if brief:
            return (
                f"draft {self.method}: {100 * self.acceptance_rate:.0f}% accepted, "
                f"{self.tokens_per_target_forward:.1f} tok/forward"
            )
        line = (
            f"draft {self.method}: {100 * self.acceptance_rate:.0f}% of {self.drafted} accepted, "
            f"{self.tokens_per_target_forward:.2f} tok/forward, k {self.k_chosen / max(self.rounds, 1):.1f}"
        )
        speedup = self.speedup_estimate
        return line if speedup is None else f"{line}, ~{speedup:.2f}x"

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 3),
            "tokens_per_target_forward": round(self.tokens_per_target_forward, 3),
            "rounds": self.rounds,
            "plain_steps": self.plain_steps,
            "mean_k": round(self.k_chosen / self.rounds, 2) if self.rounds else 0.0,
            "draft_ms_per_token": round(1e3 * self.draft_s / self.drafted, 3) if self.drafted else None,
            "verify_ms_per_round": round(1e3 * self.verify_s / self.rounds, 3) if self.rounds else None,
            "target_step_ms": round(1e3 * self.target_step_s, 3) if self.target_step_s else None,
            "speedup_estimate": None if self.speedup_estimate is None else round(self.speedup_estimate, 3),
            "sources": {
                name: {"drafted": d, "accepted": a, "rounds": r} for name, (d, a, r) in self.sources.items()
            },
        }


class AdaptiveK:
    """Picks k per round: argmax over k of E[tokens](k, alpha) / (k * draft cost + verify cost(k + 1)).

    alpha is a decayed count of accepted and rejected drafted tokens over a prior, kept per draft kind
    (`Draft.kind`: lookup's copied passages are right far more often than its bare n-gram matches); steps
    without a draft forget evidence too, so alpha drifts back to the (optimistic) prior and drafting is retried
    after a stretch where it did not pay (prompt lookup is right in bursts).
    """

    def __init__(
        self,
        cfg: SpecConfig,
        verify: dict[int, float] | None = None,
        pieces: Callable[[int, int], Sequence[int]] | None = None,
    ) -> None:
        self.cfg = cfg
        # (position, n) -> the sizes of the forwards a forward of n tokens at `position` runs as (a staged
        # graph cuts one at its window ends: kvcache.staging.split_windows); None: one forward
        self.pieces = pieces
        # decayed counts of accepted / rejected drafted tokens, per draft kind
        self._hits: dict[int, float] = {}
        self._misses: dict[int, float] = {}
        # tokens in a target forward -> seconds (running average); shared by the choosers of one target
        self.verify: dict[int, float] = {} if verify is None else verify
        self.draft_s: float | None = None  # seconds per drafted token (running average)
        self._idle = 0  # rounds in a row chosen plain

    def new_generation(self) -> None:
        """Forget the acceptance evidence (another prompt drafts differently) but keep the measured costs:
        they belong to the models and the machine, and re-measuring them probed a draft model that does not
        pay once per generation."""
        self._hits.clear()
        self._misses.clear()
        self._idle = 0

    @property
    def hits(self) -> float:
        return sum(self._hits.values())

    @property
    def misses(self) -> float:
        return sum(self._misses.values())

    def alpha_of(self, kind: int) -> float:
        hits, misses = self._hits.get(kind, 0.0), self._misses.get(kind, 0.0)
        weight = _PRIOR_WEIGHT_COPIED if kind else _PRIOR_WEIGHT
        return (hits + weight * _PRIOR_ALPHA) / (hits + misses + weight)

    @property
    def alpha(self) -> float:
        """The estimate for kind 0 (every draft of a draft model)."""
        return self.alpha_of(0)

    def choose(
        self, limit: int, kind: int = 0, position: int | None = None, pending: int = 1, forced: int = 0
    ) -> int:
        """k for this round; `position`: where the target's forward of `pending` + k tokens starts (its cost
        then counts the pieces it is cut into), None: any k + 1 tokens cost one forward of that size.
        `forced`: tokens the forward carries anyway after `pending` (a grammar's forced tokens, kept): the
        draft is weighed by what it adds to that forward, not against a one-token step."""
        cfg = self.cfg
        limit = min(limit, cfg.k_max)
        if limit <= 0:
            return 0
        if not cfg.adaptive:
            return limit
        if 1 not in self.verify:
            return 0  # measure a plain step first: every other choice is weighed against it
        if self.draft_s is None:
            return min(cfg.k_probe, limit)
        best_k = self._best(limit, self.alpha_of(kind), position, pending, forced)
        self._idle = 0 if best_k else self._idle + 1
        # Evidence only comes from drafting: after a long stretch of plain steps, probe once, as long as a
        # draft could pay at all (at 100% acceptance); else a bad stretch would stop drafting for good.
        if self._idle >= _EXPLORE_AFTER and self._best(limit, 1.0, position, pending, forced):
            self._idle = 0
            return min(cfg.k_probe, limit)
        return best_k

    def _best(
        self, limit: int, a: float, position: int | None = None, pending: int = 1, forced: int = 0
    ) -> int:
        def cost(n: int) -> float:  # a forward of n tokens after `pending`
            return (
                self.forward_cost(position, pending + n) if position is not None else self._verify_cost(n + 1)
            )

        # The forced tokens ride in the forward anyway and are not the draft's to earn: a draft is weighed by
        # what it adds to that forward, as if the forward without it were one plain step
        plain = self.verify[1]
        offset = cost(forced) - plain if forced else 0.0
        best_k, best_rate = 0, 1.0 / plain
        assert self.draft_s is not None
        for k in range(1, limit + 1):
            expected = (1.0 - a ** (k + 1)) / (1.0 - a) if a < 1.0 else k + 1.0
            rate = expected / (k * self.draft_s + cost(forced + k) - offset)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def forward_cost(self, position: int, n: int) -> float:
        """Seconds a forward of n tokens at `position` takes: the sum of its pieces' measured costs."""
        sizes = self.pieces(position, n) if self.pieces is not None else (n,)
        return sum(self._verify_cost(size) for size in sizes)

    def splits(self, position: int, n: int) -> bool:
        """Whether a forward of n tokens at `position` runs as more than one forward."""
        return self.pieces is not None and len(self.pieces(position, n)) > 1

    def _verify_cost(self, n: int) -> float:
        known = self.verify
        if n in known:
            return known[n]
        lower = max(m for m in known if m < n)  # 1 is always known here
        upper = min((m for m in known if m > n), default=None)
        optimistic = known[lower] + (n - lower) * _OPTIMISTIC_MARGINAL * known[1]
        if upper is None:
            return optimistic
        # between two measured sizes, still optimistic until measured: batched kernels have sweet spots
        # (llama.cpp's CPU matmul: 16 tokens cost less than 12 here)
        w = (n - lower) / (upper - lower)
        return min(optimistic, (1.0 - w) * known[lower] + w * known[upper])

    def observe_forward(self, n: int, seconds: float) -> None:  # the shared verify costs
        self.verify[n] = _average(self.verify.get(n), seconds)

    def observe_draft(self, n: int, seconds: float) -> None:
        self.draft_s = _average(self.draft_s, seconds / n)

    def observe_round(self, drafted: int, accepted: int, kind: int = 0) -> None:
        d = self.cfg.decay
        hits, misses = self._hits.get(kind, 0.0), self._misses.get(kind, 0.0)
        for i in range(min(drafted, accepted + 1)):  # the tokens after the first rejection were not judged
            hit = i < accepted
            hits = d * hits + hit
            misses = d * misses + (not hit)
        self._hits[kind], self._misses[kind] = hits, misses

    def observe_plain_step(self) -> None:
        for counts in (self._hits, self._misses):
            for kind in counts:
                counts[kind] *= self.cfg.decay


def _average(old: float | None, new: float) -> float:
    """Running estimate of a cost, kept near its lower envelope: other work on the machine only ever adds
    time, so a faster measurement moves the estimate a lot and a slower one a little (clipped at 2x)."""
    if old is None:
        return new
    if new < old:
        return (1.0 - _EMA_DOWN) * old + _EMA_DOWN * new
    return (1.0 - _EMA_UP) * old + _EMA_UP * min(new, 2.0 * old)


class SpeculativeDecoding:
    """The `Decoding` strategy of `edge.generate.Generation` with a drafter (see the module docstring). With no
    drafter it is fast-forward (edge/fastforward.py): a constrained generation's forced tokens, verified as a
    deterministic draft."""

    def __init__(
        self,
        target: Decoder,
        drafter: Drafter | Sequence[Drafter],
        config: SpecConfig | None = None,
        *,
        rule: AcceptRule = rejection_rule,
        greedy: bool = True,
    ) -> None:
        self.target = target
        # False: greedy generations run without drafts (`--draft auto` where a batched verify could round a
        # near-tie the other way: see drafts_greedy; sampling keeps the target's distribution either way)
        self.greedy = greedy
        self.drafters: list[Drafter] = [drafter] if not isinstance(drafter, Sequence) else list(drafter)
        self.drafter = self.drafters[0] if self.drafters else None
        self.name = "+".join(d.name for d in self.drafters)  # "ngram+qwen2.5-coder-0.5b" for --draft auto
        self.config = config or SpecConfig()
        self.rule = rule  # injectable so tests can show that a wrong rule changes the distribution
        self.k_caps = [
            min(x for x in (self.config.k_max, rollback_limit(target), d.max_k) if x is not None)
            for d in self.drafters
        ]
        self.k_cap = max(self.k_caps, default=0)
        self._sampling = SamplingConfig()
        self._sampler = Sampler(self._sampling)
        self._rng = np.random.default_rng()
        self._row: np.ndarray | None = None
        self._rollback = rollback_limit(target)  # forced and drafted tokens of a round roll back together
        self._constraint: Constraint | None = None
        self.forced: ForcedStats | None = None  # a constrained generation's forced tokens (fast-forward)
        self._new_choosers()
        self.stats = DraftStats(self.name)

    def _new_choosers(self) -> None:
        verify: dict[int, float] = {}  # the target's forward costs, whichever drafter fed it
        pieces = piece_sizes if self.target.capabilities().staged else None
        self.choosers = [AdaptiveK(self.config, verify, pieces) for _ in self.drafters]
        # the chooser a round without a draft reports its forward to (fast-forward: the only one)
        self.chooser = self.choosers[0] if self.choosers else AdaptiveK(self.config, verify, pieces)

    def applies(self, sampling: SamplingConfig) -> bool:
        """Whether a generation with these sampling settings drafts (see `greedy`)."""
        return self.greedy or not sampling.greedy

    # -- the Decoding protocol ---------------------------------------------------------------------
    def begin(
        self,
        prompt_ids: Sequence[int],
        logits: np.ndarray,
        sampling: SamplingConfig,
        constraint: Constraint | None = None,
        forcing: bool = True,
    ) -> None:
        """Start a generation: the target holds the prompt, `logits` is its last position's row. With a
        `constraint` every row is masked by the grammar before it judges a token (so sampling keeps the
        constrained distribution exactly, as plain decoding draws it), drafts hold only tokens the grammar
        admits, and (`forcing`) the grammar's forced tokens lead each round's draft, as fast-forward feeds them."""
        self._sampling = sampling
        self._sampler = Sampler(sampling)  # prepares the rows as plain decoding does (its draws use _rng)
        self._rng = np.random.default_rng(sampling.seed)
        self._row = logits
        self._constraint = constraint
        self.forced = ForcedStats() if constraint is not None and forcing else None
        for ch in self.choosers:
            ch.new_generation()
        self.stats = DraftStats(self.name)
        for d in self.drafters:
            d.begin(prompt_ids)

    def step(self, history: Sequence[int], budget: int) -> list[int]:
        """1..budget next tokens; `history` is the prompt and every token returned so far."""
        t0 = time.perf_counter()
        target = self.target
        pending = [] if self._row is not None else [history[-1]]  # the last token is not in the KV yet
        start = target.position
        room = min(budget - 1, target.n_ctx - start - len(pending))  # tokens a round may add before its last
        forced = self._forced_tokens(room)
        k, draft, chooser, source = self._draft(history, forced, room, start, len(pending))
        t1 = time.perf_counter()
        tokens = [*forced, *draft.tokens]
        feed = pending + tokens
        rows = target.forward(feed, last_only=not tokens) if feed else np.empty((0, 0))
        if self._row is not None:  # the prefill already scored the first position
            rows = np.concatenate([self._row[None], rows]) if feed else self._row[None]
            self._row = None
        t2 = time.perf_counter()
        drafted = list(draft.probs) if draft.probs is not None else [None] * len(draft.tokens)
        n_ok, last = self._verify(rows, tokens, [*([None] * len(forced)), *drafted], history, len(forced))
        target.rollback(len(tokens) - n_ok)
        t3 = time.perf_counter()

        if feed and not chooser.splits(start, len(feed)):  # a cut forward's time is not that of its size
            chooser.observe_forward(len(feed), t2 - t1)
        judged = n_ok >= len(forced)  # a rejected forced token leaves the draft after it unjudged
        self._count(
            draft, k, max(0, n_ok - len(forced)), chooser, source, (t0, t1, t2), fed=bool(feed), judged=judged
        )
        if forced and self.forced is not None:
            self.forced.rounds += 1
            self.forced.forced += min(n_ok, len(forced))
            self.forced.rejected += n_ok < len(forced)
        if feed:  # the first token, picked from the prefill's row, is not a decode step
            self.stats.tokens += n_ok + (last is not None)
            self.stats.step_s += t3 - t0
            if not draft.tokens:  # as plain_steps counts them (forced tokens may ride: see ForcedStats)
                self.stats.plain_s += t3 - t0
        return [*tokens[:n_ok], *([] if last is None else [last])]

    def _forced_tokens(self, room: int) -> list[int]:
        """The grammar's forced tokens (fast-forward) that lead this round's draft; [] without forcing."""
        if self.forced is None or self._constraint is None:
            return []
        cap = FF_MAX if self._rollback is None else min(FF_MAX, self._rollback)
        return self._constraint.forced()[: max(0, min(room, cap))]

    def _draft(
        self, history: Sequence[int], forced: list[int], room: int, position: int, pending: int
    ) -> tuple[int, Draft, AdaptiveK, Drafter | None]:
        """(k chosen, the draft that follows `forced`, its chooser, its drafter): the first drafter that drafts
        anything, each given the grammar's state after `forced` (rolled back after)."""
        grammar = self._constraint
        if grammar is not None:
            for token in forced:
                grammar.advance(token)
        try:
            if grammar is not None and grammar.done:  # the forced tokens complete the output
                return 0, Draft([]), self.chooser, None
            return self._ask([*history, *forced], room - len(forced), position, pending, len(forced))
        finally:
            if grammar is not None:
                grammar.rollback(len(forced))

    def _ask(
        self, history: Sequence[int], room: int, position: int, pending: int, forced: int
    ) -> tuple[int, Draft, AdaptiveK, Drafter | None]:
        """`pending`: the token the verify forward carries first (0 or 1); `forced`: the forced tokens after it,
        which the target and a draft model may have to roll back with the draft (their limits count them)."""
        for drafter, ch, cap in zip(self.drafters, self.choosers, self.k_caps, strict=True):
            limit = min(cap, room)
            for reach in (self._rollback, drafter.max_k):
                limit = limit if reach is None else min(limit, reach - forced)
            if drafter.free and limit > 0:  # draft the most, keep what this kind of draft is worth
                full = drafter.draft(history, limit, self._sampling, self._rng, self._constraint)
                k = ch.choose(len(full.tokens), full.kind, position, pending, forced) if full.tokens else 0
                draft = replace(
                    full, tokens=full.tokens[:k], probs=None if full.probs is None else full.probs[:k]
                )
            else:
                k = ch.choose(limit, 0, position, pending, forced)
                draft = (
                    drafter.draft(history, k, self._sampling, self._rng, self._constraint)
                    if k > 0
                    else Draft([])
                )
            if draft.tokens:
                return k, draft, ch, drafter
        return 0, Draft([]), self.chooser, None

    def _count(
        self,
        draft: Draft,
        k: int,
        n_ok: int,
        chooser: AdaptiveK,
        source: Drafter | None,
        times: tuple[float, float, float],
        *,
        fed: bool,
        judged: bool,
    ) -> None:
        """The round's drafting statistics and acceptance evidence. `fed`: the round ran a target forward (the
        first token comes from the prefill's row); `judged`: the target reached the draft (no evidence
        either way when a forced token before it was rejected)."""
        st = self.stats
        t0, t1, t2 = times
        if draft.tokens:
            st.rounds += 1
            st.k_chosen += k
            st.drafted += len(draft.tokens)
            st.accepted += n_ok
            st.draft_s += t1 - t0
            st.verify_s += t2 - t1
            if judged:
                chooser.observe_draft(len(draft.tokens), t1 - t0)
                chooser.observe_round(len(draft.tokens), n_ok, draft.kind)
            if len(self.drafters) > 1 and source is not None:
                counts = st.sources.setdefault(source.name, [0, 0, 0])
                counts[0] += len(draft.tokens)
                counts[1] += n_ok
                counts[2] += 1
        elif fed:
            st.plain_steps += 1
            for ch in self.choosers:
                ch.observe_plain_step()
        if 1 in chooser.verify:
            st.target_step_s = chooser.verify[1]

    def draft_stats(self) -> DraftStats | None:
        return self.stats if self.drafters else None  # fast-forward alone drafts nothing

    def forced_stats(self) -> ForcedStats | None:
        return self.forced

    def close(self) -> None:
        for d in self.drafters:
            d.close()

    # -- verification ------------------------------------------------------------------------------
    def _verify(
        self,
        rows: np.ndarray,
        tokens: Sequence[int],
        probs: Sequence[np.ndarray | None],
        history: Sequence[int],
        n_forced: int = 0,
    ) -> tuple[int, int | None]:
        """(drafted tokens accepted, the token that follows them) from the target's rows [k + 1, vocab]; the
        token is None where the grammar completes at the last accepted one (nothing may follow). `probs`:
        each token's q row (None: deterministic, q one-hot); the first `n_forced` are the grammar's forced
        tokens. Rows are prepared as plain decoding prepares them (`Sampler.prepare`: the grammar's mask,
        then the repeat penalty)."""
        cfg, rng, grammar = self._sampling, self._rng, self._constraint
        penalize = cfg.repeat_penalty != 1.0 and cfg.repeat_last_n != 0
        # the repeat penalty looks at the last repeat_last_n tokens, accepted drafts included
        recent = list(history[-cfg.repeat_last_n :] if cfg.repeat_last_n > 0 else history) if penalize else []
        for i, token in enumerate(tokens):
            allowed = None if grammar is None else grammar.allowed()
            if not (i < n_forced and self._certain(allowed, token)):
                row = self._sampler.prepare(rows[i], recent, allowed)
                if cfg.greedy:
                    other = int(np.argmax(row))
                    other = None if other == token else other
                else:
                    other = self.rule(probabilities(row, cfg), probs[i], token, rng)
                if other is not None:
                    return i, self._kept(other)
            if grammar is not None:
                grammar.advance(token)
                if grammar.done:
                    return i + 1, None
            if penalize:
                recent.append(token)
        row = self._sampler.prepare(rows[len(tokens)], recent, None if grammar is None else grammar.allowed())
        if cfg.greedy:
            return len(tokens), self._kept(int(np.argmax(row)))
        p = probabilities(row, cfg)
        return len(tokens), self._kept(int(rng.choice(p.shape[0], p=p)))

    def _certain(self, allowed: np.ndarray | None, token: int) -> bool:
        """A forced token the grammar admits alone has probability 1 under every sampling chain: nothing to
        judge (the row's softmax is skipped). Else the row decides, and ForcedStats counts it as drawn."""
        if allowed is not None and allowed[token] and np.count_nonzero(allowed) == 1:
            return True
        if self.forced is not None:
            self.forced.drawn += 1
        return False

    def _kept(self, token: int) -> int:
        """A token drawn by the round (a correction or the bonus), the grammar advanced with it."""
        if self._constraint is not None:
            self._constraint.advance(token)
        return token
