"""Forced-token fast-forward: where the grammar admits one continuation (a key, punctuation, a const), its
tokens are appended without a draw and fed in one multi-token forward (SGLang's jump-forward, llguidance's
fast-forward tokens); the token after them is drawn from the row of the last one.

The output keeps the constrained distribution exactly: where llguidance forces bytes, its mask admits only the
forced spelling (checked over tests/data/schemas.json), so the forced token has probability 1 under every
sampling chain. Each one is checked against the mask (~0.1 ms); should the grammar admit others there too, the
row judges it as a draft (the rejection rule with a one-hot q: kept with its probability, else the row's
draw from the rest), and a token other than the forced one replaces it and ends the round (its rest rolls
back out of the KV). Greedy outputs then differ from plain decoding only where a multi-token forward's logits
differ from one-token steps' (none on a `batch_invariant` decoder).

The forced tokens are verified as a deterministic draft by `edge.speculative.SpeculativeDecoding`, which leads
each round's draft with them: with a drafter they precede its (masked) draft, without one they are the whole
of it (a `SpeculativeDecoding` with no drafter: edge.generate).

The k + 1 tokens of a round cost one forward: on the own graphs about two decode steps for eight tokens, on
llama.cpp less than k steps too (edge bench's `batch_cost_steps`), so it pays on every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FF_MAX", "ForcedStats"]

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
