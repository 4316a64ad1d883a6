"""llama.cpp slots (devices/llamacpp_batch.py): sequences decoded in one native batch on one model, each with
its own cells: a slot's logits in a shared step are its logits alone (to llama.cpp's rounding: its rows are not
batch-invariant), cuts and copies stay in their sequence, and bad input fails one slot only."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edge.devices import step_loop
from edge.devices.base import Decoder
from edge.devices.llamacpp_batch import CHUNK, LlamaCppSlot
from edge.devices.registry import DecoderOptions, open_decoder, runnable_backends
from edge.devices.step_loop import MIN_CHUNK
from edge.errors import ContextOverflowError, DeviceError, InsufficientMemoryError
from tests.devices.test_batch import _in_threads
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.skipif(
    "llamacpp" not in runnable_backends(), reason="llama-cpp-python not installed"
)

SPEC = TinySpec(seed=5, n_vocab=320)
CTX = 640
PROMPTS = [[1, *range(260 + i, 270 + i)] for i in range(3)]  # three different 11-token prompts


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("lcbatch") / "tiny.gguf", SPEC)


def _open(path: Path) -> Decoder:
    return open_decoder("llamacpp", path, "cpu", DecoderOptions(n_ctx=CTX, n_threads=1))


@pytest.fixture
def slots(model_file: Path) -> Iterator[list[LlamaCppSlot]]:
    batching = _open(model_file).capabilities().batching
    assert batching is not None, "llama.cpp declares batching"
    made = batching.slots(3)
    assert all(isinstance(s, LlamaCppSlot) for s in made)
    made[0].engine.linger = 0.2  # type: ignore[attr-defined]  # a loaded CI machine: the steps still pack
    yield made  # type: ignore[misc]
    for s in made:
        s.close()


def _greedy(dec: Decoder, prompt: list[int], n: int) -> tuple[list[int], list[np.ndarray]]:
    """n greedy tokens after `prompt`, and the logits row each was picked from."""
    row = dec.forward(prompt, last_only=True)[-1]
    toks, rows = [], []
    for _ in range(n):
        rows.append(row)
        toks.append(int(np.argmax(row)))
        row = dec.forward([toks[-1]])[-1]
    return toks, rows


def _alone(path: Path, prompt: list[int], tokens: list[int]) -> np.ndarray:
    """The rows one decoder gives, fed `prompt` then `tokens` one at a time (teacher forcing)."""
    dec = _open(path)
    try:
        rows = [dec.forward(prompt, last_only=True)[-1]]
        rows += [dec.forward([t])[-1] for t in tokens[:-1]]
        return np.stack(rows)
    finally:
        dec.close()


def _concurrently(slots: list[LlamaCppSlot], work: list) -> list:  # type: ignore[type-arg]
    """work[i](slots[i]) for each i, in threads at once (tests/devices/test_batch.py's runner)."""
    return _in_threads([partial(w, s) for s, w in zip(slots, work, strict=False)])


def test_each_slot_decodes_as_alone_in_shared_steps(model_file: Path, slots: list[LlamaCppSlot]) -> None:
    got = _concurrently(slots, [lambda s, p=p: _greedy(s, p, 24) for p in PROMPTS])
    engine = slots[0].engine
    assert engine.steps < 3 * 25 and engine.mean_batch > 1.5  # the three rode together
    assert all(s.ridden[0] == 25 for s in slots)
    for prompt, (toks, rows) in zip(PROMPTS, got, strict=True):
        # teacher-forced on the tokens the slot chose: any mix-up between sequences would show as whole rows
        np.testing.assert_allclose(np.stack(rows), _alone(model_file, prompt, toks), rtol=1e-3, atol=1e-3)
    assert [s.position for s in slots] == [len(p) + 24 for p in PROMPTS]


def test_a_long_prompt_rides_in_chunks_beside_decode_rows(
    model_file: Path, slots: list[LlamaCppSlot]
) -> None:
    long = [1, *(200 + (7 * i) % 100 for i in range(2 * CHUNK + 40))]
    work = [lambda s: s.forward(long, last_only=True)[-1]] + [
        lambda s, p=p: _greedy(s, p, 30) for p in PROMPTS[1:]
    ]
    got = _concurrently(slots, work)
    assert slots[0].engine.mixed_steps >= 1  # a chunk and decode rows in one step
    assert slots[0].position == len(long)
    np.testing.assert_allclose(got[0], _alone(model_file, long, [0])[-1], rtol=1e-3, atol=1e-3)


def test_rollback_and_reset_stay_in_their_sequence(model_file: Path, slots: list[LlamaCppSlot]) -> None:
    a, b, _ = slots
    a.forward(PROMPTS[0])
    b.forward(PROMPTS[1])
    b.rollback(4)
    b.forward([300, 301])
    b.reset()
    assert b.position == 0 and b.kv_fill().fill == 0
    row = a.forward([5])[-1]  # a's KV untouched by b's cuts
    np.testing.assert_allclose(row, _alone(model_file, [*PROMPTS[0], 5], [0])[-1], rtol=1e-3, atol=1e-3)


def test_a_prefix_copy_shares_the_siblings_cells(model_file: Path, slots: list[LlamaCppSlot]) -> None:
    a, b, _ = slots
    a.forward(PROMPTS[0])
    assert b.copy_prefix_from(a, lambda: 8, adopt=lambda n: None) == 8 and b.position == 8
    row = b.forward(PROMPTS[0][8:], last_only=True)[-1]  # the rest computed: as the whole prompt alone
    np.testing.assert_allclose(row, _alone(model_file, PROMPTS[0], [0])[-1], rtol=1e-3, atol=1e-3)
    a.rollback(3)  # a's cut leaves b's copy
    np.testing.assert_allclose(b.forward([7])[-1], _alone(model_file, [*PROMPTS[0], 7], [0])[-1], atol=1e-3)


def test_a_copy_is_refused_when_the_sibling_was_cut_below_it(slots: list[LlamaCppSlot]) -> None:
    a, b, c = slots
    a.forward(PROMPTS[0])

    def count_while_a_rolls_back() -> int:  # the sibling's KV moves between the count and the copy
        a.rollback(6)
        a.forward([7, 8, 9])
        return 10

    assert b.copy_prefix_from(a, count_while_a_rolls_back) == 0 and b.position == 0
    assert c.copy_prefix_from(a, lambda: 4) == 4  # a cut above the count does not matter
    assert c.copy_prefix_from(c, lambda: 4) == 0  # not from itself


def test_bad_input_fails_one_slot_only(model_file: Path, slots: list[LlamaCppSlot]) -> None:
    a, b, _ = slots
    a.forward(PROMPTS[0])
    with pytest.raises(ContextOverflowError):
        b.forward([3] * (b.n_ctx + 1))
    with pytest.raises(ValueError, match="out of range"):
        b.forward([SPEC.n_vocab + 5])
    assert b.position == 0
    row = a.forward([5])[-1]
    np.testing.assert_allclose(row, _alone(model_file, [*PROMPTS[0], 5], [0])[-1], rtol=1e-3, atol=1e-3)


def test_a_failed_decode_fails_the_step_and_leaves_each_kv_as_before(
    model_file: Path, slots: list[LlamaCppSlot], monkeypatch: pytest.MonkeyPatch
) -> None:
    import llama_cpp

    a, b, _ = slots
    a.forward(PROMPTS[0])
    real = llama_cpp.llama_decode
    monkeypatch.setattr(llama_cpp, "llama_decode", lambda ctx, batch: 1)  # llama.cpp found no free cells
    with pytest.raises(DeviceError, match="llama_decode returned 1"):
        a.forward([5, 6])
    with pytest.raises(DeviceError):
        b.forward(PROMPTS[1])
    monkeypatch.setattr(llama_cpp, "llama_decode", real)
    assert (a.position, b.position) == (len(PROMPTS[0]), 0)
    row = a.forward([5])[-1]  # the step's cells were removed: a goes on as if it never ran
    np.testing.assert_allclose(row, _alone(model_file, [*PROMPTS[0], 5], [0])[-1], rtol=1e-3, atol=1e-3)
    b.forward(PROMPTS[1])
    assert b.position == len(PROMPTS[1])


def test_closing_twice_releases_once(model_file: Path) -> None:
    batching = _open(model_file).capabilities().batching
    assert batching is not None
    a, b = batching.slots(2)
    a.close()
    a.close()  # a second close must not count as b's release (which would free the context under b)
    assert isinstance(b, LlamaCppSlot) and b.engine.alive
    b.forward(PROMPTS[0])
    b.close()
    assert not b.engine.alive


def test_slots_that_do_not_fit_are_refused_and_the_decoder_runs_on(
    model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psutil

    dec = _open(model_file)
    try:
        batching = dec.capabilities().batching
        assert batching is not None
        # the machine's answer injected: too little memory for 2 more sequences' KV
        monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=1 << 10))
        with pytest.raises(InsufficientMemoryError, match="3 slots need 3 KV caches"):
            batching.slots(3)
        assert dec.forward(PROMPTS[0]).shape == (len(PROMPTS[0]), SPEC.n_vocab)
    finally:
        dec.close()


def test_the_last_slot_closed_stops_the_engine(model_file: Path) -> None:
    base = _open(model_file)
    batching = base.capabilities().batching
    assert batching is not None
    a, b = batching.slots(2)
    with pytest.raises(DeviceError, match="closed"):
        base.forward([1])  # the model went to its slots
    a.forward(PROMPTS[0])
    a.close()
    assert isinstance(b, LlamaCppSlot) and b.engine.alive
    with pytest.raises(DeviceError, match="closed"):
        a.forward([1])
    b.close()
    assert not b.engine.alive
    b.close()  # twice: nothing


def test_a_prompt_beside_a_streaming_slot_takes_small_pieces(
    model_file: Path, slots: list[LlamaCppSlot], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the graph slots' (devices/step_loop.chunk_for): beside a streaming slot a prompt rides in
    MIN_CHUNK pieces (the target made 0), and gives what it gives alone."""
    monkeypatch.setattr(step_loop, "CHUNK_TARGET_S", 0.0)
    a, b, _ = slots
    prompt = [1, *(200 + (7 * i) % 100 for i in range(CHUNK + 43))]
    stop = threading.Event()

    def stream() -> None:
        token = int(a.forward(PROMPTS[0])[-1].argmax())
        while not stop.is_set() and a.position < CTX - 1:
            token = int(a.forward([token])[-1].argmax())

    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        while a.ridden[0] < 3:
            stop.wait(0.01)
        got = b.forward(prompt, last_only=True)[-1]
    finally:
        stop.set()
        streamer.join(60)
    assert b.ridden[0] == -(-len(prompt) // MIN_CHUNK), b.ridden
    np.testing.assert_allclose(got, _alone(model_file, prompt, [0])[-1], rtol=1e-3, atol=1e-3)
