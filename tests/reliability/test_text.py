"""Text at the edges: invalid UTF-8 coming in, prompts longer than the context under each overflow policy, and
streamed text (emoji, CJK, U+2028) equal to the text decoded at once, on the real tokenizers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edge.api import load
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
from edge.errors import ContextOverflowError
from edge.generate import Generation, GenerationConfig, _StopMatcher
from edge.models.gguf_file import open_gguf
from edge.models.resolve import resolve_model
from edge.models.tokenizer import Tokenizer, load_tokenizer
from tests.reliability.conftest import assert_one_line_error, cli

# --- invalid UTF-8 and lone surrogates in input -------------------------------------------------------------

BAD_UTF8 = b"caf\xe9 \xff\xfe ok \xe6\x97 end\n"  # Latin-1 byte, invalid bytes, a cut 3-byte sequence
REPLACED = BAD_UTF8.decode("utf-8", "replace")


def test_invalid_utf8_on_stdin_is_replaced_with_a_warning(tiny_model: Path) -> None:
    proc = cli("tokenize", str(tiny_model), "--json", stdin=BAD_UTF8)
    assert proc.returncode == 0, proc.stderr
    assert b"not valid UTF-8 (byte 3)" in proc.stderr and b"Traceback" not in proc.stderr
    tok = load_tokenizer(open_gguf(tiny_model).metadata)
    assert json.loads(proc.stdout)["token_ids"] == tok.encode(REPLACED)


def test_invalid_utf8_prompt_on_stdin_runs(tiny_model: Path) -> None:
    proc = cli(
        "run", str(tiny_model), "--raw", "--max-tokens", "2", "--ctx-size", "64", "--json", stdin=BAD_UTF8
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    tok = load_tokenizer(open_gguf(tiny_model).metadata)
    assert out["n_prompt_tokens"] == len(tok.encode(REPLACED)) + int(tok.add_bos)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        (b'"caf\xe9"\n', "stdin line 1 is not JSON"),  # invalid UTF-8 inside a JSON line
        (b'"ok"\n"\\ud800 lone surrogate"\n', "lone surrogate"),  # valid JSON, not valid Unicode
        (b"[1, 2]\n", "stdin line 1 is a JSON list"),
    ],
)
def test_bad_jsonl_lines_are_one_clear_line(line: bytes, needle: str, tiny_model: Path) -> None:
    assert_one_line_error(cli("tokenize", str(tiny_model), "--jsonl", stdin=line), needle)


def test_undecodable_argv_is_one_clear_line(tiny_model: Path) -> None:
    # on POSIX, argv bytes that are not UTF-8 arrive as lone surrogates (surrogateescape)
    import os
    import subprocess
    import sys

    from tests.reliability.conftest import ROOT

    proc = subprocess.run(
        [os.fsencode(sys.executable), b"-m", b"edge.cli", b"tokenize", os.fsencode(tiny_model), b"caf\xe9"],
        capture_output=True,
        cwd=ROOT,
        timeout=120,
    )
    assert_one_line_error(proc, "lone surrogate")


# --- prompts longer than the context ----------------------------------------------------------------------

CAPACITY = 64  # KV slots of the graph engine's ring in these tests (llama.cpp: n_ctx 256, its minimum)


def ids(n: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(3, 320, n).tolist()


@pytest.fixture(scope="module")
def tiny_gguf(tiny_model: Path):  # type: ignore[no-untyped-def]
    return open_gguf(tiny_model)


@pytest.fixture(scope="module")
def tiny_tok(tiny_model: Path) -> Tokenizer:
    return load_tokenizer(open_gguf(tiny_model).metadata)


def graph(tiny_gguf, policy: str) -> GraphDecoder:  # type: ignore[no-untyped-def]
    return GraphDecoder(
        tiny_gguf, GraphOptions(capacity=CAPACITY, sink=4, policy=policy, threads=1, prefill_chunk=32)
    )


def generate(dec, tok: Tokenizer, prompt: list[int], n: int = 5) -> Generation:  # type: ignore[no-untyped-def]
    gen = Generation(dec, tok, prompt, GenerationConfig(max_tokens=n, ignore_eos=True))
    gen.run()
    return gen


def test_ring_policy_runs_past_the_ring(tiny_gguf, tiny_tok: Tokenizer, edge_cache: Path) -> None:  # type: ignore[no-untyped-def]
    dec = graph(tiny_gguf, "ring")
    gen = generate(dec, tiny_tok, ids(3 * CAPACITY), n=CAPACITY)  # prompt and answer both wrap the ring
    assert gen.stats.n_tokens == CAPACITY and gen.stats.stop_reason == "length"
    assert dec.position == 4 * CAPACITY - 1  # the last token is chosen, not fed
    assert all(0 <= t < dec.vocab_size for t in gen.token_ids)


@pytest.mark.parametrize("policy", ["error", "truncate"])
def test_bounded_policies_refuse_a_long_prompt_and_stay_usable(
    policy: str,
    tiny_gguf,
    tiny_tok: Tokenizer,
    edge_cache: Path,  # type: ignore[no-untyped-def]
) -> None:
    dec = graph(tiny_gguf, policy)
    fresh = generate(dec, tiny_tok, ids(10)).token_ids
    with pytest.raises(ContextOverflowError, match="context holds 64"):
        generate(dec, tiny_tok, ids(CAPACITY + 1))
    with pytest.raises(ContextOverflowError):  # straight to the decoder: refused before anything is written
        dec.forward(ids(CAPACITY + 1))
    assert dec.position == 10 + 4  # untouched by the refusals
    # a prompt that fits but an answer that does not: ends with stop_reason "context" at the capacity
    gen = generate(dec, tiny_tok, ids(CAPACITY - 3), n=10)
    assert gen.stats.stop_reason == "context" and dec.position == CAPACITY
    assert generate(dec, tiny_tok, ids(10)).token_ids == fresh


def test_llama_cpp_context_refuses_a_long_prompt_and_stays_usable(
    tiny_model: Path, tiny_tok: Tokenizer
) -> None:
    with LlamaCppDecoder(tiny_model, LlamaCppOptions(n_ctx=256, n_threads=1)) as dec:
        fresh = generate(dec, tiny_tok, ids(10)).token_ids
        with pytest.raises(ContextOverflowError, match="context holds 256"):
            generate(dec, tiny_tok, ids(300))
        before = dec.position
        with pytest.raises(ContextOverflowError):
            dec.forward(ids(300))
        assert dec.position == before
        gen = generate(dec, tiny_tok, ids(250), n=20)
        assert gen.stats.stop_reason == "context" and dec.position == 256
        assert generate(dec, tiny_tok, ids(10)).token_ids == fresh


def test_long_prompt_through_the_model_and_cli(tiny_model: Path) -> None:
    # llama.cpp's fixed context (the own graphs' ring keeps sinks + recent tokens instead: tests/kvcache)
    with load(str(tiny_model), backend="llamacpp", n_ctx=256, n_threads=1) as m:
        fresh = m.generate("w1 w2 w3", GenerationConfig(max_tokens=4), reuse=False, raw=True).token_ids
        with pytest.raises(ContextOverflowError):
            m.generate("w7 " * 300, GenerationConfig(max_tokens=4), reuse=False, raw=True)
        assert (
            m.generate("w1 w2 w3", GenerationConfig(max_tokens=4), reuse=False, raw=True).token_ids == fresh
        )
    proc = cli("run", str(tiny_model), "w7 " * 300, "--raw", "--ctx-size", "256", "--backend", "llamacpp")
    assert_one_line_error(proc, "context holds 256")


# --- streaming: pieces add up to the text, never a broken character --------------------------------------

TEXTS = [
    "👍🏽 👨‍👩‍👧‍👦 🇯🇵 🤖 ❤️",  # skin tone, ZWJ family, flag pair, variation selector
    "日本語のテキスト、中文，한국어。",
    "line\u2028separator\u2029paragraph\u0085next",
    "e\u0301 \ufeffbom \u200dzwj \u00a0nbsp",
    "مرحبا بالعالم שלום",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈 \U000e0041 \U0010fffd",
]


def stream_pieces(tok: Tokenizer, token_ids: list[int]) -> list[str]:
    s = tok.stream()
    return [s.push(i) for i in token_ids] + [s.flush()]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_streamed_text_equals_decoded_text_on_real_tokenizers(name: str) -> None:
    tok = load_tokenizer(open_gguf(resolve_model(name)).metadata)
    for text in TEXTS:
        token_ids = tok.encode(text)
        pieces = stream_pieces(tok, token_ids)
        assert "".join(pieces) == tok.decode(token_ids) == text
        assert not any("\ufffd" in p for p in pieces), pieces  # no piece ends inside a character
        # and through the generation loop's stop matcher: a stop string made of these characters is held
        # back while it may still be forming, and never streamed
        stop = text[len(text) // 2 : len(text) // 2 + 3]
        matcher = _StopMatcher([stop])
        out = ""
        for piece in pieces:  # as the generation loop does: nothing is fed after the stop
            out += matcher.feed(piece)
            if matcher.hit:
                break
        else:
            out += matcher.flush()
        assert out == text[: text.find(stop)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "prompt", "stop"),
    [
        ("gemma3-270m", "👍🏽 日本語のテキスト\u2028中文 🇯🇵 " * 4, None),
        ("smollm2-135m", "Emoji list: 😀 😃 😄 😁 😆 😅 🤣 😂 ", None),
        ("smollm2-135m", "中文：你好，世界。\u2028日本語：こんにちは、世界。\u2028中文：", "．．"),
    ],
)
def test_generation_stream_equals_the_final_text(name: str, prompt: str, stop: str | None) -> None:
    cfg = GenerationConfig(max_tokens=24, stop=(stop,) if stop else ())
    with load(name, n_ctx=512, n_threads=2) as m:
        pieces: list[str] = []
        result = m.generate(prompt, cfg, reuse=False, raw=True, on_text=pieces.append)
        streamed = list(m.stream(prompt, cfg, reuse=False, raw=True))
        assert "".join(pieces) == "".join(streamed) == result.text
        assert any(ord(c) > 0x7F for c in result.text), result.text  # the case is really exercised
        if stop:
            assert stop not in result.text
        else:
            assert result.text == m.tokenizer.decode(result.token_ids)
