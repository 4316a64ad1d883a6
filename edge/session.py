"""KV reuse across generations: the token ids a decoder's KV cache holds, so the next prompt prefills only the
part that differs.

A chat re-renders the whole conversation every turn; its rendered ids share a long prefix with what the KV
already holds (the earlier turns). `KVSession.prepare` keeps the longest common prefix, rolls back the rest (or
resets when the decoder cannot roll back that far) and tells the generation how many prompt ids to skip.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from devices.base import Decoder, rollback_limit

if TYPE_CHECKING:
    from edge.generate import Generation

__all__ = ["KVSession", "KVState", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class KVState:
    """What a panel shows about the KV cache."""

    position: int  # tokens fed since the last reset (absolute, may exceed the capacity with a ring)
    capacity: int  # slots the KV holds (the ring buffer's, else the context)
    fill: int  # slots in use
    ring: bool  # a ring-buffer cache (edge's graph engine); False: llama.cpp's linear cache
    sink: int = 0  # slots pinned to the first tokens when the ring wraps

    @property
    def wrapped(self) -> bool:
        """Older tokens have left the window (only the sinks and the most recent tokens are attended)."""
        return self.ring and self.position > self.capacity

    @property
    def fill_ratio(self) -> float:
        return self.fill / self.capacity if self.capacity else 0.0


class KVSession:
    """Owns the token history of one decoder's KV cache. Not thread-safe: its owner (`edge.model.Model`)
    serializes generations with a lock.

    Invariant: after `prepare` or a finished generation, the KV holds exactly `held` (position == len(held)).
    After an error the history is unknown and the next `prepare` resets the decoder.
    """

    def __init__(self, decoder: Decoder) -> None:
        self.decoder = decoder
        self._held: list[int] = []
        self._known = True  # False after an error mid-generation: the KV content is not trusted
        self.reused_last = 0  # prompt ids the last prepare kept (for stats and tests)

    @property
    def held(self) -> list[int]:
        return list(self._held)

    def prepare(self, prompt_ids: Sequence[int]) -> int:
        """Bring the KV to the longest prefix of `prompt_ids` it can keep and return that prefix's length.

        At least the last two prompt ids are always fed: the last for the logits that choose the first new
        token, and one more because a one-token forward is not a prefill.
        NOTE: llama.cpp computes a one-token batch's K/V with other kernels than a multi-token batch's (logits
        downstream move by up to ~0.7 on smollm2 Q4_1, where any split into batches of >= 2 is bit-exact), so
        there a prompt's reused KV is exactly what a fresh prefill computes. K-quants differ for most splits,
        and generated tokens were fed one at a time: their reused KV carries such differences (docs/api.md).
        """
        dec, held = self.decoder, self._held
        keep = max(0, min(common_prefix(held, prompt_ids), len(prompt_ids) - 2))
        if not self._known or dec.position != len(held):
            keep = 0  # the decoder was used behind our back, or an error left it unknown
        drop = dec.position - keep
        limit = rollback_limit(dec)
        if keep > 0 and drop > 0 and (limit is None or drop <= limit):
            try:
                dec.rollback(drop)
            except ValueError:  # e.g. the ring's undo log was shorter than it said
                keep = 0
        elif drop > 0:
            keep = 0
        if keep == 0:
            dec.reset()
        del held[keep:]
        self._known = True
        self.reused_last = keep
        return keep

    def settle(self, fed: Sequence[int]) -> None:
        """After a generation: `fed` is the prompt and the tokens it chose, in order; the KV holds a prefix of it
        (the last chosen token is never fed). Tokens fed beyond `fed` (a draft round past a stop) roll back."""
        dec = self.decoder
        extra = dec.position - len(fed)
        if extra > 0:
            limit = rollback_limit(dec)
            if limit is not None and extra > limit:
                self.invalidate()
                return
            dec.rollback(extra)
        self._held = list(fed[: dec.position])
        self._known = True

    def invalidate(self) -> None:
        """Forget what the KV holds (the next prepare resets the decoder)."""
        self._held = []
        self._known = False

    def track(self, gen: Generation, pieces: Iterator[str]) -> Iterator[str]:
        """Yield `pieces` (the generation's own iterator) and settle the history when it ends, however it
        ends: finished, cancelled or closed early by the consumer; an error invalidates it."""
        ok = False
        try:
            yield from pieces
            ok = True
        except GeneratorExit:  # the consumer stopped iterating: the KV is consistent between tokens
            ok = True
            raise
        finally:
            if ok:
                self.settle([*gen.prompt_ids, *gen.token_ids])
            else:
                self.invalidate()

    def state(self) -> KVState:
        dec = self.decoder
        cache = getattr(dec, "cache", None)
        capacity = getattr(cache, "capacity", None)
        if cache is not None and capacity:
            return KVState(
                position=int(cache.position),
                capacity=int(capacity),
                fill=int(cache.fill),
                ring=True,
                sink=int(getattr(cache, "sink", 0)),
            )
        return KVState(position=dec.position, capacity=dec.n_ctx, fill=dec.position, ring=False)
