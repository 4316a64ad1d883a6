"""A conversation that outgrows the context keeps its system prompt and drops its oldest turns (edge.session
`KVSession.window`): llama.cpp gets the cut conversation re-prefilled, the graph engine's ring pins the system
prompt as its sinks. Unit tests on a tiny model; the real-model chats are marked slow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edge
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
from edge.generate import Generation, GenerationConfig
from edge.models.gguf_file import open_gguf
from edge.models.tokenizer import Tokenizer, load_tokenizer
from edge.session import KVSession
from tests.near_ties import assert_equal_but_near_ties
from tests.tiny_models import TinySpec, write_tiny_model

OPENER = 1  # opens every turn of the synthetic conversation (as <|im_start|> does in ChatML)
SYSTEM = [OPENER, *range(300, 318)]  # 19 ids: the system prompt span
CFG = GenerationConfig(max_tokens=16, ignore_eos=True)


def turn(i: int, n: int = 30) -> list[int]:
    return [OPENER, *(260 + (i * 7 + j) % 40 for j in range(n - 1))]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", TinySpec(arch="llama"))


@pytest.fixture(scope="module")
def tok(model_file: Path) -> Tokenizer:
    return load_tokenizer(open_gguf(model_file).metadata)


def chat(dec, tok: Tokenizer, turns: int) -> tuple[KVSession, list[Generation]]:  # type: ignore[no-untyped-def]
    """A conversation of `turns` user turns, each answer appended to it, on one session."""
    session, conv, gens = KVSession(dec), list(SYSTEM), []
    for i in range(turns):
        conv += turn(i)
        gen = Generation(dec, tok, conv, CFG, session=session, keep=len(SYSTEM))
        gen.run()
        gens.append(gen)
        conv += gen.token_ids
    return session, gens


def test_llamacpp_keeps_the_system_prompt_and_drops_whole_turns(model_file: Path, tok: Tokenizer) -> None:
    dec = LlamaCppDecoder(model_file, LlamaCppOptions(n_ctx=256, n_threads=1))
    session, gens = chat(dec, tok, 14)  # 19 + 14 * (30 + 16) = 663 tokens through a 256-token context
    last = gens[-1]
    assert last.stats.n_dropped_tokens > 0 and last.stats.n_kept_tokens == len(SYSTEM)
    assert last.stats.window_note and "system prompt's 19 kept" in last.stats.window_note
    assert last.stats.stop_reason == "length"  # answered in full, never cut by the context
    held = session.held
    assert held[: len(SYSTEM)] == SYSTEM and dec.position == len(held) <= dec.n_ctx
    assert held[len(SYSTEM)] == OPENER  # cut at the start of a turn, not inside one
    state = session.state()
    assert state.left_window and state.kept == len(SYSTEM) and state.dropped == last.stats.n_dropped_tokens
    # between cuts a turn prefills only its new text
    assert any(g.stats.n_dropped_tokens and g.stats.n_cached_tokens > len(SYSTEM) for g in gens)
    # what the model saw is a coherent conversation: its answer is a fresh decoder's on the same ids
    fresh = LlamaCppDecoder(model_file, LlamaCppOptions(n_ctx=256, n_threads=1))
    again = Generation(fresh, tok, last.prompt_ids, CFG)
    again.run()
    assert again.token_ids == last.token_ids


def test_the_ring_pins_the_system_prompt_as_its_sinks(
    model_file: Path, tok: Tokenizer, edge_cache: Path
) -> None:
    dec = GraphDecoder(open_gguf(model_file), GraphOptions(backend="ort", capacity=128, threads=1))
    session, gens = chat(dec, tok, 8)  # 19 + 8 * 46 = 387 tokens through a 128-slot ring
    assert dec.cache.sink == len(SYSTEM)
    slots = dec.cache.positions()
    assert slots[: len(SYSTEM)].tolist() == list(range(len(SYSTEM)))  # the system prompt's slots, for good
    assert session.held[: len(SYSTEM)] == SYSTEM
    state = session.state()
    assert state.wrapped and state.kept == len(SYSTEM) and state.dropped == dec.position - 128
    assert gens[-1].stats.n_dropped_tokens == state.dropped and gens[-1].stats.window_note
    assert all(g.stats.n_cached_tokens > 0 for g in gens[1:])  # the ring wraps across turns, KV reused
    assert np.isfinite(dec.forward([OPENER], last_only=True)).all()


def test_set_sink_is_bounded_and_resets_only_on_change(model_file: Path, edge_cache: Path) -> None:
    dec = GraphDecoder(open_gguf(model_file), GraphOptions(backend="ort", capacity=64, threads=1))
    assert dec.set_sink(2) is False and dec.cache.sink == 4  # never fewer than the default sinks
    dec.forward(SYSTEM)
    assert dec.set_sink(1000) is True and dec.cache.sink == 32 == dec.max_sink  # half the ring still rotates
    assert dec.position == 0 and dec.chunk <= dec.cache.max_step
    assert dec.set_sink(32) is False


def test_window_keeps_a_prompt_that_fits_and_leaves_plain_prompts_alone(model_file: Path) -> None:
    dec = LlamaCppDecoder(model_file, LlamaCppOptions(n_ctx=256, n_threads=1))
    session = KVSession(dec)
    short = SYSTEM + turn(0)
    assert session.window(short, keep=len(SYSTEM), reserve=16) == short and not session.state().left_window
    long = SYSTEM + [t for i in range(10) for t in turn(i)]
    assert session.window(long, keep=None) == long  # not a conversation: too long stays an error
    cut = session.window(long, keep=len(SYSTEM), reserve=16)
    assert cut[: len(SYSTEM)] == SYSTEM and cut[len(SYSTEM)] == OPENER and len(cut) + 16 <= 256
    assert cut[-30:] == long[-30:]  # the newest turn whole
    # the same conversation one turn on keeps the same cut (its KV is reused), until it fills again
    longer = long + turn(10)
    assert session.window(longer, keep=len(SYSTEM), reserve=16)[: len(cut)] == cut


def test_system_span_of_chatml_and_a_default_system_prompt(model_file: Path) -> None:
    with edge.load(str(model_file), n_ctx=256, n_threads=1) as m:
        assert m.system_span([{"role": "user", "content": "hi"}]) == 0  # no template: plain completion


@pytest.mark.slow
def test_system_span_of_smollm2() -> None:
    with edge.load("smollm2-135m", n_ctx=256, n_threads=1) as m:
        system = [{"role": "system", "content": "You are Zorblax."}]
        msgs = [*system, {"role": "user", "content": "hi"}]
        head = m.encode_prompt(m.template.render(system, add_generation_prompt=False))  # type: ignore[union-attr]
        assert m.system_span(msgs) == len(head) and m.chat_ids(msgs)[: len(head)] == head
        # no system message: SmolLM2's template adds its own, which is kept the same way
        default = m.system_span([{"role": "user", "content": "hi"}])
        ids = m.chat_ids([{"role": "user", "content": "hi"}])
        assert default > 10 and m.tokenizer.decode(ids[:default]).endswith("<|im_end|>\n")


ZORBLAX = "You are Zorblax, a pirate robot from Neptune. You answer every question with a few sentences."
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours of the rainbow.",
    "What do bees make?",
    "How many legs does a spider have?",
    "What is the opposite of hot?",
    "Which planet is closest to the sun?",
    "What do you call a baby cat?",
    "What is two plus three?",
    "Why is the sea salty?",
    "What is your favourite food?",
    "Tell me about your ship.",
    "Who are you?",
]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llamacpp", "ort", "openvino"])
def test_a_long_chat_on_smollm2_keeps_its_system_prompt(kind: str) -> None:
    """Twelve turns (~600 tokens or more) through a 256-token context: the system prompt stays in the KV, older turns go,
    every answer is a real answer and the note is set."""
    with edge.load("smollm2-135m", backend=kind, n_ctx=256, n_threads=2) as m:
        msgs: list[dict[str, str]] = [{"role": "system", "content": ZORBLAX}]
        keep = m.system_span([*msgs, {"role": "user", "content": "x"}])
        system_ids = m.chat_ids([*msgs, {"role": "user", "content": "x"}])[:keep]
        assert keep > 20 and m.tokenizer.decode(system_ids).endswith("<|im_end|>\n")
        results = []
        for q in QUESTIONS:
            msgs.append(
                {"role": "user", "content": f"{q} Think about it, explain your answer and add a fun fact."}
            )
            r = m.chat(msgs, max_tokens=48)
            assert r.text.strip() and r.stats.stop_reason in ("eos", "length"), (q, r.text)
            assert "\ufffd" not in r.text
            msgs.append({"role": "assistant", "content": r.text})
            results.append(r)
        last = results[-1]
        assert len(m.chat_ids(msgs)) > 2 * 256  # well past the context
        assert last.stats.window_note and last.stats.n_kept_tokens >= keep
        assert last.prompt_ids[:keep] == system_ids  # what the model saw starts with the system prompt
        kv = m.kv_state()
        assert kv.left_window and kv.dropped > 0
        held = m.session.held
        assert held[:keep] == system_ids
        if kind == "llamacpp":
            assert m.decoder.position == len(held) <= 256
            # coherent: the answer is a fresh prefill's answer on the same (cut) conversation
            # (its batched prefill rounds differently from the chat's path through the KV: near-ties may part)
            again = m.generate(m.tokenizer.decode(last.prompt_ids), max_tokens=48, raw=True, reuse=False)
            assert_equal_but_near_ties(m.decoder, last.prompt_ids, again.token_ids, last.token_ids)
        else:
            cache = m.decoder.cache
            assert cache.sink == keep and kv.wrapped
            assert cache.positions()[:keep].tolist() == list(
                range(keep)
            )  # sink slots hold positions 0..keep-1


def test_partitioned_decoder_pins_the_system_prompt_too(
    model_file: Path, tok: Tokenizer, edge_cache: Path, tmp_path: Path
) -> None:
    """An `edge convert` artifact (two partitions, static NPU-shaped graphs) wraps the same way."""
    from edge.devices.partitioned import PartitionedOptions, open_artifact_decoder
    from edge.models.convert import ConvertOptions, convert

    art = tmp_path / "art"
    convert(
        model_file,
        art,
        ConvertOptions(target="openvino", partitions=2, static=True, prefill_chunk=8, capacity=96),
    )
    dec = open_artifact_decoder(
        art, [("openvino", "cpu"), ("ort", "cpu")], options=PartitionedOptions(threads=1)
    )
    assert dec.set_sink(2) is False and dec.cache.sink == 4
    assert dec.max_sink == 48 and dec.set_sink(1000) is True and dec.cache.sink == 48
    assert dec.chunk == 8 <= dec.cache.max_step
    dec.set_sink(4)
    session, gens = chat(dec, tok, 5)  # 19 + 5 * 46 = 249 tokens through a 96-slot ring
    assert dec.cache.sink == len(SYSTEM) and session.held[: len(SYSTEM)] == SYSTEM
    assert dec.cache.positions()[: len(SYSTEM)].tolist() == list(range(len(SYSTEM)))
    assert gens[-1].stats.window_note and session.state().wrapped
    dec.close()
