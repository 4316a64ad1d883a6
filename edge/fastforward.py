"""Forced-token fast-forward: where the grammar admits one continuation (a key, punctuation, a const), its
tokens are appended without a draw and fed in one multi-token forward (SGLang's jump-forward, llguidance's
fast-forward tokens); the token after them is drawn from the row of the last one.

The output keeps the constrained distribution exactly: where llguidance forces bytes, its mask admits only the
forced spelling (checked over tests/data/schemas.json), so the forced token has probability 1 under every
sampling chain. Each one is checked against the mask (~0.1 ms); should the grammar admit others there too, the
row draws as plain decoding would, and a token other than the forced one replaces it and ends the round (its
rest rolls back out of the KV). Greedy outputs then differ from plain decoding only where a multi-token
forward's logits differ from one-token steps' (none on a `batch_invariant` decoder).

The k + 1 tokens of a round cost one forward: on the own graphs about two decode steps for eight tokens, on
llama.cpp less than k steps too (edge bench's `batch_cost_steps`), so it pays on every backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edge.devices.base import Decoder, rollback_limit
from edge.sampling import Sampler, SamplingConfig

if TYPE_CHECKING:
    from edge.grammar import Constraint

__all__ = ["FF_MAX", "FastForwardDecoding", "ForcedStats"]

# Forced tokens fed in one round at most: long keys and consts are rarely longer, and a forward this size
# still costs a few decode steps; the decoder's rollback limit caps it too.
FF_MAX = 16


@dataclass
class ForcedStats:
    """What fast-forward did in one generation."""

    forced: int = 0  # tokens appended without a draw (the grammar admitted them alone, or the draw agreed)
    rejected: int = 0  # forced tokens the row drew otherwise (each ends its round)
    rounds: int = 0  # forwards that carried forced tokens
    drawn: int = 0  # forced tokens checked by a draw: the grammar admitted other tokens there too

    def summary(self) -> str:
        """One line for the CLI: `forced 23 tokens in 7 forwards` (`, 1 rejected` when the model disagreed)."""
        line = f"forced {self.forced} tokens in {self.rounds} forwards"
        return line if not self.rejected else f"{line}, {self.rejected} rejected"

    def to_dict(self) -> dict[str, Any]:
        return {"forced": self.forced, "rejected": self.rejected, "rounds": self.rounds, "drawn": self.drawn}


class FastForwardDecoding:
    """The `Decoding` strategy of a constrained generation (edge.generate): the grammar's forced tokens are
    fed with the previous token in one forward, then the next token is drawn (see the module docstring)."""

    def __init__(self, decoder: Decoder, k_max: int = FF_MAX) -> None:
        self.decoder = decoder
        limit = rollback_limit(decoder)  # a rejected forced token rolls the rest back
        self.k_max = k_max if limit is None else min(k_max, limit)
        self.stats = ForcedStats()
        self._sampler = Sampler(SamplingConfig())
        self._row: np.ndarray | None = None
        self._constraint: Constraint | None = None
        self._forcing = True

    def begin(
        self,
        prompt_ids: Sequence[int],
        logits: np.ndarray,
        sampling: SamplingConfig,
        constraint: Constraint | None = None,
        forcing: bool = True,
    ) -> None:
        self._sampler = Sampler(sampling)
        self._row = logits
        self._constraint = constraint
        self._forcing = forcing
        self.stats = ForcedStats()

    def step(self, history: Sequence[int], budget: int) -> list[int]:
        dec, grammar = self.decoder, self._constraint
        pending = [] if self._row is not None else [history[-1]]  # the last token is not in the KV yet
        room = min(self.k_max, budget - 1, dec.n_ctx - dec.position - len(pending))  # the draw needs budget
        forced = grammar.forced()[: max(0, room)] if grammar is not None and self._forcing else []
        rows = self._rows(pending, forced)  # rows[i] scores forced[i]; rows[-1] the token after them
        if forced:
            self.stats.rounds += 1
        seen = list(history)  # what the draws see (the repeat penalty): history and the kept tokens
        for i, token in enumerate(forced):
            assert grammar is not None
            other = self._check(rows[i], seen, token)
            if other is not None:  # the row drew otherwise: its token ends the round
                dec.rollback(len(forced) - i)
                self.stats.rejected += 1
                grammar.advance(other)
                return [*seen[len(history) :], other]
            grammar.advance(token)
            seen.append(token)
            self.stats.forced += 1
            if grammar.done:  # the value is complete: nothing is drawn after it
                dec.rollback(len(forced) - i - 1)
                return seen[len(history) :]
        return [*seen[len(history) :], self._draw(rows[-1], seen)]

    def draft_stats(self) -> None:
        return None

    def forced_stats(self) -> ForcedStats:
        return self.stats

    def _rows(self, pending: list[int], forced: list[int]) -> np.ndarray:
        """The logits rows of `pending` + `forced` in one forward (the prefill's row stands for the first)."""
        if self._row is None:
            return self.decoder.forward([*pending, *forced], last_only=not forced)
        first, self._row = self._row[None], None
        return np.concatenate([first, self.decoder.forward(forced)]) if forced else first

    def _draw(self, row: np.ndarray, history: Sequence[int]) -> int:
        """The next token as plain decoding draws it: from the row under the grammar's mask."""
        grammar = self._constraint
        token = self._sampler(row, history, None if grammar is None else grammar.allowed())
        if grammar is not None:
            grammar.advance(token)
        return token

    def _check(self, row: np.ndarray, history: Sequence[int], token: int) -> int | None:
        """None when the forced `token` stands, else the token this row draws instead (not yet advanced)."""
        assert self._constraint is not None
        allowed = self._constraint.allowed()
        if allowed[token] and np.count_nonzero(allowed) == 1:  # probability 1, whatever the sampling chain
            return None
        self.stats.drawn += 1
        drawn = self._sampler(row, history, allowed)
        return None if drawn == token else drawn
