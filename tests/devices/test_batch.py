"""Continuous batching on the own graphs (devices/batch.py): slots of one graph decoder, run from concurrent
threads, packed into one graph run a step. Each slot must compute what the decoder alone computes for its
sequence: at --precision exact the same greedy tokens, with rows equal to fp32 rounding, through mixed steps
(one slot's prompt chunk beside the others' decode rows), ring wraps, sinks and rollbacks.

Tiny generated models: a plain llama, a qwen2 (attention biases) and a gemma3 (sliding-window layers), on ORT
and OpenVINO, staged attention on and off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from edge.devices import step_loop
from edge.devices.base import Decoder
from edge.devices.batch import BatchEngine, _Piece, pack_slots
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.past_arena import Packed
from edge.devices.phase_split import PhaseSplitDecoder
from edge.devices.step_loop import MIN_CHUNK, StepLoop, chunk_for, select
from edge.errors import ContextOverflowError, DeviceError
from edge.kvcache import RingKVCache
from edge.kvcache.staging import WINDOW
from edge.models.gguf_file import open_gguf
from tests.tiny_models import TinySpec, write_tiny_model

Q = gguf.GGMLQuantizationType

SPECS = {
    "llama-q4_1": TinySpec(arch="llama", weight_type=Q.Q4_1, seed=5),
    "qwen2-q8_0": TinySpec(arch="qwen2", weight_type=Q.Q8_0, seed=6),
    "gemma3-f16": TinySpec(arch="gemma3", n_layer=3, weight_type=Q.F16, seed=7),  # sliding windows of 8
}
ATOL = 2e-3  # fp32 rows of one sequence computed in another batch shape: summation order only

# one sequence's plan: its prompt, then (tokens to decode, tokens to roll back after them) phases
Plan = tuple[list[int], list[tuple[int, int]]]


def _prompt(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1, *rng.integers(3, 250, n - 1).tolist()]


PLANS: list[Plan] = [
    (_prompt(5, 1), [(2 * WINDOW + 5, 0)]),  # decode across two staging-window ends
    (_prompt(3 * WINDOW + 9, 2), [(9, 3), (12, 0)]),  # a prompt of several chunks, then a rollback
    (_prompt(17, 3), [(6, 5), (6, 2), (30, 0)]),  # rollbacks twice
    (_prompt(2, 4), [(40, 0)]),
]


def _options(backend: str, staged: bool, capacity: int, slot_axis: bool = False) -> GraphOptions:
    return GraphOptions(
        backend=backend,
        precision="exact",
        staged=staged,
        slot_axis=slot_axis,
        capacity=capacity,
        sink=2,
        threads=1,
        prefill_chunk=WINDOW + 8,  # prompt chunks longer than a staging window: one rides in a step
        max_rollback=8,
    )


def _run_plan(dec: Decoder, plan: Plan, start: threading.Barrier | None = None) -> tuple[list[int], list]:
    """Greedy decoding by `plan`; returns the tokens and the rows each was chosen from."""
    prompt, phases = plan
    if start is not None:
        start.wait()
    row = dec.forward(prompt, last_only=True)[-1]
    tokens, rows = [], []
    for n, back in phases:
        for _ in range(n):
            tokens.append(int(row.argmax()))
            rows.append(row)
            row = dec.forward([tokens[-1]])[-1]
        if back:
            dec.rollback(back)
            del tokens[-back:], rows[-back:]
            # the row the last kept token was chosen from is gone with it: score the last kept token again
            dec.rollback(1)
            row = dec.forward([tokens[-1]])[-1]
    return tokens, rows


def _in_threads(fns: Sequence[Callable[[], object]]) -> list:
    out: list = [None] * len(fns)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors:
        raise errors[0]
    return out


def _slots_as_alone(make: Callable[[], Decoder]) -> BatchEngine:
    """Every plan run alone on one decoder `make` opens, then all at once on the slots of another: each slot
    must compute what the decoder alone computes (tokens equal, rows to fp32 rounding). Returns the engine."""
    alone = make()
    expected = []
    for plan in PLANS:
        alone.reset()
        expected.append(_run_plan(alone, plan))
    alone.close()
    batching = make().capabilities().batching
    assert batching is not None
    slots = batching.slots(len(PLANS))
    phases = alone.capabilities().phases
    assert [s.capabilities().phases for s in slots] == [phases] * len(slots)
    start = threading.Barrier(len(PLANS))
    got = _in_threads([lambda s=s, p=p: _run_plan(s, p, start) for s, p in zip(slots, PLANS, strict=True)])
    for s in slots:
        s.close()
    for i, ((tokens, rows), (want, want_rows)) in enumerate(zip(got, expected, strict=True)):
        assert tokens == want, f"sequence {i} parted from its run alone"
        np.testing.assert_allclose(np.stack(rows), np.stack(want_rows), atol=ATOL)
    return slots[0].engine  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("batch")
    return {name: write_tiny_model(tmp / f"{name}.gguf", spec) for name, spec in SPECS.items()}


# staged attention is an ORT graph form (kvcache/staging.py); slot_axis: attention per slot
@pytest.mark.parametrize("slot_axis", [False, True], ids=["packed", "per-slot"])
@pytest.mark.parametrize(
    ("backend", "staged"),
    [("ort", False), ("ort", True), ("openvino", False)],
    ids=["ort", "ort-staged", "ov"],
)
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("capacity", [256, 48], ids=["long", "wraps"])
def test_each_slot_decodes_as_the_decoder_alone(
    files: dict[str, Path], name: str, backend: str, staged: bool, capacity: int, slot_axis: bool
) -> None:
    gg = open_gguf(files[name])
    engine = _slots_as_alone(lambda: GraphDecoder(gg, _options(backend, staged, capacity, slot_axis)))
    # the steps really were shared: fewer runs than pieces, and some took a prompt chunk beside decode rows
    # (per slot: run apart, after them)
    assert engine.mean_batch > 1.5, engine.mean_batch
    assert engine.mixed_steps > 0


@pytest.mark.parametrize("slot_axis", [False, True], ids=["packed", "per-slot"])
@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("capacity", [256, 48], ids=["long", "wraps"])
def test_slots_of_a_phase_split_decode_as_the_split_alone(
    files: dict[str, Path], name: str, capacity: int, slot_axis: bool
) -> None:
    """Over a phase split (devices/phase_split.py) a slot's prompt runs on the prefill half's graph alone, its
    decode steps packed with the others' on the decode half's (attention per slot there, or packed): each
    sequence as the split alone computes it."""
    gg = open_gguf(files[name])

    def split() -> PhaseSplitDecoder:
        halves = [
            GraphDecoder(gg, _options(b, b == "ort", capacity, slot_axis and b == "ort"))
            for b in ("openvino", "ort")
        ]
        return PhaseSplitDecoder(*halves)

    engine = _slots_as_alone(split)
    # every chunk of the long prompt (its last, short one too) ran on the prefill half, nothing else did; the
    # decode rows were packed
    probe = split()
    chunks = -(-len(PLANS[1][0]) // probe.chunk)  # 105 tokens in 40-token chunks (gemma3: its window's)
    probe.close()
    assert engine.prefill_runs == chunks and engine.mean_batch > 1.5 and engine.mixed_steps > 0
    assert not engine.alive and engine.base.runner is None and engine.prefill.runner is None


def test_a_split_given_to_slots_leaves_its_halves_to_them(files: dict[str, Path]) -> None:
    gg = open_gguf(files["llama-q4_1"])
    halves = [GraphDecoder(gg, _options(b, False, 64)) for b in ("openvino", "ort")]
    split = PhaseSplitDecoder(*halves)
    slots = split.slots(2)
    split.close()  # the model that handed its decoder over closes: the slots go on
    assert np.isfinite(slots[0].forward(_prompt(40, 3), last_only=True)).all()
    with pytest.raises(DeviceError, match="split into slots"):
        split.forward([1, 2])
    for s in slots:
        s.close()
    assert halves[0].runner is None and halves[1].runner is None


def test_a_slot_failing_fails_alone(files: dict[str, Path]) -> None:
    """A slot whose prompt overflows its KV (policy error) raises; the others finish as alone."""
    gg = open_gguf(files["llama-q4_1"])
    opts = GraphOptions(backend="ort", precision="exact", capacity=96, sink=2, threads=1, policy="error")
    alone = GraphDecoder(gg, opts)
    want = _run_plan(alone, PLANS[0])
    alone.close()
    base = GraphDecoder(gg, opts)
    slots = base.capabilities().batching.slots(2)  # type: ignore[union-attr]

    def overflow() -> object:
        with pytest.raises(ContextOverflowError):
            slots[1].forward(_prompt(120, 9))
        return "raised"

    got = _in_threads([lambda: _run_plan(slots[0], PLANS[0]), overflow])
    assert got[0][0] == want[0] and got[1] == "raised"
    for s in slots:
        s.close()


def test_the_last_slot_closed_frees_the_graph(files: dict[str, Path]) -> None:
    base = GraphDecoder(open_gguf(files["llama-q4_1"]), _options("ort", False, 64))
    slots = base.capabilities().batching.slots(2)  # type: ignore[union-attr]
    engine: BatchEngine = slots[0].engine  # type: ignore[attr-defined]
    slots[0].forward([1, 5, 6])
    slots[0].close()
    slots[1].forward([1, 7])  # the other slot still runs
    slots[1].close()
    assert base.runner is None and not engine.alive


def test_a_slot_takes_a_siblings_prefix_and_goes_on_as_alone(files: dict[str, Path]) -> None:
    """`PrefixCopy`: a slot copies the first tokens a sibling holds (a shared system prompt) while the
    sibling keeps decoding; both then decode what they would alone. A wrapped sibling is refused."""
    gg = open_gguf(files["qwen2-q8_0"])
    opts = _options("ort", False, 256)
    head, tail = _prompt(40, 11), _prompt(9, 12)[1:]
    alone = GraphDecoder(gg, opts)
    want = _run_plan(alone, ([*head, *tail], [(20, 0)]))
    alone.close()
    base = GraphDecoder(gg, opts)
    a, b = base.capabilities().batching.slots(2)  # type: ignore[union-attr]
    a.forward(head)
    copy = b.capabilities().prefix_copy
    assert copy is not None
    running = threading.Thread(target=lambda: [a.forward([5]) for _ in range(30)])
    running.start()  # the sibling goes on decoding while the copy is taken
    assert copy.copy_prefix_from(a, lambda: len(head)) == len(head)
    running.join()
    assert b.position == len(head)
    row = b.forward(tail, last_only=True)[-1]
    tokens = []
    for _ in range(20):
        tokens.append(int(row.argmax()))
        row = b.forward([tokens[-1]])[-1]
    assert tokens == want[0]
    assert copy.copy_prefix_from(b, lambda: 0) == 0  # itself: refused
    a.set_sink(8)  # another geometry (and empty): a copy of nothing must not take it over
    assert copy.copy_prefix_from(a, lambda: 0) == 0  # nothing asked: nothing changed
    assert b.position == len(head) + len(tail) + 20 and b.kv_fill().sink == 2
    a.forward(head)
    for _ in range(300):
        a.forward([7])  # a wraps its 256-slot ring
    assert copy.copy_prefix_from(a, lambda: 10) == 0 and b.position == len(head) + len(tail) + 20
    a.close()
    b.close()


def test_a_prefix_copy_does_not_wait_for_a_busy_sibling_and_voids_a_moved_one(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sibling in the middle of a forward (its lock held, as while its step rides with a long prompt chunk)
    is not waited for; a sibling whose copied positions changed while they were copied (a rollback reaching
    them, a reset) voids the copy, which is tried again; a rollback of its tail does not void it."""
    gg = open_gguf(files["llama-q4_1"])
    base = GraphDecoder(gg, _options("ort", True, 256))
    a, b = base.capabilities().batching.slots(2)  # type: ignore[union-attr]
    head = _prompt(40, 13)
    a.forward(head)
    b.forward(head[:5])
    copy = b.capabilities().prefix_copy
    assert copy is not None
    with a._lock:  # type: ignore[attr-defined]  # a forward of a's under way: the copy does not block
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(copy.copy_prefix_from(a, lambda: 30)))
        t.start()
        t.join(5)
        assert done == [30] and b.position == 30
    b.forward(head[30:35])

    def moving(change: Callable[[], None]) -> None:
        """a's KV changes while its prefix is being copied (the first time only)."""
        copy_prefix, done = RingKVCache.copy_prefix, []

        def copying(self: RingKVCache, src: RingKVCache, n: int) -> None:
            copy_prefix(self, src, n)
            if not done:
                done.append(change())

        monkeypatch.setattr(RingKVCache, "copy_prefix", copying)

    a.forward([5, 6])  # at 42: a tail rollback (a rejected draft) leaves the copied positions alone
    moving(lambda: a.rollback(1))
    assert copy.copy_prefix_from(a, lambda: 38) == 38 and b.position == 38
    moving(lambda: a.rollback(25))  # to 16: the copy is voided, tried again, and takes a's 16
    assert copy.copy_prefix_from(a, lambda: 30) == 16 and b.position == 16
    a.forward(head)
    moving(a.reset)  # voided, and then a holds nothing: b is left empty, which its session would see
    assert copy.copy_prefix_from(a, lambda: 30) == 0 and b.position == 0
    a.close()
    b.close()


def test_a_copy_is_not_copied_on_before_its_ids_are_recorded(files: dict[str, Path]) -> None:
    """b copies a's prefix; until b's caller has recorded the ids b holds (`adopt`), a third slot copying from
    b is refused (it would pair b's new KV with the ids b held before), and after it, allowed."""
    base = GraphDecoder(open_gguf(files["llama-q4_1"]), _options("ort", True, 256))
    a, b, c = base.capabilities().batching.slots(3)  # type: ignore[union-attr]
    a.forward(_prompt(40, 31))
    b.forward(_prompt(12, 32))
    during: list[int] = []

    def adopt(n: int) -> None:
        during.append(c.capabilities().prefix_copy.copy_prefix_from(b, lambda: 20))  # type: ignore[union-attr]

    assert b.capabilities().prefix_copy.copy_prefix_from(a, lambda: 30, adopt) == 30  # type: ignore[union-attr]
    assert during == [0] and c.position == 0
    assert c.capabilities().prefix_copy.copy_prefix_from(b, lambda: 20) == 20  # type: ignore[union-attr]
    for s in (a, b, c):
        s.close()


def _packed(engine: BatchEngine, parts: Sequence[tuple[Decoder, list[int]]]) -> list[np.ndarray]:
    """One packed run of the engine's graph carrying each (slot, ids) part as a windowed step (what the
    engine's thread does with pieces waiting together), committed; each part's logits rows."""
    pieces = []
    for slot, ids in parts:
        view = slot.cache.begin(len(ids))  # type: ignore[attr-defined]
        feeds = engine.base.step_feeds(slot, view, ids, False, window=True, score=True)  # type: ignore[arg-type]
        pieces.append(_Piece(slot, feeds))  # type: ignore[arg-type]
    assert engine._run(pieces, engine.base), pieces[0].error
    for p in pieces:
        assert p.out is not None
        p.slot.cache.commit(p.out[1::2], p.out[2::2])
    return [p.out[0][0] for p in pieces if p.out is not None]


def test_a_slots_verify_rows_equal_its_one_token_rows_beside_the_same_slot(tmp_path: Path) -> None:
    """`BatchSlot.rows_invariant` (what lets `--draft auto` draft a slot's greedy requests): on ORT's staged
    graph at fast, a slot's 5-token verify packed beside another slot's step gives, bit for bit, the rows
    its 5 one-token steps give packed beside that same step."""
    path = write_tiny_model(tmp_path / "tiny.gguf", TinySpec(seed=0))
    opts = replace(_options("ort", True, 256), precision="fast")
    base = GraphDecoder(open_gguf(path), opts)
    assert base.capabilities().batch_invariant
    engine = BatchEngine(base)
    a, b = engine.slots(2)
    assert a.capabilities().batch_slot.rows_invariant  # type: ignore[union-attr]
    a.forward(_prompt(40, 21))
    b.forward(_prompt(23, 22))
    draft = [7, 8, 9, 10, 11]  # positions 40-44: inside one staging window
    verify = _packed(engine, [(a, draft), (b, [5])])[0]
    a.rollback(5)
    b.rollback(1)
    for i, t in enumerate(draft):
        row = _packed(engine, [(a, [t]), (b, [5])])[0]
        b.rollback(1)  # b's step is the same every time
        np.testing.assert_array_equal(row[0], verify[i])
    a.close()
    b.close()


def test_slots_that_do_not_fit_are_refused_before_any_is_made(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """n slots hold n KV caches: with too little memory free (the machine's answer injected), a clear typed
    error, and the decoder stays whole."""
    import collections

    import psutil

    from edge.errors import InsufficientMemoryError

    base = GraphDecoder(open_gguf(files["llama-q4_1"]), _options("ort", False, 256))
    kv = base.cache.nbytes
    mem = collections.namedtuple("mem", "available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: mem(2 * kv))
    with pytest.raises(InsufficientMemoryError, match="4 slots need 4 KV caches"):
        base.capabilities().batching.slots(4)  # type: ignore[union-attr]
    assert base.forward([1, 5, 6]).shape[0] == 3  # not split: it still runs on its own
    slots = base.capabilities().batching.slots(3)  # type: ignore[union-attr]  # 2 more: they fit
    for s in slots:
        s.close()


class _P:
    def __init__(self, name: str, chunk: bool = False, urgent: bool = False) -> None:
        self.name, self.chunk, self.urgent = name, chunk, urgent


def _names(pieces: Sequence[_P]) -> list[str]:
    return [p.name for p in pieces]


def test_a_prompt_chunk_leaves_the_next_steps_to_the_others() -> None:
    """One chunk a step, with every decode row. While other pieces wait: none right after a chunk's step, so a
    piece that came in during it waits that step out and no other chunk; none for two steps more while an
    urgent piece waits (a new request's short prompt, the rest of a cut forward); then one again, so the long
    prompt runs at least every fourth step, every other one beside decode rows only. With nothing else
    waiting, the chunks run back to back."""
    rows = [_P("a"), _P("b")]
    c1, c2 = _P("c1", chunk=True), _P("c2", chunk=True)
    batch, rested = select([c1, *rows, c2], 3)
    assert _names(batch) == ["c1", "a", "b"] and rested == 0
    batch, rested = select([*rows, c2], rested)
    assert _names(batch) == ["a", "b"] and rested == 1
    batch, rested = select([c2, *rows], rested)  # decode rows only: every other step
    assert _names(batch) == ["c2", "a", "b"] and rested == 0
    batch, rested = select([c2, *rows], rested)
    batch, rested = select([c2, *rows, _P("p1", urgent=True)], rested)  # a new request's prompt
    assert _names(batch) == ["a", "b", "p1"] and rested == 2
    batch, rested = select([c2, *rows, _P("p2", urgent=True)], rested)  # its second piece
    assert _names(batch) == ["a", "b", "p2"] and rested == 3
    batch, rested = select([c2, *rows, _P("v", urgent=True)], rested)  # not a fourth time
    assert _names(batch) == ["c2", "a", "b", "v"] and rested == 0
    batch, rested = select([c2], rested)  # nothing else waits: no step is spent without it
    assert _names(batch) == ["c2"] and rested == 0
    batch, rested = select([_P("c3", chunk=True), *rows], 1)  # another prompt's chunk rides as any chunk
    assert _names(batch) == ["c3", "a", "b"] and rested == 0


def test_a_prompt_beside_streaming_slots_is_cut_smaller() -> None:
    """A prompt piece takes the decoder's whole chunk while no other slot streams; beside streaming ones, what
    runs in about CHUNK_TARGET_S at the measured prompt rate (in whole staging windows, at least MIN_CHUNK;
    before any chunk was timed, MIN_CHUNK)."""
    assert chunk_for(256, False, None) == chunk_for(256, False, 1.0) == 256
    assert chunk_for(256, True, None) == MIN_CHUNK
    per_token = step_loop.CHUNK_TARGET_S / 100  # 100 tokens fit: 3 staging windows
    assert chunk_for(256, True, per_token) == 3 * WINDOW
    assert chunk_for(256, True, per_token / 100) == 256  # a fast prompt: the whole chunk
    assert chunk_for(256, True, 1.0) == MIN_CHUNK  # a slow one: no smaller than MIN_CHUNK
    assert chunk_for(40, True, None) == 40  # never more than the decoder's chunk


def test_the_prompt_rate_comes_from_chunk_steps_and_sizes_pieces_beside_streams() -> None:
    """A step that carried a chunk of at least MIN_CHUNK tokens adds to the prompt rate (its whole time per
    chunk token, older steps halved); a prompt's short last piece does not. A slot sizes its pieces from that
    rate only while another slot streams, and a forward that fits one piece never asks."""

    @dataclass
    class _Timed:
        slot: object
        chunk: bool
        n: int
        error: BaseException | None = None

    loop = StepLoop()
    loop._open_slot()  # its release stops the loop's thread
    me, other = object(), object()
    try:
        assert loop.chunk_tokens(me, 256, 1_000) == 256  # alone: the whole chunk
        loop._expected = {id(other)}  # the last step carried another slot: it streams
        assert loop.chunk_tokens(me, 256, 1_000) == MIN_CHUNK  # not measured yet
        assert loop.chunk_tokens(me, 256, MIN_CHUNK) == 256  # fits one piece: cut as one
        per_token = step_loop.CHUNK_TARGET_S / 100
        loop._timed([_Timed(other, chunk=True, n=128)], 128 * per_token)
        assert loop.chunk_tokens(me, 256, 1_000) == 3 * WINDOW  # 100 tokens fit: 3 windows
        loop._timed([_Timed(other, chunk=True, n=MIN_CHUNK - 1)], 10.0)  # a prompt's last piece: left out
        loop._timed([_Timed(other, chunk=False, n=1)], 10.0)  # no chunk in the step
        assert loop.chunk_tokens(me, 256, 1_000) == 3 * WINDOW
        # 10x faster: the sums so far halved, then this step added: 76.8 / 192 of the first rate, 250 fit
        loop._timed([_Timed(other, chunk=True, n=128)], 128 * per_token / 10)
        assert loop.chunk_tokens(me, 256, 1_000) == 7 * WINDOW
    finally:
        loop._release_slot()


def test_a_slots_prompt_takes_small_pieces_while_a_sibling_streams(
    files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beside a streaming slot a 300-token prompt rides in MIN_CHUNK pieces (the target made 0: every measured
    rate gives the floor), alone in the decoder's 256; the answer is the same as the decoder's alone."""
    monkeypatch.setattr(step_loop, "CHUNK_TARGET_S", 0.0)
    gg = open_gguf(files["llama-q4_1"])
    opts = replace(_options("ort", False, 512), prefill_chunk=256)
    alone = GraphDecoder(gg, opts)
    prompt = _prompt(300, 11)
    want = alone.forward(prompt, last_only=True)[-1]
    alone.close()
    a, b = GraphDecoder(gg, opts).capabilities().batching.slots(2)  # type: ignore[union-attr]
    stop = threading.Event()

    def stream() -> None:
        a.forward(_prompt(4, 12))
        token = 5
        while not stop.is_set():
            token = int(a.forward([token])[-1].argmax())

    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        while a.ridden[0] < 3:  # streaming before the prompt arrives
            stop.wait(0.01)
        got = b.forward(prompt, last_only=True)[-1]
        beside = b.ridden[0]
    finally:
        stop.set()
        streamer.join(60)
    assert beside == -(-len(prompt) // MIN_CHUNK), beside
    np.testing.assert_allclose(got, want, atol=ATOL)
    b.reset()
    b.forward(prompt, last_only=True)
    assert (
        b.ridden[0] - beside == 2
    )  # alone: 256 + 44 (its first piece may still see the sibling's last step)
    a.close()
    b.close()


@pytest.mark.parametrize(
    ("backend", "staged", "precision"),
    [("ort", True, "fast"), ("ort", False, "exact"), ("openvino", False, "exact")],
    ids=["ort-staged-fast", "ort-exact", "ov-exact"],
)
def test_the_per_slot_graph_alone_computes_what_the_packed_graph_does(
    files: dict[str, Path], backend: str, staged: bool, precision: str
) -> None:
    """One decoder on the graph with attention per slot (its rows a batch of one) gives the plain graph's rows
    bit for bit through prompts, wraps and rollbacks; on ORT its attention is fused as the plain graph's."""
    gg = open_gguf(files["qwen2-q8_0"])
    got = []
    for slot_axis in (False, True):
        opts = replace(_options(backend, staged, 48, slot_axis), precision=precision)
        dec = GraphDecoder(gg, opts)
        rows = []
        for plan in PLANS[:3]:
            dec.reset()
            rows += _run_plan(dec, plan)[1]
        got.append(np.stack(rows))
        if backend == "ort":
            import onnx

            ops = [n.op_type for n in onnx.load(dec.graph_path, load_external_data=False).graph.node]
            assert ops.count("Attention") == dec.cfg.n_layer and "Softmax" not in ops
        dec.close()
    np.testing.assert_array_equal(got[1], got[0])


def test_pack_slots_places_each_part_in_its_region_and_pads_with_its_last_row() -> None:
    """Staged parts of 1 and 3 tokens (windows 32 and 3 wide) in regions 2 and 0 of 3 (region 1's slot sits
    out): rows gathered per region with the last repeated, read back in packed order; masks, windows and
    stage_index per region, a repeated row as its original; the absent region sees one finite column."""
    room, rng = 8, np.random.default_rng(0)

    def part(q: int, past: int, w: int, cols: list[int]) -> dict[str, np.ndarray]:
        return {
            "hidden": rng.standard_normal((1, q, 4)).astype(np.float32),
            "positions": np.arange(q, dtype=np.int64),
            "logit_rows": np.arange(q, dtype=np.int64),
            "mask_0": rng.standard_normal((1, 1, q + 1, past + w)).astype(np.float32),
            "stage_index": np.array([[[0, c] for c in cols]], np.int64),
            "stage_key_0": rng.standard_normal((1, w, 2, 4)).astype(np.float32),
            "stage_value_0": rng.standard_normal((1, w, 2, 4)).astype(np.float32),
        }

    a, b = part(1, 5, WINDOW, [7]), part(3, 8, 3, [0, 1, 2])
    arena = {f"past_{kv}_0": np.zeros((3, room, 2, 4), np.float32) for kv in ("key", "value")}
    past = Packed(arena, {"mask_0": ((2 * room, 0), 3 * room)}, (2, 0))
    feeds, splits = pack_slots([a, b], 1, staged=True, past=past)
    assert [s.tokens for s in splits] == [(0, 1), (1, 4)]
    np.testing.assert_array_equal(feeds["slot_rows"], [[1, 2, 3, 3], [0, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(feeds["row_back"], [[8, 0, 1, 2]])
    mask = feeds["mask_0"]
    assert mask.shape == (3, 1, 4, room + WINDOW)
    np.testing.assert_array_equal(mask[2, 0, 0, :5], a["mask_0"][0, 0, 0, :5])
    np.testing.assert_array_equal(mask[2, 0, 0, room:], a["mask_0"][0, 0, 0, 5:])
    np.testing.assert_array_equal(mask[2, 0, 1:], np.repeat(mask[2, 0, :1], 3, axis=0))
    np.testing.assert_array_equal(mask[0, 0, :3, room : room + 3], b["mask_0"][0, 0, :3, 8:])
    assert np.isneginf(mask[0, 0, :3, room + 3 :]).all()  # past b's window: masked
    np.testing.assert_array_equal(mask[0, 0, 3], mask[0, 0, 2])
    assert (mask[1, 0, :, 0] == 0).all() and np.isneginf(mask[1, 0, :, 1:]).all()
    np.testing.assert_array_equal(feeds["stage_index"][0], [[0, 0], [0, 1], [0, 2], [0, 2]])
    np.testing.assert_array_equal(feeds["stage_index"][2], [[2, 7]] * 4)
    windows = feeds["stage_key_0"]
    assert windows.shape == (3, WINDOW, 2, 4) and not windows[0, 3:].any() and not windows[1].any()
    np.testing.assert_array_equal(windows[0, :3], b["stage_key_0"][0])
