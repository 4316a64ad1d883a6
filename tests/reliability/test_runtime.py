"""Runtime faults: cancelling during prefill and decode, two threads on one model, a backend that fails or
goes away mid-run. After each, the next answer must equal a fresh one."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edge.api import load
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
from edge.errors import DeviceError, EdgeError, GenerationCancelled
from edge.generate import Generation, GenerationConfig
from edge.models.gguf_file import GGUFFile, open_gguf
from edge.models.tokenizer import Tokenizer, load_tokenizer
from tests.tiny_models import TinySpec, write_tiny_model

PROMPT = np.random.default_rng(1).integers(3, 320, 200).tolist()
CHUNK = 32


@pytest.fixture(scope="module")
def tok(tiny_model: Path) -> Tokenizer:
    return load_tokenizer(open_gguf(tiny_model).metadata)


@pytest.fixture(scope="module")
def gguf(tiny_model: Path) -> GGUFFile:
    return open_gguf(tiny_model)


def open_decoder(kind: str, tiny_model: Path, gguf: GGUFFile):  # type: ignore[no-untyped-def]
    if kind == "llamacpp":
        return LlamaCppDecoder(tiny_model, LlamaCppOptions(n_ctx=512, n_threads=1))
    return GraphDecoder(gguf, GraphOptions(backend=kind, capacity=512, threads=1, prefill_chunk=CHUNK))


def run(dec, tok: Tokenizer, cancel: Callable[[], bool] | None = None, **kw: object) -> Generation:  # type: ignore[no-untyped-def]
    cfg = GenerationConfig(max_tokens=12, ignore_eos=True, prefill_chunk=CHUNK)
    gen = Generation(dec, tok, PROMPT, cfg, cancel=cancel, **kw)  # type: ignore[arg-type]
    gen.run()
    return gen


def polls_until(n: int) -> Callable[[], bool]:
    """A cancel callable that says yes from its n-th call on."""
    calls = [0]

    def cancel() -> bool:
        calls[0] += 1
        return calls[0] >= n

    return cancel


@pytest.mark.parametrize("kind", ["llamacpp", "ort"])
def test_cancel_during_prefill_then_a_fresh_answer(
    kind: str, tiny_model: Path, gguf: GGUFFile, tok, edge_cache
) -> None:  # type: ignore[no-untyped-def]
    dec = open_decoder(kind, tiny_model, gguf)
    fresh = run(dec, tok).token_ids
    gen = run(dec, tok, cancel=polls_until(3))  # yes before the 3rd chunk
    assert gen.stats.stop_reason == "cancelled" and gen.token_ids == [] and gen.text == ""
    assert dec.position == 2 * CHUNK < len(PROMPT)  # stopped inside the prefill, between chunks
    assert run(dec, tok).token_ids == fresh
    with pytest.raises(GenerationCancelled):
        run(dec, tok, cancel=polls_until(1), raise_on_cancel=True)
    assert run(dec, tok).token_ids == fresh


@pytest.mark.parametrize("kind", ["llamacpp", "ort"])
def test_cancel_during_decode_then_a_fresh_answer(
    kind: str, tiny_model: Path, gguf: GGUFFile, tok, edge_cache
) -> None:  # type: ignore[no-untyped-def]
    dec = open_decoder(kind, tiny_model, gguf)
    fresh = run(dec, tok)
    n_chunks = -(-len(PROMPT) // CHUNK)
    gen = run(dec, tok, cancel=polls_until(n_chunks + 1 + 5))  # polls: one per chunk, then one per token
    assert gen.stats.stop_reason == "cancelled" and gen.token_ids == fresh.token_ids[:5]
    assert fresh.text.startswith(gen.text)
    assert run(dec, tok).token_ids == fresh.token_ids


@pytest.mark.slow
def test_cancel_from_another_thread_on_a_real_model() -> None:
    """A user pressing stop while smollm2 reads a long prompt: the call returns within about one chunk."""
    cfg = GenerationConfig(max_tokens=8, prefill_chunk=256)
    with load("smollm2-135m", n_ctx=4096, n_threads=2) as m:
        short = m.generate("Name a colour.", cfg, reuse=False)
        stop = threading.Event()
        timer = threading.Timer(0.5, stop.set)
        long_prompt = (
            "The quick brown fox jumps over the lazy dog. " * 300
        )  # ~3,000 tokens: seconds of prefill
        timer.start()
        result = m.generate(long_prompt, cfg, reuse=False, cancel=stop.is_set)
        assert result.stats.stop_reason == "cancelled" and result.token_ids == []
        assert m.decoder.position < result.stats.n_prompt_tokens  # seen between chunks, inside the prefill
        again = m.generate("Name a colour.", cfg, reuse=False)
        assert again.token_ids == short.token_ids and again.text == short.text


# --- two threads on one model --------------------------------------------------------------------------------


def test_two_threads_on_one_model_equal_sequential_runs(tiny_model: Path) -> None:
    prompts = ["w1 w2 w3 w4", "w9 w8 w7", "w5 w5 w5 w5 w5 w5", "w3"]
    cfg = GenerationConfig(max_tokens=16, ignore_eos=True)
    with load(str(tiny_model), n_ctx=256, n_threads=1) as m:
        sequential = {p: m.generate(p, cfg, reuse=False, raw=True).token_ids for p in prompts}
        results: dict[str, list[list[int]]] = {p: [] for p in prompts}
        errors: list[BaseException] = []
        barrier = threading.Barrier(2)

        def worker(mine: list[str]) -> None:
            try:
                barrier.wait()
                for _ in range(3):
                    for p in mine:
                        results[p].append(m.generate(p, cfg, reuse=False, raw=True).token_ids)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(prompts[i::2],)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        for p in prompts:
            assert results[p] == [sequential[p]] * 3, p


def test_two_streams_in_one_thread_do_not_interleave(tiny_model: Path) -> None:
    cfg = GenerationConfig(max_tokens=8, ignore_eos=True)
    with load(str(tiny_model), n_ctx=256, n_threads=1) as m:
        alone = m.generate("w1 w2", cfg, reuse=False, raw=True).text
        first = m.stream("w1 w2", cfg, reuse=False, raw=True)
        head = next(first)
        second = m.stream("w9 w9 w9", cfg, reuse=False, raw=True)
        with pytest.raises(EdgeError, match="already generating"):
            next(second)
        assert head + "".join(first) == alone  # the first stream was not disturbed
        assert m.generate("w1 w2", cfg, reuse=False, raw=True).text == alone


# --- a backend that fails or goes away mid-run ---------------------------------------------------------------


def close_after(dec, n_tokens: int) -> Callable[[], bool]:  # type: ignore[no-untyped-def]
    """A cancel hook (polled once per token) that closes the decoder's backend once n_tokens are out."""
    calls = [0]

    def hook() -> bool:
        calls[0] += 1
        if calls[0] == -(-len(PROMPT) // CHUNK) + n_tokens:
            if isinstance(dec, GraphDecoder):
                dec.runner.close()  # the device is gone; the decoder does not know yet
            else:
                dec.close()
        return False

    return hook


@pytest.mark.parametrize("kind", ["ort", "openvino", "llamacpp"])
def test_device_gone_mid_run_is_a_clear_error_and_a_reload_recovers(
    kind: str,
    tiny_model: Path,
    gguf: GGUFFile,
    tok,
    edge_cache,  # type: ignore[no-untyped-def]
) -> None:
    dec = open_decoder(kind, tiny_model, gguf)
    fresh = run(dec, tok).token_ids
    with pytest.raises(DeviceError, match="closed") as excinfo:
        run(dec, tok, cancel=close_after(dec, 4))
    assert excinfo.value.hint  # what to do about it
    with pytest.raises(DeviceError):  # still a clear error, never a crash (llama.cpp: segfault before)
        dec.reset()
        dec.forward([5])
    again = open_decoder(kind, tiny_model, gguf)  # load it again
    assert run(again, tok).token_ids == fresh


@pytest.mark.parametrize("kind", ["ort", "openvino"])
def test_backend_raising_mid_run_leaves_the_cache_consistent(
    kind: str,
    tiny_model: Path,
    gguf: GGUFFile,
    tok,
    tmp_path: Path,
    edge_cache,  # type: ignore[no-untyped-def]
) -> None:
    """The backend really raises (its session swapped for one of another model: wrong input shapes); the
    step commits nothing, so once the device is back a reset gives the fresh answer again."""
    dec = open_decoder(kind, tiny_model, gguf)
    fresh = run(dec, tok).token_ids
    other_path = write_tiny_model(
        tmp_path / "other.gguf", TinySpec(arch="qwen2", n_embd=32, n_head=2, n_head_kv=1)
    )
    other = GraphDecoder(open_gguf(other_path), GraphOptions(backend=kind, capacity=64, threads=1))
    runner = dec.runner
    saved = dict(vars(runner))
    wrong = {
        k: v for k, v in vars(other.runner).items() if k in ("session", "_binding", "compiled", "request")
    }
    dec.reset()
    dec.forward(PROMPT[:10])
    vars(runner).update(wrong)
    with pytest.raises(DeviceError, match=f"{kind} failed on cpu at position 10") as excinfo:
        dec.forward(PROMPT[10:20])
    assert isinstance(excinfo.value.__cause__, RuntimeError)  # the backend's own error, kept as the cause
    assert dec.position == 10
    vars(runner).update(saved)  # the device is back
    dec.reset()
    assert run(dec, tok).token_ids == fresh


def test_model_closed_mid_generation_then_reloaded(tiny_model: Path) -> None:
    cfg = GenerationConfig(max_tokens=12, ignore_eos=True)
    with load(str(tiny_model), n_ctx=256, n_threads=1) as m:
        fresh = m.generate("w1 w2 w3", cfg, reuse=False, raw=True)
        pieces: list[str] = []

        def on_text(piece: str) -> None:
            pieces.append(piece)
            if len(pieces) == 3:
                m.close()

        with pytest.raises(DeviceError, match="closed"):
            m.generate("w1 w2 w3", cfg, reuse=False, raw=True, on_text=on_text)
        with pytest.raises(DeviceError):
            m.generate("w1 w2 w3", cfg, reuse=False, raw=True)
    with load(str(tiny_model), n_ctx=256, n_threads=1) as m2:
        assert m2.generate("w1 w2 w3", cfg, reuse=False, raw=True).token_ids == fresh.token_ids
