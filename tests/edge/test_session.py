"""KV reuse across generations (edge.session): only the new suffix is prefilled, and the output is the one a
fresh decoder gives, on llama.cpp and on the graph engine's ring buffer (whose rollback is bounded)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from edge.devices.base import Capabilities, Decoder, KVFill
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
from edge.drafters import NgramDrafter
from edge.generate import Generation, GenerationConfig
from edge.models.gguf_file import open_gguf
from edge.models.tokenizer import Tokenizer, load_tokenizer
from edge.session import KVSession, common_prefix
from edge.speculative import SpeculativeDecoding
from tests.tiny_models import TinySpec, write_tiny_model

CFG = GenerationConfig(max_tokens=12, ignore_eos=True)
BASE = [1, *range(300, 316)]


class Recorder:
    """A Decoder wrapper that records what is fed, rolled back and reset."""

    def __init__(self, inner: Decoder) -> None:
        self.inner = inner
        self.fed: list[int] = []
        self.events: list[tuple[str, int]] = []
        self.vocab_size, self.n_ctx = inner.vocab_size, inner.n_ctx
        self.backend, self.device = inner.backend, inner.device

    @property
    def position(self) -> int:
        return self.inner.position

    def forward(self, tokens: Sequence[int], *, last_only: bool = False) -> np.ndarray:
        self.fed += list(tokens)
        return self.inner.forward(tokens, last_only=last_only)

    def rollback(self, n: int) -> None:
        self.events.append(("rollback", n))
        self.inner.rollback(n)

    def reset(self) -> None:
        self.events.append(("reset", 0))
        self.inner.reset()

    def close(self) -> None:
        self.inner.close()

    def kv_fill(self) -> KVFill:
        return self.inner.kv_fill()

    def capabilities(self) -> Capabilities:
        return self.inner.capabilities()


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("session") / "tiny.gguf", TinySpec(seed=3))


@pytest.fixture(scope="module")
def tokenizer(model_file: Path) -> Tokenizer:
    return load_tokenizer(open_gguf(model_file).metadata)


def open_decoder(kind: str, path: Path) -> Decoder:
    if kind == "llamacpp":
        return LlamaCppDecoder(path, LlamaCppOptions(n_ctx=512, n_threads=1))
    return GraphDecoder(open_gguf(path), GraphOptions(backend="ort", capacity=512, max_rollback=8, threads=1))


def fresh(kind: str, path: Path, tok: Tokenizer, prompt: list[int]) -> Generation:
    dec = open_decoder(kind, path)
    try:
        gen = Generation(dec, tok, prompt, CFG)
        gen.run()
        return gen
    finally:
        dec.close()


def test_common_prefix() -> None:
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3


@pytest.mark.parametrize("kind", ["llamacpp", "ort"])
def test_turns_prefill_only_the_suffix_and_match_a_fresh_decoder(
    kind: str, model_file: Path, tokenizer: Tokenizer, edge_cache: Path
) -> None:
    inner = open_decoder(kind, model_file)
    dec = Recorder(inner)
    session = KVSession(dec)  # type: ignore[arg-type]
    try:
        first = Generation(dec, tokenizer, BASE, CFG, session=session)  # type: ignore[arg-type]
        first.run()
        assert first.stats.n_cached_tokens == 0
        # the KV holds the prompt and every chosen token but the last (never fed)
        assert session.held == BASE + first.token_ids[:-1] == dec.fed
        assert dec.position == len(session.held)

        # the next turn extends the conversation: only the new ids are fed
        turn2 = [*BASE, *first.token_ids, 310, 311, 312]
        dec.fed.clear()
        dec.events.clear()
        second = Generation(dec, tokenizer, turn2, CFG, session=session)  # type: ignore[arg-type]
        second.run()
        assert second.stats.n_cached_tokens == len(BASE) + len(first.token_ids) - 1
        assert dec.fed[:5] == [first.token_ids[-1], 310, 311, 312, second.token_ids[0]]
        assert [e[0] for e in dec.events] == []  # nothing rolled back, nothing reset
        assert second.token_ids == fresh(kind, model_file, tokenizer, turn2).token_ids

        # a prompt that shares only a prefix rolls back, beyond the ring's undo log too while it has not wrapped
        dec.events.clear()
        third_prompt = [*BASE[:10], 299, 298]
        third = Generation(dec, tokenizer, third_prompt, CFG, session=session)  # type: ignore[arg-type]
        third.run()
        assert dec.events[0][0] == "rollback" and third.stats.n_cached_tokens == 10
        assert third.token_ids == fresh(kind, model_file, tokenizer, third_prompt).token_ids

        # the same prompt again: all but its last two ids are reused where the 12 answer ids roll back
        again = Generation(dec, tokenizer, third_prompt, CFG, session=session)  # type: ignore[arg-type]
        again.run()
        assert again.stats.n_cached_tokens == len(third_prompt) - 2
        assert again.token_ids == third.token_ids
    finally:
        inner.close()


@pytest.mark.parametrize("depth", [100, 5])
def test_a_history_differing_far_back_keeps_the_kv_up_to_the_difference(
    model_file: Path, tokenizer: Tokenizer, depth: int
) -> None:
    """A conversation re-sent with its history re-tokenized (a generated "K" + "V" sent back as one "KV") or
    edited `depth` tokens back: the ring, never wrapped, rolls back to the first differing token (far beyond
    its 8-token undo log) and prefills only the rest; the answer is a fresh decoder's."""
    inner = open_decoder("ort", model_file)
    dec = Recorder(inner)
    session = KVSession(dec)  # type: ignore[arg-type]
    try:
        long = [1, *[(3 + 7 * i) % 300 + 2 for i in range(160)]]
        Generation(dec, tokenizer, long, CFG, session=session).run()  # type: ignore[arg-type]
        dec.events.clear()
        cut = len(long) - depth
        prompt = [*long[:cut], 299, *long[cut + 2 :]]  # two ids become one, `depth` ids back
        dec.fed.clear()
        g = Generation(dec, tokenizer, prompt, CFG, session=session)  # type: ignore[arg-type]
        g.run()
        assert dec.events == [("rollback", dec.events[0][1])] and g.stats.n_cached_tokens == cut
        assert dec.fed[: len(prompt) - cut] == prompt[cut:]  # only the rest was prefilled
        assert g.token_ids == fresh("ort", model_file, tokenizer, prompt).token_ids
    finally:
        inner.close()


def test_rollback_after_a_wrap_stays_within_the_undo_log(model_file: Path, tokenizer: Tokenizer) -> None:
    """Once the ring has wrapped, slots hold other positions' K/V: rollback reaches only the undo log."""
    opts = GraphOptions(backend="ort", capacity=24, sink=2, max_rollback=8, threads=1)
    inner = GraphDecoder(open_gguf(model_file), opts)
    dec = Recorder(inner)
    session = KVSession(dec)  # type: ignore[arg-type]
    try:
        Generation(dec, tokenizer, BASE, CFG, session=session).run()  # type: ignore[arg-type]
        dec.events.clear()
        prompt = [*BASE, 305]  # diverges right after the prompt: 11 generated ids to drop > max_rollback 8
        g = Generation(dec, tokenizer, prompt, CFG, session=session)  # type: ignore[arg-type]
        g.run()
        assert dec.events == [("reset", 0)]
        dec.events.clear()
        held = session.held
        prompt = [*held[:-3], 306]  # 3 ids to drop, and one more to feed two: within the undo log
        g = Generation(dec, tokenizer, prompt, CFG, session=session)  # type: ignore[arg-type]
        g.run()
        assert dec.events == [("rollback", 4)]
        alone = GraphDecoder(open_gguf(model_file), opts)
        want = Generation(alone, tokenizer, prompt, CFG)
        want.run()
        alone.close()
        assert g.token_ids == want.token_ids
    finally:
        inner.close()


def test_stopping_early_and_errors_keep_the_history_true(model_file: Path, tokenizer: Tokenizer) -> None:
    with LlamaCppDecoder(model_file, LlamaCppOptions(n_ctx=512, n_threads=1)) as dec:
        session = KVSession(dec)
        gen = Generation(dec, tokenizer, BASE, CFG, session=session)
        it = iter(gen)
        next(it)
        next(it)
        it.close()  # the consumer stops: the KV is consistent between tokens
        assert session.held == [*BASE, gen.token_ids[0]] and dec.position == len(session.held)

        class Boom(RuntimeError):
            pass

        def cancel() -> bool:
            raise Boom

        with pytest.raises(Boom):
            Generation(dec, tokenizer, BASE, CFG, session=session, cancel=cancel).run()
        assert session.held == []  # unknown after an error: the next prepare resets
        g = Generation(dec, tokenizer, BASE, CFG, session=session)
        g.run()
        assert g.stats.n_cached_tokens == 0
        assert g.token_ids == fresh("llamacpp", model_file, tokenizer, BASE).token_ids

        dec.reset()  # used behind the session's back: it notices and starts over
        g = Generation(dec, tokenizer, BASE, CFG, session=session)
        g.run()
        assert g.stats.n_cached_tokens == 0


def test_speculative_decoding_with_a_session(model_file: Path, tokenizer: Tokenizer) -> None:
    with LlamaCppDecoder(model_file, LlamaCppOptions(n_ctx=512, n_threads=1)) as dec:
        session = KVSession(dec)
        spec = SpeculativeDecoding(dec, NgramDrafter())
        a = Generation(dec, tokenizer, BASE, CFG, session=session, decoding=spec)
        a.run()
        # a round may feed tokens past the end the loop keeps: the session rolls them back
        assert dec.position == len(session.held) <= len(BASE) + len(a.token_ids)
        prompt = [*BASE, *a.token_ids, 300, 301]
        b = Generation(dec, tokenizer, prompt, CFG, session=session, decoding=spec)
        b.run()
        assert b.stats.n_cached_tokens > len(BASE)
        assert b.token_ids == fresh("llamacpp", model_file, tokenizer, prompt).token_ids


def test_state_reports_ring_fill(model_file: Path, tokenizer: Tokenizer, edge_cache: Path) -> None:
    with LlamaCppDecoder(model_file, LlamaCppOptions(n_ctx=512, n_threads=1)) as dec:
        session = KVSession(dec)
        Generation(dec, tokenizer, BASE, CFG, session=session).run()
        st = session.state()
        assert (st.ring, st.capacity, st.fill, st.wrapped) == (False, 512, dec.position, False)
    gd = GraphDecoder(open_gguf(model_file), GraphOptions(backend="ort", capacity=64, sink=4, threads=1))
    try:
        session = KVSession(gd)
        long_prompt = [1, *[300 + (i % 20) for i in range(79)]]  # 80 tokens through a 64-slot ring
        Generation(gd, tokenizer, long_prompt, CFG, session=session).run()
        st = session.state()
        assert st.ring and st.capacity == 64 and st.fill == 64 and st.sink == 4
        assert st.position > 64 and st.wrapped
    finally:
        gd.close()
