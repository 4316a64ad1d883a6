"""The contract every backend implements (see docs/architecture.md).

The core (`forward`, `rollback`, `reset`, `close`, `kv_fill`) is what every decoder has. Abilities only some
have are declared, never probed: `capabilities()` returns a `Capabilities` whose fields say how far rollback
reaches, and hand out the sink control and the partition view when the decoder has them (None when not).
`tests/devices/test_conformance.py` runs every runnable backend through all of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "BatchSlot",
    "BatchStats",
    "Batching",
    "Capabilities",
    "Decoder",
    "KVFill",
    "PartitionInfo",
    "Partitions",
    "PhaseSplit",
    "PrefixCopy",
    "Sinks",
    "Truncation",
    "rollback_limit",
    "rollback_reach",
]


@dataclass(frozen=True)
class KVFill:
    """How full a decoder's KV cache is (what a panel shows)."""

    position: int  # tokens fed since the last reset (a ring's may exceed its capacity)
    capacity: int  # tokens the KV holds
    fill: int  # slots in use
    ring: bool  # a ring buffer: it wraps, keeping `sink` first tokens; False: a linear cache that overflows
    sink: int = 0  # slots pinned to the first tokens when the ring wraps
    dtype: str = "f32"  # the K/V's element type: f32 | f16 (--kv-dtype)


@dataclass(frozen=True)
class PartitionInfo:
    """One layer range of a partitioned decoder and where it runs."""

    layers: range
    head: bool  # carries the final norm and the output head
    backend: str
    device: str

    @property
    def label(self) -> str:
        return f"{self.layers.start}-{self.layers.stop - 1}{'+head' if self.head else ''} {self.backend}:{self.device}"


@dataclass(frozen=True)
class PhaseSplit:
    """A decoder split by phase (devices/phase_split.py): a forward of more than `threshold` tokens (a prompt)
    runs on the prefill half, the others (decode steps, short verifies) on the decode half, one KV between them."""

    prefill: str  # the halves' "backend:device:precision", e.g. "openvino:cpu:bf16"
    decode: str
    threshold: int

    @property
    def label(self) -> str:
        return f"prefill {self.prefill}, decode {self.decode}"


class Sinks(Protocol):
    """A ring-buffer KV that pins its first tokens (a chat's system prompt) when it wraps."""

    @property
    def max_sink(self) -> int:
        """The most tokens `set_sink` pins."""
        ...

    def set_sink(self, n: int) -> bool:
        """Pin the first n tokens (clamped to the backend's bounds); a change empties the cache (returns True)."""
        ...


class Partitions(Protocol):
    """A decoder split into layer ranges, each on its own (backend, device), timed separately."""

    def partition_info(self) -> tuple[PartitionInfo, ...]:
        """The partitions in order: they cover every layer, the last carries the head."""
        ...

    def partition_times(self) -> tuple[float, ...]:
        """Seconds spent in each partition's graph since load (edge bench reports the differences)."""
        ...


class Batching(Protocol):
    """Sequences on one copy of the weights: `slots(n)` gives n decoders, each with its own KV cache (ring,
    sinks, rollback), whose forwards from concurrent threads run packed into one graph run (continuous
    batching, devices/batch.py). This decoder itself is not used afterwards; the last slot closed closes it."""

    def slots(self, n: int) -> list[Decoder]: ...


class Truncation(Protocol):
    """Rollback beyond `max_rollback` where the KV allows it at the moment (a ring that has not wrapped frees
    the dropped tokens' slots): a conversation re-sent with a history that differs 100 tokens back keeps its KV
    up to the first differing token instead of prefilling it all again."""

    def rollback_reach(self) -> int:
        """How many of the last tokens `rollback` can undo right now (>= max_rollback's guarantee)."""
        ...


class BatchStats(Protocol):
    """What a batch engine has run (devices/batch.py): its packed runs (`steps`, on a phase split the decode
    half's) and the slots' pieces they carried, the tokens of every run, the steps that carried a many-token
    piece beside one-token ones, and the prompt chunks run on a split's prefill half."""

    steps: int
    pieces: int
    tokens: int
    mixed_steps: int
    prefill_runs: int  # a phase split's prompt chunks run on its prefill half (0 on one graph)

    @property
    def mean_batch(self) -> float: ...


class BatchSlot(Protocol):
    """One sequence of a batch (a `Batching` slot): the steps it rode in and its engine's totals."""

    ridden: tuple[int, int]  # (steps this slot rode in, pieces those steps carried in all)
    # The shared graph is batch-invariant: a slot's k-token forward gives the rows its one-token forwards
    # give beside the same other slots. Greedy drafts then change a slot's output only where batching itself
    # does (the other slots' columns change the attention's summation order), so `--draft auto` drafts them.
    rows_invariant: bool

    @property
    def engine(self) -> BatchStats: ...


class PrefixCopy(Protocol):
    """Taking another sequence's KV prefix instead of computing it (batch slots of one engine: a shared system
    prompt, a conversation that moved to another slot)."""

    def copy_prefix_from(
        self, other: Decoder, count: Callable[[], int], adopt: Callable[[int], None] | None = None
    ) -> int:
        """Hold `other`'s first tokens, copied (this KV is replaced): `count()`, called while this KV cannot
        move, says how many (`other` may be generating meanwhile: it is not waited for, and what it holds may
        grow). `adopt(n)` runs once the copy is in place and before another slot may copy from it (the caller
        records the ids it holds now). Returns how many were copied: 0, nothing changed, where `other` is no
        sibling, its KV no longer holds them in place (a wrapped ring), or it moved otherwise than by appending
        during the copy."""
        ...


@dataclass(frozen=True)
class Capabilities:
    """What a decoder can do beyond the core contract. Every decoder states `max_rollback`; the others are
    None when it has not got the ability."""

    max_rollback: int | None  # rollback(n) always works for n <= this; None: for any n <= position
    sinks: Sinks | None = None
    partitions: Partitions | None = None
    # A forward of k tokens gives each row the logits k one-token forwards give, bit for bit (staged attention
    # on a runtime whose kernels are row-invariant): greedy speculative decoding equals plain decoding.
    batch_invariant: bool = False
    # A forward of <= kvcache.staging.WINDOW tokens is cut where it crosses a window end (staged attention),
    # so it costs its pieces (kvcache.staging.piece_sizes): speculation weighs a draft's k by that
    staged: bool = False
    # The runtime prepares its kernels on the first many-row and one-row runs after load (OpenVINO's CPU plugin
    # repacks the weights then), so the first prompt costs more than later ones unless a warm-up ran them
    first_run_costs: bool = False
    batching: Batching | None = None
    truncation: Truncation | None = None
    prefix_copy: PrefixCopy | None = None
    batch_slot: BatchSlot | None = None
    phases: PhaseSplit | None = None  # split by phase: which halves run the prompts and the tokens
    # bytes of weights a one-token forward reads (edge's graphs: their data; llama.cpp: the file's blocks as
    # stored); None: not known (partitioned plans)
    weights_read: int | None = None


@runtime_checkable
class Decoder(Protocol):
    vocab_size: int
    position: int  # tokens held in the KV cache
    n_ctx: int  # tokens the KV cache can hold
    backend: str  # e.g. "llamacpp"
    device: str  # e.g. "cpu"

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        """Logits [len(tokens), vocab] (or [1, vocab] with last_only); appends the tokens to the KV cache."""
        ...

    def rollback(self, n: int) -> None:
        """Forget the last n tokens (speculative rejection, cancelled turns)."""
        ...

    def reset(self) -> None: ...

    def close(self) -> None: ...

    def kv_fill(self) -> KVFill: ...

    def capabilities(self) -> Capabilities: ...


WARM_ROWS = 16  # a warm-up's many-row forward: enough rows for the runtimes' batched kernels (a verify width)


def warm_kernels(decoder: Decoder) -> None:
    """A many-row and a one-row forward of arbitrary ids, then an empty KV again: a decoder whose runtime
    prepares its kernels on their first runs (`Capabilities.first_run_costs`) has paid for them afterwards."""
    rows = max(2, min(WARM_ROWS, decoder.n_ctx // 4))
    phases = decoder.capabilities().phases
    # a phase split's prompt half runs forwards of more than its threshold only
    long = 0 if phases is None else min(phases.threshold + 1, decoder.n_ctx // 2)
    ids = [(7 + 7919 * i) % decoder.vocab_size for i in range(max(rows, long))]
    try:
        if long > rows:
            decoder.forward(ids[:long], last_only=True)
            decoder.reset()
        decoder.forward(ids[:rows], last_only=True)
        decoder.forward(ids[:1], last_only=True)
    finally:
        decoder.reset()


def rollback_limit(decoder: Decoder) -> int | None:
    """Tokens `decoder.rollback` can always undo; None: no limit."""
    return decoder.capabilities().max_rollback


def rollback_reach(decoder: Decoder) -> int | None:
    """Tokens `decoder.rollback` can undo right now (a declared `Truncation` may reach further than the
    guarantee); None: no limit."""
    caps = decoder.capabilities()
    if caps.truncation is None or caps.max_rollback is None:
        return caps.max_rollback
    return max(caps.max_rollback, caps.truncation.rollback_reach())
