"""Continuous batching on edge's own graphs: many sequences, one copy of the weights, one graph run a step.

`BatchEngine` owns a `GraphDecoder` (the weights and the compiled graph) and hands out `SlotDecoder`s. A slot
is a whole `Decoder` with its own ring KV cache (sinks, rollback, overflow policy): it cuts its forwards into
pieces exactly as the graph decoder does (RingDecoder.forward), builds each piece's inputs against its own
cache, and hands them to the engine. The engine's thread packs the pieces waiting from all slots into one run:

    tokens     concatenated (hidden, positions): RoPE takes each token's own position
    past K/V   each slot's bound ring prefix, in a region of the engine's packed past (devices/past_arena.py:
               kept between steps, refreshed where a ring wrote; none for one slot)
    masks      block-diagonal: a slot's rows see its own past and its own new tokens, never another slot's
    staged     each slot's staging window concatenated, stage_index shifted, one padding row at the end

and splits the logits rows and the new K/V back per slot, which each slot commits to its own cache. Decode is
bound by reading the weights, so a run carrying one new token of each of 4 sequences costs about one carrying 1.

Packed so, every row still computes scores over every slot's columns (masked), so a step's attention grows with
the slots' summed depth. A graph built with attention per slot (`slot_axis`: what a model loaded for slots,
`--parallel N`, gets) gathers each slot's rows into a batch entry of its own and attends over that slot's
arena region only (`pack_slots`): the linears still run on the packed rows; each entry attends over the
arena's room (the deepest region's, masked past its own prefix), so a step costs entries x rows x room, not
rows x the summed depths. Entries are padded to the most rows a slot carries, so a piece of more than
SLOT_ROWS tokens (a prompt's) runs alone, after the step's decode rows.

Over a phase split (devices/phase_split.py) the engine holds both halves: a slot's forward of more than the
split's threshold (a prompt) is built for the prefill half's graph and runs there alone, in the same step as
the other slots' decode rows packed on the decode half's graph (run first, and answered before the prompt
chunk runs: their tokens stream meanwhile). Prompts are compute-bound and do not gain from packing; they gain
from the faster prompt graph, which also shortens the steps the decode rows wait through.

Who joins a step: every slot whose piece is waiting. After a step the engine waits up to `linger` for the
slots that were in it (each samples its next token meanwhile), so steady decoding stays in one batch instead
of splitting into alternating halves; a slot that does not come back (its generation ended) stops being
waited for. At most one prompt chunk (a piece of more than WINDOW tokens) rides in a step, with every decode
row. While other pieces wait, none rides in the step right after a chunk's, nor, for two steps more, while
an urgent piece waits (a new request's short prompt, or the rest of a forward cut at a staging window's end,
such as a drafted verify): a piece that came in during a chunk's step waits that step out and no other chunk,
so a long prompt delays the others' next tokens by about one chunk's time, and still runs at least every
fourth step (every other one while the others only decode). A slot cuts its prompt's pieces as it goes: the
decoder's chunk (256 tokens) while no other slot streams, else what runs in about 0.2 s at the prompt rate the
engine measured (devices/step_loop.py, `chunk_for`): a stream's next token waits that long, not a 256-token
chunk's time (the 0.5b on 2 cores: 434 ms), for about the same prompt rate on ORT (64-token chunks 584 tok/s
against 590).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from edge.devices.base import Capabilities, Decoder, PhaseSplit
from edge.devices.past_arena import Packed, PastArena
from edge.devices.ring_decoder import RingDecoder, RingGeometry
from edge.devices.runners import Runner
from edge.devices.step_loop import LINGER_S, StepLoop
from edge.errors import DeviceError
from edge.kvcache import RollbackError, StepView
from edge.kvcache.ring import NEG_INF
from edge.kvcache.staging import WINDOW
from edge.models.arch import ArchConfig

__all__ = ["BatchEngine", "SlotDecoder", "pack", "pack_slots"]

COPY_TRIES = 3  # prefix copies a sibling's moving KV voided before this slot prefills the prompt itself
# Attention per slot: the most tokens a piece carries packed beside other slots' (a drafted verify: at most
# max_rollback + 1 = 17); a longer one (a prompt's piece) runs alone: a 3,000-token prompt's last 24 tokens
# packed beside 3 decode rows made each of them 24 rows over that slot's room (that step 385 ms)
SLOT_ROWS = 17


class Shared(Protocol):
    """What the engine needs of the decoder whose graph it runs (GraphDecoder is one)."""

    cfg: ArchConfig
    backend: str
    device: str
    staged: bool
    slot_axis: bool  # its attention per slot (models/transformer.BuildOptions.slot_axis)
    first_run_costs: bool
    runner: Runner | None

    @property
    def options(self) -> RingGeometry: ...

    def step_feeds(
        self,
        ring: RingDecoder,
        view: StepView,
        ids: Sequence[int],
        last_only: bool,
        *,
        window: bool,
        score: bool,
    ) -> dict[str, np.ndarray]: ...

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...

    def capabilities(self) -> Capabilities: ...

    def close(self) -> None: ...


@dataclass
class _Piece:
    """One slot's share of a step: its graph inputs, and where its answer goes."""

    slot: SlotDecoder
    feeds: dict[str, np.ndarray]
    long: bool = False  # built for the prefill half's graph (a phase split's prompt), run there alone
    urgent: bool = False  # a short prompt's piece, or not the first piece of its forward (select)
    done: threading.Event = field(default_factory=threading.Event)
    out: list[np.ndarray] | None = None
    batch: int = 0  # the pieces of the step it rode in
    error: BaseException | None = None

    @property
    def n(self) -> int:
        return int(self.feeds["positions"].shape[0])

    @property
    def chunk(self) -> bool:
        """A prompt chunk (at most one rides in a step)."""
        return self.long or self.n > WINDOW


class BatchEngine(StepLoop):
    """The shared graph decoder, and the steps run packed on it (see the module docstring)."""

    def __init__(
        self,
        base: Shared,
        *,
        linger: float = LINGER_S,
        prefill: Shared | None = None,
        phases: PhaseSplit | None = None,
        backend: str | None = None,
    ) -> None:
        if (prefill is None) != (phases is None):
            raise ValueError("a prefill half comes with the split's PhaseSplit")
        self.base = base
        # a phase split's prompt half and what the split declares (threshold, labels); None: one graph
        self.prefill, self.phases = prefill, phases
        # what the slots name as their backend (a split's label, e.g. "openvino:bf16+ort"); None: base's
        self.backend = backend or base.backend
        # the decode half's packed past (the prefill half runs one piece alone)
        self._arena = PastArena(per_slot=base.slot_axis)
        super().__init__(linger=linger)

    def slots(self, n: int) -> list[SlotDecoder]:
        if n < 1:
            raise ValueError(f"a batch needs at least one slot, got {n}")
        slots: list[SlotDecoder] = []
        try:
            for _ in range(n):
                index = self._open_slot()
                try:
                    slots.append(SlotDecoder(self, index))
                except BaseException:
                    self.release()  # the one that failed
                    raise
        except BaseException:  # and those made: the last release stops the engine
            for s in slots:
                s.close()
            raise
        return slots

    def release(self) -> None:
        """A slot closed; the last one stops the engine and closes the shared decoder."""
        if self._release_slot():
            try:
                self.base.close()
            finally:
                if self.prefill is not None:
                    self.prefill.close()

    # -- the engine thread -----------------------------------------------------------------------------
    def _step(self, batch: list[_Piece]) -> None:
        """One step: the decode half's pieces packed into one run, then each piece that runs alone: a prompt
        piece on a split's prefill half, and on a graph with attention per slot any piece of more than
        SLOT_ROWS tokens beside others. `steps`, `pieces` and `mean_batch` count the runs on the decode half
        (a piece alone is one); `prefill_runs` the others; `mixed_steps` the steps that took a many-token
        piece beside one-token ones (packed with them, or run apart after them)."""
        short = [p for p in batch if not p.long]
        alone = [p for p in batch if p.long]
        if self.base.slot_axis and len(short) > 1:
            # NOTE: attention per slot pads every slot to the most rows one carries: a prompt piece's would
            # cost each decode row that many rows' attention over its room, so it runs alone, after them
            alone += [p for p in short if p.n > SLOT_ROWS]
            short = [p for p in short if p.n <= SLOT_ROWS]
        self.mixed_steps += len({p.n > 1 for p in batch}) == 2
        if short and self._run(short, self.base):
            self.steps += 1
            self.pieces += len(short)
            self.tokens += sum(p.n for p in short)
        for p in short:  # their tokens stream, and their next pieces are made, while the prompt chunk runs
            p.done.set()
        for p in alone:
            # a long piece exists only for an engine with a prefill half
            graph = self.prefill if p.long and self.prefill is not None else self.base
            if self._run([p], graph):
                self.prefill_runs += p.long
                self.steps += not p.long
                self.pieces += not p.long
                self.tokens += p.n
            p.done.set()

    def _run(self, pieces: list[_Piece], graph: Shared) -> bool:
        """Run `pieces` packed on `graph`; each gets its outputs, or the error (every piece of the run)."""
        try:
            past = None
            if len(pieces) > 1:  # in one order step after step, so the arena keeps its layout
                pieces.sort(key=lambda p: p.slot.index)
                caches = [p.slot.cache for p in pieces]
                past = self._arena.past(caches, [p.feeds for p in pieces], pieces[0].slot.mask_layer)
            parts = [p.feeds for p in pieces]
            if past is not None and graph.slot_axis:
                feeds, splits = pack_slots(parts, graph.cfg.n_layer, staged=graph.staged, past=past)
            else:
                feeds, splits = pack(parts, graph.cfg.n_layer, staged=graph.staged, past=past)
            parts = unpack(graph.run(feeds), splits)
        except BaseException as exc:  # every slot of the run gets it; the engine goes on
            for p in pieces:
                p.error = exc
            return False
        for p, o in zip(pieces, parts, strict=True):
            p.out, p.batch = o, len(pieces)
        return True


@dataclass(frozen=True)
class _Split:
    rows: tuple[int, int]  # this piece's logits rows
    tokens: tuple[int, int]  # its new tokens


def _rows(parts: Sequence[dict[str, np.ndarray]]) -> tuple[dict[str, np.ndarray], list[_Split]]:
    """The parts' tokens back to back (hidden, positions, logit_rows), and where each part's lie."""
    splits, r0, t0 = [], 0, 0
    for f in parts:
        r, t = int(f["logit_rows"].shape[0]), int(f["positions"].shape[0])
        splits.append(_Split((r0, r0 + r), (t0, t0 + t)))
        r0, t0 = r0 + r, t0 + t
    feeds: dict[str, np.ndarray] = {
        "hidden": np.concatenate([f["hidden"] for f in parts], axis=1),
        "positions": np.concatenate([f["positions"] for f in parts]),
        "logit_rows": np.concatenate(
            [f["logit_rows"] + s.tokens[0] for f, s in zip(parts, splits, strict=True)]
        ),
    }
    return feeds, splits


def pack(
    parts: Sequence[dict[str, np.ndarray]], n_layer: int, *, staged: bool, past: Packed | None = None
) -> tuple[dict[str, np.ndarray], list[_Split]]:
    """One graph's inputs carrying every part's step (each built for its own cache by
    GraphDecoder.step_feeds), and where each part's rows lie in the outputs. `past`: the parts' pasts packed
    already (devices/past_arena.py), else they are concatenated here."""
    if len(parts) == 1:
        return dict(parts[0]), _rows(parts)[1]
    feeds, splits = _rows(parts)
    rows = [s.tokens[1] - s.tokens[0] for s in splits]
    # the new columns: a staged graph's staging window, else the step's own tokens
    news = [int(f["stage_key_0"].shape[1]) for f in parts] if staged else rows
    for name in (k for k in parts[0] if k.startswith("mask_")):
        cols = None if past is None else past.columns[name]
        feeds[name] = _block_mask([f[name] for f in parts], rows, news, pad=staged, cols=cols)
    if past is not None:
        feeds.update(past.feeds)
    for i in range(n_layer):
        for kv in ("key", "value"):
            if past is None:
                feeds[f"past_{kv}_{i}"] = np.concatenate([f[f"past_{kv}_{i}"] for f in parts], axis=1)
            if staged:
                feeds[f"stage_{kv}_{i}"] = np.concatenate([f[f"stage_{kv}_{i}"] for f in parts], axis=1)
    if staged:
        index, w0 = [], 0
        for f in parts:
            idx = f["stage_index"].copy()
            idx[..., 1] += w0
            index.append(idx)
            w0 += int(f["stage_key_0"].shape[1])
        feeds["stage_index"] = np.concatenate(index, axis=1)
    return feeds, splits


def pack_slots(
    parts: Sequence[dict[str, np.ndarray]], n_layer: int, *, staged: bool, past: Packed
) -> tuple[dict[str, np.ndarray], list[_Split]]:
    """`pack` for a graph with attention per slot (models/transformer.BuildOptions.slot_axis): the tokens back
    to back as there, each part's rows gathered into its arena region's batch entry (`slot_rows`, its last row
    repeated up to the most rows a part has, staged one more: the padding row), the contexts read back in
    packed order (`row_back`); masks, staging windows and stage_index one per region. A region of a slot not
    in the step gets row 0, seeing one past column: its rows are not read back."""
    feeds, splits = _rows(parts)
    n_regions = int(past.feeds["past_key_0"].shape[0])
    counts = [s.tokens[1] - s.tokens[0] for s in splits]
    m = max(counts) + staged
    slot_rows = np.zeros((n_regions, m), np.int64)
    row_back = np.empty((1, sum(counts)), np.int64)
    for s, b, q in zip(splits, past.regions, counts, strict=True):
        t0 = s.tokens[0]
        slot_rows[b] = t0 + np.minimum(np.arange(m), q - 1)
        row_back[0, t0 : t0 + q] = b * m + np.arange(q)
    feeds.update(past.feeds, slot_rows=slot_rows, row_back=row_back)
    news = [int(f["stage_key_0"].shape[1]) for f in parts] if staged else counts
    width = max(news) if staged else m  # staged: the widest window; else each slot's m gathered rows
    for name in (k for k in parts[0] if k.startswith("mask_")):
        room = past.columns[name][1] // n_regions
        masks = [f[name] for f in parts]
        feeds[name] = _slot_masks(masks, past.regions, n_regions, counts, news, room, m, width)
    if staged:
        _slot_windows(feeds, parts, past.regions, n_regions, counts, m, width, n_layer)
    return feeds, splits


def _slot_masks(
    masks: Sequence[np.ndarray],
    regions: Sequence[int],
    n_regions: int,
    counts: Sequence[int],
    news: Sequence[int],
    room: int,
    m: int,
    width: int,
) -> np.ndarray:
    """[regions, 1, m, room + width]: each part's rows in its region's entry, its past columns first, its new
    ones (window or own tokens) from `room`; a repeated row sees what the row it repeats sees."""
    big = np.full((n_regions, 1, m, room + width), NEG_INF, np.float32)
    big[:, 0, :, 0] = 0.0  # a region not in the step: one finite column (its rows are not read)
    for mk, b, q, n in zip(masks, regions, counts, news, strict=True):
        past = mk.shape[-1] - n
        big[b, 0, :, 0] = NEG_INF
        big[b, 0, :q, :past] = mk[0, 0, :q, :past]
        big[b, 0, :q, room : room + n] = mk[0, 0, :q, past:]
        big[b, 0, q:] = big[b, 0, q - 1]
    return big


def _slot_windows(
    feeds: dict[str, np.ndarray],
    parts: Sequence[dict[str, np.ndarray]],
    regions: Sequence[int],
    n_regions: int,
    counts: Sequence[int],
    m: int,
    width: int,
    n_layer: int,
) -> None:
    """The staged inputs per region: each part's window at its entry (zeros past it), and stage_index
    (entry, window column) for its rows, a repeated row writing where the row it repeats writes."""
    index = np.zeros((n_regions, m, 2), np.int64)
    index[..., 0] = np.arange(n_regions)[:, None]
    for f, b, q in zip(parts, regions, counts, strict=True):
        cols = f["stage_index"][0, :q, 1]
        index[b, :, 1] = cols[np.minimum(np.arange(m), q - 1)]
    feeds["stage_index"] = index
    for i in range(n_layer):
        for kv in ("key", "value"):
            first = parts[0][f"stage_{kv}_{i}"]
            windows = np.zeros((n_regions, width, *first.shape[2:]), first.dtype)
            for f, b in zip(parts, regions, strict=True):
                w = f[f"stage_{kv}_{i}"]
                windows[b, : w.shape[1]] = w[0]
            feeds[f"stage_{kv}_{i}"] = windows


def _block_mask(
    masks: Sequence[np.ndarray],
    rows: Sequence[int],
    news: Sequence[int],
    *,
    pad: bool,
    cols: tuple[tuple[int, ...], int] | None = None,
) -> np.ndarray:
    """Each part's mask [1, 1, rows (+1 padding row), past + new] placed on the diagonal of (all rows) x
    (all pasts ++ all new columns): a row sees its own sequence only. `pad` (staged): the parts' padding rows
    are dropped and the whole gets one, all visible (any finite row: the graph drops it). `cols`: where each
    part's past starts among the past columns, and their width (an arena's regions); else back to back."""
    pasts = [m.shape[-1] - n for m, n in zip(masks, news, strict=True)]
    starts, width = cols if cols is not None else (tuple(np.cumsum((0, *pasts[:-1]))), sum(pasts))
    big = np.full((1, 1, sum(rows) + pad, width + sum(news)), NEG_INF, np.float32)
    r, w = 0, 0
    for m, q, b, n, p in zip(masks, rows, pasts, news, starts, strict=True):
        big[0, 0, r : r + q, p : p + b] = m[0, 0, :q, :b]
        big[0, 0, r : r + q, width + w : width + w + n] = m[0, 0, :q, b:]
        r, w = r + q, w + n
    if pad:
        big[0, 0, -1] = 0.0
    return big


def unpack(out: Sequence[np.ndarray], splits: Sequence[_Split]) -> list[list[np.ndarray]]:
    """Per part: [logits [1, r, vocab], then new_key_i, new_value_i per layer, each [1, n, kvh, hd]]."""
    if len(splits) == 1:
        return [list(out)]
    logits, kv = out[0], out[1:]
    return [
        [logits[:, s.rows[0] : s.rows[1]]] + [x[:, s.tokens[0] : s.tokens[1]] for x in kv] for s in splits
    ]


class SlotDecoder(RingDecoder):
    """One sequence of a batch: a Decoder with its own ring KV cache whose graph runs the engine packs."""

    def __init__(self, engine: BatchEngine, index: int) -> None:
        base, prefill = engine.base, engine.prefill
        self._engine, self._closed = engine, False
        self.index = index  # the engine packs its slots in this order
        self.ridden = (0, 0)  # (steps this slot rode in, pieces those steps carried in all)
        self.backend, self.device = base.backend, base.device
        self.staged, self.first_run_costs = base.staged, base.first_run_costs
        if prefill is not None:  # as PhaseSplitDecoder names and warms itself
            self.backend = engine.backend
            self.device = "+".join(dict.fromkeys((prefill.device, base.device)))
            self.first_run_costs = base.first_run_costs or prefill.first_run_costs
        self._long = False  # the forward being run is a prompt for the prefill half
        self._pieces = 0  # of the forward being run, handed to the engine so far
        self.rows_invariant = base.capabilities().batch_invariant  # BatchSlot (decode rows run on base)
        self._init_ring_of(base.cfg, base.options)

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        # NOTE: the whole forward's length picks the half (as PhaseSplitDecoder): a prompt's last chunk stays
        phases = self._engine.phases
        self._long = phases is not None and len(tokens) > phases.threshold
        self._pieces = 0
        return super().forward(tokens, last_only=last_only)

    @property
    def engine(self) -> BatchEngine:
        return self._engine

    def _piece_tokens(self, left: int) -> int:
        return self._engine.chunk_tokens(self, self.chunk, left)

    @property
    def mask_layer(self) -> dict[int, int]:
        """The graph's mask kinds, each with a layer of it (for the engine's packed past)."""
        return self._mask_layer

    def _step(
        self, ids: Sequence[int], last_only: bool, *, window: bool = False, score: bool = True
    ) -> np.ndarray:
        if self._closed:
            raise DeviceError("this batch slot is closed", hint="load the model again")
        view = self.cache.begin(len(ids))
        if view.dropped:
            raise self._overflowed()
        engine = self._engine
        graph = engine.prefill if self._long and engine.prefill is not None else engine.base
        feeds = graph.step_feeds(self, view, ids, last_only, window=window, score=score)
        # urgent: a request's first token waits on its prompt's pieces; a cut forward's rest, on its first one
        urgent = self._pieces > 0 or (last_only and len(ids) > 1)
        piece = _Piece(self, feeds, long=graph is not engine.base, urgent=urgent)
        self._pieces += 1
        try:
            out = self._engine.run(piece)
        except DeviceError as exc:  # the packed run failed: said from this slot's KV, not the shared graph's
            raise DeviceError(
                f"{self.backend} failed on {self.device} at position {self.cache.position} (a batch step): "
                f"{exc.message}",
                hint="load the model again",
            ) from exc
        self.ridden = (self.ridden[0] + 1, self.ridden[1] + piece.batch)
        self.cache.commit(out[1::2], out[2::2])
        return out[0][0]

    def capabilities(self) -> Capabilities:
        # NOTE: not batch-invariant: the rows a step carries depend on what the other slots do
        return Capabilities(
            max_rollback=self.max_rollback,
            sinks=self,
            staged=self.staged,
            first_run_costs=self.first_run_costs,
            truncation=self,
            prefix_copy=self,
            batch_slot=self,
            phases=self._engine.phases,
        )

    def copy_prefix_from(
        self, other: Decoder, count: Callable[[], int], adopt: Callable[[int], None] | None = None
    ) -> int:
        """`PrefixCopy`: a sibling slot's first tokens, copied (same graph, same KV geometry). Only this slot's
        lock is held: a generating sibling is not waited for (its forward may be riding in a long prompt
        chunk's step: a new request's first token waited that step out, then its own). While it runs, the
        sibling appends beyond what it holds (and rolls back what it drafted); the copy is kept only if nothing
        changed the sibling's copied positions meanwhile (RingKVCache.moved_below: no rollback, truncation,
        reset or wrap reaching them, none under way when the copy began) and the sibling still has that cache;
        else this KV is emptied (its session then prefills the prompt) and the copy tried again."""
        if not isinstance(other, SlotDecoder) or other is self or other._engine is not self._engine:
            return 0
        # a drafting sibling's rollback may be under way: a later try gets past it
        for _ in range(COPY_TRIES):
            with self._lock:
                n = self._copy_from(other, count, adopt)
            if n is not None:
                return n
        return 0

    def _copy_from(
        self, other: SlotDecoder, count: Callable[[], int], adopt: Callable[[int], None] | None
    ) -> int | None:
        """One try of copy_prefix_from: the ids copied (0: nothing to copy), None where the sibling's KV
        moved under it (this KV is then empty, which its session sees)."""
        src = other.cache
        epoch = src.epoch  # first: what is read after it is checked against it (a seqlock)
        position = src.position  # before count(): ids the session says it holds lie below it
        n = min(count(), position)
        if n <= 0 or src.truncate_limit != position:
            return 0
        if src.moved_below(n, epoch):
            return None
        if self.cache.sink != src.sink:
            # NOTE: the sinks the source's conversation pinned: the request copying its prefix most likely asks
            # for the same (one system prompt)
            self.cache = self._new_cache(src.sink)
            self._set_chunk()
        cache = self.cache
        # NOTE: in place (a new cache a copy would grow the heap: the soak's RSS), inside the seqlock's bracket
        # until `adopt` has the session hold the copied ids: another slot copying from this one meanwhile reads
        # the cache and the session's ids as one, or retries
        with cache.changing(0):
            try:
                cache.copy_prefix(src, n)
            except RollbackError:  # it wrapped or fell back since the checks (nothing changed here)
                return 0
            if src.moved_below(n, epoch) or other.cache is not src:  # moved, or replaced (set_sink, a copy)
                cache.reset()  # emptied: its session sees the KV differ from what it held, and prefills
                return None
            if adopt is not None:
                adopt(n)
        return n

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._engine.release()


def batched(base: Shared, n: int) -> list[Decoder]:
    """n slots sharing `base` (what GraphDecoder's `Batching` capability hands out)."""
    return list(BatchEngine(base).slots(n))
