"""KV reuse across generations: the token ids a decoder's KV cache holds, so the next prompt prefills only the
part that differs.

A chat re-renders the whole conversation every turn; its rendered ids share a long prefix with what the KV
already holds (the earlier turns). `KVSession.prepare` keeps the longest common prefix, rolls back the rest (or
resets when the decoder cannot roll back that far) and tells the generation how many prompt ids to skip.

When a conversation outgrows the context, `KVSession.window` keeps its first `keep` ids (the system prompt) and
drops the oldest turns after them. A ring-buffer decoder pins those ids as its sinks instead (`set_sink`), so it
wraps across turns with the system prompt held; llama.cpp's linear cache gets the cut prompt re-prefilled.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from edge.devices.base import Decoder, rollback_limit, rollback_reach
from edge.history import Fed, common_prefix, window_note

__all__ = ["KVSession", "KVState", "common_prefix"]


@dataclass(frozen=True)
class KVState:
    """What a panel shows about the KV cache."""

    position: int  # tokens fed since the last reset (absolute, may exceed the capacity with a ring)
    capacity: int  # slots the KV holds (the ring buffer's, else the context)
    fill: int  # slots in use
    ring: bool  # a ring-buffer cache (edge's graph engine); False: llama.cpp's linear cache
    sink: int = 0  # slots pinned to the first tokens when the ring wraps
    dropped: int = 0  # conversation tokens no longer attended: cut by `KVSession.window` or ring-evicted
    kept: int = 0  # the conversation's first tokens (its system prompt) kept when older turns are dropped

    @property
    def wrapped(self) -> bool:
        """Older tokens have left the window (only the sinks and the most recent tokens are attended)."""
        return self.ring and self.position > self.capacity

    @property
    def left_window(self) -> bool:
        """Older turns left the window (on any backend)."""
        return self.dropped > 0

    @property
    def window_note(self) -> str | None:
        return window_note(self.dropped, self.kept)

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
        self._cut: _Cut | None = None  # the last `window` cut, reused while the same conversation goes on
        self._feeding: list[int] | None = None  # between prepare and settle: the prompt being fed

    @property
    def held(self) -> list[int]:
        return list(self._held)

    def holding(self) -> list[int]:
        """The ids the KV holds in place now, generation or not: between prepare and settle, the prompt's ids
        fed so far (the generated ones are not known here), else `held`. Read from another thread it may be
        out of date by a step; `PrefixCopy` copies no more than the decoder holds, and voids a copy the
        decoder moved under otherwise than by appending."""
        feeding = self._feeding
        if feeding is None:
            return list(self._held)
        return feeding[: min(len(feeding), self.decoder.position)] if self._known else []

    def window(self, prompt_ids: Sequence[int], *, keep: int | None, reserve: int = 0) -> list[int]:
        """The ids to feed for a conversation's `prompt_ids` whose first `keep` ids are its system prompt
        (None: not a conversation; nothing is pinned or cut, a prompt too long stays an error).

        A ring-buffer decoder pins the first `keep` ids as its sinks. When the prompt plus `reserve` (room for
        the answer, at most a quarter of the context) exceeds the context, the oldest ids after `keep` are cut,
        down to half the free room and at the start of a turn (the id that follows the system prompt opens every
        turn in the templates we know), so the next turns reuse the cut KV until it fills again.
        NOTE: llama.cpp can shift its cache instead (seq_rm + seq_add re-rotate K in place); a re-prefill keeps
        the KV exactly what a fresh prefill of the cut prompt computes, so later turns reuse it and match a
        fresh session, on every backend, at the cost of one prefill of half the context per cut.
        """
        ids = list(prompt_ids)
        if keep is None:
            self._cut = None
            return ids
        dec = self.decoder
        sinks = dec.capabilities().sinks
        if sinks is not None:
            sinks.set_sink(
                keep
            )  # a change empties the cache; prepare() sees position != len(held) and resets
        limit = dec.n_ctx
        k = max(0, min(keep, limit // 2, len(ids)))
        reserve = max(0, min(reserve, (limit - k) // 4))
        cut = self._cut
        dropped = 0
        if cut is not None and cut.keep == k and ids[: k + cut.dropped] == cut.head:
            dropped = cut.dropped  # the same conversation: keep the same cut, the KV after it is reused
        if len(ids) - dropped + reserve > limit:
            tail = max(2, (limit - k - reserve) // 2)
            start = max(k + dropped, len(ids) - tail)
            if 0 < k < len(ids):  # snap forward to the start of a turn, when one opens before the last 2 ids
                opener = ids[k]
                start = next((j for j in range(start, len(ids) - 2) if ids[j] == opener), start)
            dropped = start - k
        if dropped == 0:
            self._cut = _Cut(k, 0, [])
            return ids
        self._cut = _Cut(k, dropped, ids[: k + dropped])
        return ids[:k] + ids[k + dropped :]

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
        limit = rollback_reach(dec)  # a ring that never wrapped rolls back to any depth
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
        self._feeding = list(prompt_ids)
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
        self._feeding = None

    def adopt(self, ids: Sequence[int]) -> None:
        """The decoder's KV was given `ids` from elsewhere (`PrefixCopy`): hold them."""
        if self.decoder.position != len(ids):
            raise ValueError(f"the KV holds {self.decoder.position} tokens, not the {len(ids)} adopted")
        self._held, self._known, self._feeding = list(ids), True, None

    def invalidate(self) -> None:
        """Forget what the KV holds (the next prepare resets the decoder)."""
        self._held = []
        self._known = False
        self._feeding = None

    def moved_to(self, decoder: Decoder) -> KVSession:
        """A session for another decoder that takes this conversation over: nothing held, the same cut."""
        moved = KVSession(decoder)
        moved._cut = self._cut
        return moved

    def track(self, gen: Fed, pieces: Iterator[str]) -> Iterator[str]:
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
        kv = self.decoder.kv_fill()
        cut = self._cut.dropped if self._cut is not None else 0
        if kv.ring:
            return KVState(
                position=kv.position,
                capacity=kv.capacity,
                fill=kv.fill,
                ring=True,
                sink=kv.sink,
                dropped=cut + max(0, kv.position - kv.capacity),  # the ring evicted all beyond its capacity
                kept=kv.sink,
            )
        kept = self._cut.keep if self._cut is not None and cut else 0
        return KVState(
            position=kv.position, capacity=kv.capacity, fill=kv.fill, ring=False, dropped=cut, kept=kept
        )


@dataclass(frozen=True)
class _Cut:
    """Where `KVSession.window` cut a conversation: ids [keep, keep + dropped) are gone; `head` is the prompt up
    to the cut's end, so the next turn of the same conversation keeps the same cut."""

    keep: int
    dropped: int
    head: list[int]
