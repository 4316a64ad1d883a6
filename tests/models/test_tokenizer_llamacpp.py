"""edge's tokenizer against llama.cpp's own, on the catalog models and on every supported pre-tokenizer.

llama.cpp (llama-cpp-python, vocab_only) is the reference: ids, detokenized bytes, per-token pieces,
end-of-generation ids and BOS/EOS flags must be equal, over the deterministic corpus of tokenizer_corpus.py.
Each test prints what it compared (counts per model), also without `-s`.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gguf
import llama_cpp  # a dependency of edge (its reference backend), so no skip when it is missing
import numpy as np
import pytest

from edge.models.gguf_file import open_gguf
from edge.models.resolve import resolve_model
from edge.models.tokenizer import Tokenizer, load_tokenizer
from tests.models.tokenizer_corpus import corpus

pytestmark = pytest.mark.slow

CATALOG_MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return corpus()


Say = Callable[[str], None]


@pytest.fixture
def say(capsys: pytest.CaptureFixture[str]) -> Say:
    """Print past pytest's capture: the counts compared are part of the result."""

    def _say(line: str) -> None:
        with capsys.disabled():
            print(line)

    return _say


class Reference:
    """llama.cpp's vocabulary functions for one GGUF file."""

    def __init__(self, path: Path) -> None:
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab

    def encode(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_special, special=parse_special)

    def detokenize(self, ids: Sequence[int], *, special: bool) -> bytes:
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 16 * len(ids)
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, size, False, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n
        raise AssertionError("llama_detokenize kept asking for more room")

    def piece(self, token_id: int, *, special: bool) -> bytes:
        size = 64
        for _ in range(2):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self.vocab, token_id, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n
        raise AssertionError("llama_token_to_piece kept asking for more room")


def _report(name: str, what: str, bad: list[tuple[str, Any, Any]]) -> str:
    lines = [f"{name}: {len(bad)} strings differ on {what}; first ones (text, edge, llama.cpp):"]
    for text, ours, ref in bad[:8]:
        lines += [f"  {text!r:.300}", f"    edge:      {ours!r:.600}", f"    llama.cpp: {ref!r:.600}"]
    return "\n".join(lines)


def _compare(name: str, tok: Tokenizer, ref: Reference, texts: list[str], say: Say) -> None:
    """Every check of edge against llama.cpp on one vocabulary; prints what was compared."""
    started = time.perf_counter()
    checks: dict[str, list[tuple[str, Any, Any]]] = {}
    ref_ids = [ref.encode(t) for t in texts]
    checks["encode"] = [
        (t, ours, r) for t, r in zip(texts, ref_ids, strict=True) if (ours := tok.encode(t)) != r
    ]
    checks["encode(add_special=True)"] = [
        (t, ours, r)
        for t in texts[::3]
        if (ours := tok.encode(t, add_special=True)) != (r := ref.encode(t, add_special=True))
    ]
    checks["encode(parse_special=False)"] = [
        (t, ours, r)
        for t in texts
        if (ours := tok.encode(t, parse_special=False)) != (r := ref.encode(t, parse_special=False))
    ]
    for special in (True, False):
        checks[f"decode(skip_special={not special})"] = [
            (t, ours, r)
            for t, ids in zip(texts, ref_ids, strict=True)
            if (ours := tok.decode_bytes(ids, skip_special=not special))
            != (r := ref.detokenize(ids, special=special))
        ]

    def streamed(ids: list[int]) -> str:
        stream = tok.stream()
        return "".join(stream.push(i) for i in ids) + stream.flush()

    checks["stream == decode"] = [
        (t, s, d)
        for t, ids in zip(texts, ref_ids, strict=True)
        if (s := streamed(ids)) != (d := tok.decode(ids))
    ]
    failures = [_report(name, what, bad) for what, bad in checks.items() if bad]
    n_ids = sum(map(len, ref_ids))
    say(
        f"\n{name}: {len(texts)} strings ({sum(map(len, texts))} chars, {n_ids} ids) compared with llama.cpp: "
        f"encode, encode(parse_special=False), decode x2, stream; {len(texts[::3])} with add_special; "
        f"{sum(len(b) for b in checks.values())} differences ({time.perf_counter() - started:.1f}s)"
    )
    assert not failures, "\n".join(failures)


def _compare_vocab(name: str, tok: Tokenizer, ref: Reference, say: Say) -> None:
    """Per-token pieces, end-of-generation set and the special-token flags over the whole vocabulary."""
    vocab = ref.vocab
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    assert tok.vocab_size == n
    bad = [
        (i, (tok.token_bytes(i), tok.decode_bytes([i], skip_special=True)), (p, q))
        for i in range(n)
        if (tok.token_bytes(i), tok.decode_bytes([i], skip_special=True))
        != (p := ref.piece(i, special=True), q := ref.detokenize([i], special=False))
    ]
    assert not bad, f"{name}: {len(bad)} token pieces differ, first: {bad[:5]}"
    eog = frozenset(i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i))
    assert tok.eog_ids == eog, f"{name}: eog ids {sorted(tok.eog_ids)} != llama.cpp's {sorted(eog)}"

    def null(i: int) -> int | None:
        return None if i < 0 else i

    assert tok.bos_id == null(llama_cpp.llama_vocab_bos(vocab))
    assert tok.eos_id == null(llama_cpp.llama_vocab_eos(vocab))
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(vocab)
    assert tok.add_eos == llama_cpp.llama_vocab_get_add_eos(vocab)
    say(f"{name}: {n} token pieces, {len(eog)} end-of-generation ids and the BOS/EOS flags equal")


@pytest.mark.parametrize("name", CATALOG_MODELS)
def test_catalog_model_matches_llamacpp(name: str, texts: list[str], say: Say) -> None:
    path = resolve_model(name)
    started = time.perf_counter()
    tok = load_tokenizer(open_gguf(path).metadata)
    say(f"\n{name}: tokenizer built in {time.perf_counter() - started:.2f}s")
    ref = Reference(path)
    _compare(name, tok, ref, texts, say)
    _compare_vocab(name, tok, ref, say)


# ---- every supported pre-tokenizer, on a real vocabulary ------------------------------------------------

# One name per llama.cpp pre-tokenizer type and flag combination that models/tokenizer.py ports.
PRE_NAMES = [
    "default",
    "llama-bpe",
    "dbrx",
    "chatglm-bpe",
    "glm4",
    "qwen2",
    "stablelm2",
    "gpt-2",
    "trillion",
    "starcoder",
    "command-r",
    "falcon",
    "deepseek-llm",
    "deepseek-coder",
    "bloom",
    "poro-chat",
    "viking",
    "gpt-4o",  # Phi-4-mini (arch phi3)
]


def _write_vocab_gguf(path: Path, metadata: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A tensor-less GGUF with `metadata` (a llama model's) changed by `overrides`; llama.cpp loads its vocab."""
    meta = {**metadata, **overrides}
    writer = gguf.GGUFWriter(str(path), str(meta["general.architecture"]))
    for key, value in meta.items():
        if key == "general.architecture" or value is None:
            continue
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        elif isinstance(value, np.ndarray) and value.dtype.kind in "iu":
            sub = gguf.GGUFValueType.INT32
            writer.add_key_value(key, value.astype(np.int32).tolist(), gguf.GGUFValueType.ARRAY, sub_type=sub)
        elif isinstance(value, np.ndarray):
            sub = gguf.GGUFValueType.FLOAT32
            writer.add_key_value(
                key, value.astype(np.float32).tolist(), gguf.GGUFValueType.ARRAY, sub_type=sub
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {k: v for k, v in meta.items() if v is not None}


@pytest.fixture(scope="module")
def smollm_metadata() -> dict[str, Any]:
    return dict(open_gguf(resolve_model("smollm2-135m")).metadata)


@pytest.fixture(scope="module")
def gemma_metadata() -> dict[str, Any]:
    return dict(open_gguf(resolve_model("gemma3-270m")).metadata)


@pytest.mark.parametrize("pre", PRE_NAMES)
def test_pre_tokenizer_matches_llamacpp(
    pre: str, smollm_metadata: dict[str, Any], texts: list[str], tmp_path: Path, say: Say
) -> None:
    """SmolLM2's BPE vocabulary and merges under each pre-tokenizer type (regexes, clean_spaces, flags)."""
    vocab_file = tmp_path / "vocab.gguf"
    meta = _write_vocab_gguf(
        vocab_file, smollm_metadata, {"tokenizer.ggml.pre": pre, "tokenizer.ggml.add_bos_token": None}
    )
    tok = load_tokenizer(meta)
    ref = Reference(vocab_file)
    _compare(f"pre={pre}", tok, ref, texts[::3], say)
    assert tok.add_bos == llama_cpp.llama_vocab_get_add_bos(ref.vocab)
    assert tok.bos_id == (None if (b := llama_cpp.llama_vocab_bos(ref.vocab)) < 0 else b)


def test_spm_space_prefix_matches_llamacpp(
    gemma_metadata: dict[str, Any], texts: list[str], tmp_path: Path, say: Say
) -> None:
    """Gemma's vocabulary with add_space_prefix on: a space goes before the text and after each special token."""
    vocab_file = tmp_path / "vocab.gguf"
    meta = _write_vocab_gguf(vocab_file, gemma_metadata, {"tokenizer.ggml.add_space_prefix": True})
    tok = load_tokenizer(meta)
    assert tok.add_space_prefix
    _compare("gemma3 vocab, add_space_prefix", tok, Reference(vocab_file), texts[::3], say)


# The strings whose ids test_tokenizer.py works out by hand.
HAND_WORKED = [
    "hello world", "user\nhello", "héllo", "<|im_start|>user\nhello<|im_end|>", "<|im_start|>", "<tool>hello",
    "xyzw", "xy", "a\u1f00", "a\U000105c0", "./", ".\x14/", "<|im_end|>", "aba", "bab", "hi😀", "hello</s>hello",
    "hello", "é", "a",
]  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "pre"),
    [("bpe", "gpt-2"), ("bpe", "qwen2"), ("bpe", "llama-bpe"), ("bpe", "starcoder"), ("bpe", "default"),
     ("spm", None), ("spm", "no space prefix"), ("barrier", "gpt-2")],
)  # fmt: skip
def test_tiny_vocabulary_matches_llamacpp(
    kind: str, pre: str | None, smollm_metadata: dict[str, Any], texts: list[str], tmp_path: Path, say: Say
) -> None:
    """The hand-made vocabularies of test_tokenizer.py, whose odd corners (characters without a token,
    merges across Unicode classes, overlapping user-defined tokens, a normal-typed <|im_end|>, unused
    tokens, byte fallback, score ties) a real vocabulary rarely reaches, checked by llama.cpp itself."""
    from tests.models.test_tokenizer import BARRIER_META, tiny_bpe_meta, tiny_spm_meta

    if kind == "bpe":
        tiny = tiny_bpe_meta(pre=str(pre))
    elif kind == "barrier":
        tiny = BARRIER_META
    else:
        tiny = tiny_spm_meta(**({"tokenizer.ggml.add_space_prefix": False} if pre else {}))
    hparams = {k: v for k, v in smollm_metadata.items() if not k.startswith("tokenizer.")}
    vocab_file = tmp_path / "tiny.gguf"
    meta = _write_vocab_gguf(vocab_file, hparams, tiny)
    tok = load_tokenizer(meta)
    ref = Reference(vocab_file)
    name = f"tiny {kind} vocabulary ({pre or 'default flags'})"
    _compare(name, tok, ref, [*HAND_WORKED, *texts[::3]], say)
    _compare_vocab(name, tok, ref, say)
