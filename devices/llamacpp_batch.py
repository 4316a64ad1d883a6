"""llama.cpp slots: many sequences in one native batch, on one copy of the weights (continuous batching).

`LlamaCppDecoder.capabilities().batching` hands out `slots(n)`: the model's llama.cpp context is replaced by
one for n sequences (n_seq_max = n, one unified KV of n x the slot's context, as `llama-server -np N` with
`-c N x ctx`), and each slot is a whole `Decoder` on one sequence id of it. Each step the loop
(devices/step_loop.py: one prompt chunk a step, beside every decode row; beside streaming slots a chunk of
about 0.2 s at the measured prompt rate, `chunk_for`, not CHUNK) puts the waiting pieces of all slots
into one `llama_batch` (each token with its slot's sequence id and position), decodes it once and hands each
slot its logits rows. A slot's rollback and reset remove its cells (`llama_memory_seq_rm`); a prefix copy
shares the sibling's cells (`llama_memory_seq_cp`: no compute, no bytes moved). llama.cpp's context serves
one call at a time: the decode (on the loop's thread) and the slots' sequence edits take one lock.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from edge.devices.base import Capabilities, Decoder, KVFill
from edge.devices.step_loop import StepLoop
from edge.errors import ContextOverflowError, DeviceError
from edge.kvcache import RollbackError
from edge.kvcache.staging import WINDOW

__all__ = ["CHUNK", "LlamaCppBatch", "LlamaCppSlot", "Native", "batches", "checked_ids", "remove_cells"]

CHUNK = 256  # the most prompt tokens a slot's piece carries (one chunk rides in a step; fewer beside streams)
CUTS_KEPT = 64  # a slot's recent KV cuts (rollbacks, resets, copies into it) a prefix copy checks against


@dataclass(frozen=True)
class Native:
    """What the slots take over from a LlamaCppDecoder: its loaded model and how it ran."""

    lib: ModuleType  # llama_cpp
    llama: Any  # the llama_cpp.Llama whose model the slots share (its own context is freed)
    n_ctx: int  # each slot's context
    n_batch: int
    vocab_size: int
    device: str
    kv_dtype: str  # its K/V cache's type (f32 | f16), each sequence's in the batch context too
    close: Callable[[], None]  # frees the model, once the last slot closed


@dataclass
class _Piece:
    """One slot's tokens in a step, and where its answer goes."""

    slot: LlamaCppSlot
    tokens: list[int]
    start: int  # the first token's position
    rows: str  # logits wanted: "all", "last" or "none" (the first pieces of a prompt)
    urgent: bool = False  # a short prompt's piece, or not the first piece of its forward (select)
    done: threading.Event = field(default_factory=threading.Event)
    out: np.ndarray | None = None
    batch: int = 0  # the pieces of the step it rode in
    error: BaseException | None = None

    @property
    def n(self) -> int:
        return len(self.tokens)

    @property
    def chunk(self) -> bool:
        return len(self.tokens) > WINDOW


def checked_ids(tokens: Sequence[int], position: int, n_ctx: int, vocab_size: int) -> list[int]:
    """A forward's ids as ints, refused before llama.cpp sees them: none, past the context, out of range."""
    toks = [int(t) for t in tokens]
    if not toks:
        raise ValueError("forward needs at least one token")
    if position + len(toks) > n_ctx:
        raise ContextOverflowError(
            f"{position} + {len(toks)} tokens exceed the context of {n_ctx}",
            hint="raise --ctx-size or shorten the prompt",
        )
    bad = [t for t in toks if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token ids out of range 0..{vocab_size - 1}: {bad[:5]}")
    return toks


def batches(lib: ModuleType, model: Any) -> bool:
    """Whether llama.cpp's slots can run this model: a transformer's KV, whose cells a slot removes and
    shares by position (a recurrent or hybrid model's state cannot be cut at a position)."""
    return not (lib.llama_model_is_recurrent(model) or lib.llama_model_is_hybrid(model))


def remove_cells(lib: ModuleType, memory: Any, seq: int, start: int) -> None:
    """Drop sequence `seq`'s cells from position `start` on (-1: all of them).

    NOTE: llama.cpp's seq_rm returns False, having changed nothing, where it cannot make the cut (a recurrent or
    hybrid model's state holds no positions to cut at): ignored, the state would silently run on uncut."""
    if not lib.llama_memory_seq_rm(memory, seq, start, -1):
        raise RollbackError(
            f"llama.cpp could not remove sequence {seq}'s cells from position {start} on (a recurrent or "
            "hybrid model's state cannot be cut at a position): reset() and prefill again"
        )


class LlamaCppBatch(StepLoop):
    """The n-sequence llama.cpp context, and the steps decoded on it (see the module docstring)."""

    def __init__(self, native: Native, n: int) -> None:
        if n < 1:
            raise ValueError(f"a batch needs at least one slot, got {n}")
        lib, llama = native.lib, native.llama
        self.native, self.n = native, n
        params = type(llama.context_params).from_buffer_copy(llama.context_params)
        params.n_ctx = native.n_ctx * n
        params.n_seq_max = n
        params.kv_unified = (
            True  # one pool of cells: a sequence takes what it uses, a copied prefix is shared
        )
        params.n_batch = params.n_ubatch = max(native.n_batch, CHUNK + n * (WINDOW + 1))
        self.n_batch = int(params.n_batch)
        from llama_cpp import _internals

        llama._ctx.close()  # the one-sequence context's KV is not used again
        try:
            self._ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        except ValueError as exc:
            raise DeviceError(
                f"llama.cpp could not make a context of {n} sequences x {native.n_ctx} tokens: {exc}",
                hint="lower --parallel or --ctx-size",
            ) from None
        self._batch = _internals.LlamaBatch(n_tokens=params.n_batch, embd=0, n_seq_max=1, verbose=False)
        self._memory = lib.llama_get_memory(self._ctx.ctx)
        self.native_lock = threading.Lock()  # the context: decode and sequence edits, one at a time
        super().__init__(name="edge-llamacpp-batch")

    def slots(self) -> list[LlamaCppSlot]:
        """The n slots, sequence ids 0..n-1."""
        return [LlamaCppSlot(self, seq, self._open_slot()) for seq in range(self.n)]

    def release(self) -> None:
        """A slot closed; the last one stops the loop and frees the context and the model."""
        if self._release_slot():
            with self.native_lock:
                self._batch.close()
                self._ctx.close()
            self.native.close()

    def remove(self, seq: int, start: int) -> None:
        """Drop a sequence's cells from `start` on (-1: all). Caller holds native_lock."""
        remove_cells(self.native.lib, self._memory, seq, start)

    def share(self, src: int, dst: int, n: int) -> bool:
        """dst's cells emptied, then src's first n shared with it; False (dst empty) where dst does not hold
        exactly positions 0..n-1 afterwards. Caller holds native_lock."""
        lib, mem = self.native.lib, self._memory
        self.remove(dst, -1)
        lib.llama_memory_seq_cp(mem, src, dst, 0, n)
        if lib.llama_memory_seq_pos_min(mem, dst) == 0 and lib.llama_memory_seq_pos_max(mem, dst) == n - 1:
            return True
        self.remove(dst, -1)
        return False

    # -- the loop's thread -----------------------------------------------------------------------------
    def _step(self, batch: list[Any]) -> None:
        for p in batch:  # closed by another thread meanwhile: it fails alone
            if p.slot.closed:
                p.error = DeviceError("this batch slot was closed", hint="load the model again")
                p.done.set()
        batch = [p for p in batch if not p.slot.closed]
        if not batch:
            return
        self.mixed_steps += len({len(p.tokens) > 1 for p in batch}) == 2
        try:
            with self.native_lock:
                outs = self._decode(batch)
        except BaseException as exc:  # every slot of the step gets it; the loop goes on
            for p in batch:
                p.error = exc
        else:
            for p, o in zip(batch, outs, strict=True):
                p.out, p.batch = o, len(batch)
            self.steps += 1
            self.pieces += len(batch)
            self.tokens += sum(len(p.tokens) for p in batch)
        for p in batch:
            p.done.set()

    def _decode(self, pieces: list[_Piece]) -> list[np.ndarray]:
        lib, b = self.native.lib, self._batch.batch
        total = sum(len(p.tokens) for p in pieces)
        if total > self.n_batch:  # one chunk and one short piece a slot fit by construction: never past it
            raise DeviceError(f"a step of {total} tokens exceeds llama.cpp's batch of {self.n_batch}")
        wanted: list[list[int]] = []
        i = 0
        for p in pieces:
            seq, last = p.slot.seq, len(p.tokens) - 1
            rows = []
            for j, token in enumerate(p.tokens):
                b.token[i], b.pos[i], b.n_seq_id[i] = token, p.start + j, 1
                b.seq_id[i][0] = seq
                out = p.rows == "all" or (p.rows == "last" and j == last)
                b.logits[i] = out
                if out:
                    rows.append(i)
                i += 1
            wanted.append(rows)
        b.n_tokens = i
        rc = lib.llama_decode(self._ctx.ctx, b)
        if rc != 0:
            for p in pieces:  # a half-written step leaves no cells behind (a refusal here: the error below)
                lib.llama_memory_seq_rm(self._memory, p.slot.seq, p.start, -1)
            raise DeviceError(
                f"llama_decode returned {rc} for a batch of {i} tokens from {len(pieces)} sequences",
                hint="reset() and retry, or load the model again with a smaller --parallel",
            )
        vocab = self.native.vocab_size
        return [
            np.stack(
                [np.ctypeslib.as_array(lib.llama_get_logits_ith(self._ctx.ctx, r), (vocab,)) for r in rows]
            )
            if rows
            else np.empty((0, vocab), np.float32)
            for rows in wanted
        ]


class LlamaCppSlot:
    """One sequence of a llama.cpp batch: a whole `Decoder` whose forwards ride in the engine's steps."""

    backend = "llamacpp"

    def __init__(self, engine: LlamaCppBatch, seq: int, index: int) -> None:
        self._engine, self.seq, self.index = engine, seq, index
        self.vocab_size = engine.native.vocab_size
        self.n_ctx = engine.native.n_ctx
        self.device = engine.native.device
        self.position = 0
        self.ridden = (0, 0)  # BatchSlot: (steps this slot rode in, pieces those steps carried in all)
        self.rows_invariant = False  # llama.cpp's rows depend on the batch they ride in
        self._closed = False
        self._serial = 0  # cuts made (a prefix copy from this slot checks them, as a seqlock)
        self._cuts: deque[tuple[int, int]] = deque(maxlen=CUTS_KEPT)  # (serial, lowest position cut)

    @property
    def engine(self) -> LlamaCppBatch:
        return self._engine

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise DeviceError("this batch slot is closed", hint="load the model again")

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        self._check_open()
        toks = checked_ids(tokens, self.position, self.n_ctx, self.vocab_size)
        start, rows = self.position, []
        try:
            k = 0
            while k < len(toks):  # each piece sized when it is cut: smaller beside streaming siblings
                part = toks[k : k + self._engine.chunk_tokens(self, CHUNK, len(toks) - k)]
                final = k + len(part) >= len(toks)
                want = "all" if not last_only else "last" if final else "none"
                urgent = k > 0 or (last_only and len(toks) > 1)  # as devices/batch.py's slots
                rows.append(self._run(_Piece(self, part, self.position, want, urgent=urgent)))
                self.position += len(part)
                k += len(part)
        except BaseException:
            self._cut_to(start)  # what this forward stored goes: the KV is as before it
            raise
        return rows[0] if len(rows) == 1 else np.concatenate(rows, axis=0)

    def _run(self, piece: _Piece) -> np.ndarray:
        try:
            out = self._engine.run(piece)
        except DeviceError as exc:
            raise DeviceError(
                f"llamacpp failed on {self.device} at position {self.position} (a batch step): {exc.message}",
                hint="reset() and retry, or load the model again",
            ) from exc
        self.ridden = (self.ridden[0] + 1, self.ridden[1] + piece.batch)
        return out

    def _cut_to(self, position: int) -> None:
        with self._engine.native_lock:
            if not self._closed:
                self._engine.remove(self.seq, position)
            self._mark_cut(position)

    def _mark_cut(self, low: int) -> None:
        """Under native_lock: this sequence's KV from `low` on changed other than by appending."""
        self.position = min(self.position, low)
        self._serial += 1
        self._cuts.append((self._serial, low))

    def rollback(self, n: int) -> None:
        if not 0 <= n <= self.position:
            raise ValueError(f"cannot roll back {n} tokens with {self.position} in the cache")
        self._check_open()
        if n:
            self._cut_to(self.position - n)

    def reset(self) -> None:
        self._check_open()
        self._cut_to(0)

    def kv_fill(self) -> KVFill:
        return KVFill(
            self.position, self.n_ctx, self.position, ring=False, dtype=self._engine.native.kv_dtype
        )

    def capabilities(self) -> Capabilities:
        # a linear cache: seq_rm removes any suffix; not batch-invariant (rows depend on the other slots)
        return Capabilities(max_rollback=None, prefix_copy=self, batch_slot=self)

    def copy_prefix_from(
        self, other: Decoder, count: Callable[[], int], adopt: Callable[[int], None] | None = None
    ) -> int:
        """`PrefixCopy`: a sibling's first tokens, its cells shared. The sibling is not waited for; the copy
        is made only if no cut of the sibling's KV (rollback, reset, a copy into it) reached below the count
        since it was read. Where llama.cpp then holds other positions than 0..n-1 for this slot (a sliding-
        window cache), 0 is returned with this KV emptied: its session sees the position differ from what it
        held, and prefills."""
        if not isinstance(other, LlamaCppSlot) or other is self or other._engine is not self._engine:
            return 0
        serial = other._serial  # first: what is read after it is checked against it (a seqlock)
        position = other.position  # before count(): the ids the sibling's session holds lie below it
        n = min(count(), position)
        if n <= 0:
            return 0
        with self._engine.native_lock:
            if self._closed or other._closed or not self._untouched(other, serial, n):
                return 0
            shared = self._engine.share(other.seq, self.seq, n)
            self._mark_cut(0)
            if not shared:
                return 0
            self.position = n
            if adopt is not None:  # before another slot may copy from this one (it checks this cut)
                adopt(n)
        return n

    @staticmethod
    def _untouched(other: LlamaCppSlot, serial: int, n: int) -> bool:
        if other._serial - serial > len(other._cuts):  # more cuts than kept: assume one reached
            return False
        return all(low >= n for s, low in other._cuts if s > serial)

    def close(self) -> None:
        with self._engine.native_lock:  # checked and set at once: a second close releases nothing
            if self._closed:
                return
            self._closed = True
            self._engine.remove(self.seq, -1)
        self._engine.release()
