"""Hostile and broken model files through the whole load path (`edge.model.load`, the CLI, the graph engine).

tests/models/test_gguf_hostile.py and test_gguf_fuzz.py hold the reader's own cases on crafted files; here
a real (tiny) model is cut, patched and rewritten with lying metadata, and each file must end in a typed
error (ModelFormatError, TokenizerError, InsufficientMemoryError) before llama.cpp or a graph compiler sees
it: never a crash, an abort, a hang or a bare exception.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V

from edge.api import load
from edge.devices.memory import llamacpp_memory
from edge.errors import EdgeError, InsufficientMemoryError, ModelFormatError, TokenizerError
from edge.generate import GenerationConfig
from edge.models.gguf_file import open_gguf
from edge.models.tokenizer import Tokenizer, load_tokenizer
from tests.gguf_factory import craft_gguf, pack_kv, pack_string, pack_tensor_info
from tests.models.test_tokenizer import tiny_bpe_meta
from tests.reliability.conftest import assert_one_line_error, cli
from tests.reliability.ggufs import DROP, rewrite_gguf, section_cuts

LOAD: dict[str, Any] = {"n_ctx": 64, "n_threads": 1}  # edge.load's keywords
MAX_SECONDS = 1.0
N_VOCAB = 320  # tests/tiny_models.py


def load_fails(path: Path, error: type[EdgeError] = ModelFormatError, **options: Any) -> EdgeError:
    """`options`: edge.load keywords over LOAD's."""
    start = time.perf_counter()
    with pytest.raises(error) as excinfo:
        load(str(path), **{**LOAD, **options})
    assert time.perf_counter() - start < MAX_SECONDS
    return excinfo.value


def test_the_whole_tiny_model_loads_and_runs(tiny_model: Path) -> None:
    with load(str(tiny_model), **LOAD) as m:
        assert m.generate("w1 w2", GenerationConfig(max_tokens=2), reuse=False, raw=True).stats.n_tokens >= 1


# --- truncation at every section boundary ---------------------------------------------------------------


def test_model_cut_at_every_section_boundary_fails_cleanly(tiny_model: Path, tmp_path: Path) -> None:
    raw, cuts = tiny_model.read_bytes(), section_cuts(tiny_model)
    assert len(cuts) > 150  # header fields, 20 metadata pairs, 20 tensor records, padding, 20 data ranges
    path = tmp_path / "cut.gguf"
    for where, n in cuts.items():
        path.write_bytes(raw[:n])
        err = load_fails(path)
        assert str(path) in err.message and err.hint, where


@pytest.mark.parametrize(
    "where", ["header-16", "kv-tokenizer.ggml.tokens-last-byte", "data-output.weight-start"]
)
def test_cut_model_is_one_clear_line_in_the_cli(where: str, tiny_model: Path, tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_model.read_bytes()[: section_cuts(tiny_model)[where]])
    assert_one_line_error(cli("run", str(path), "hi", "--max-tokens", "1"), "cut.gguf")


# --- counts and lengths beyond the file -----------------------------------------------------------------


def _u64_offsets(path: Path) -> dict[str, int]:
    """Byte offsets of u64 fields of the tiny model worth lying in."""
    reader = gguf.GGUFReader(path)

    def part_offset(field: gguf.ReaderField, index: int) -> int:
        return field.offset + sum(int(p.nbytes) for p in field.parts[:index])

    tokens = reader.fields["tokenizer.ggml.tokens"]
    arch = reader.fields["general.architecture"]
    emb = next(t for t in reader.tensors if t.name == "token_embd.weight")
    return {
        "n_tensors": 8,
        "n_kv": 16,
        "key-length": arch.offset,
        "string-value-length": part_offset(arch, 3),
        "tokens-array-count": part_offset(tokens, 4),
        "token-string-length": part_offset(tokens, 5 + 2 * 100),
        "tensor-dim": part_offset(emb.field, 3),
        "tensor-offset": part_offset(emb.field, 5),
    }


@pytest.mark.parametrize("value", [2**40, 2**63, 2**64 - 1])
@pytest.mark.parametrize(
    "field",
    [
        "n_tensors",
        "n_kv",
        "key-length",
        "string-value-length",
        "tokens-array-count",
        "token-string-length",
        "tensor-dim",
        "tensor-offset",
    ],
)
def test_counts_and_lengths_beyond_the_file(field: str, value: int, tiny_model: Path, tmp_path: Path) -> None:
    data = bytearray(tiny_model.read_bytes())
    at = _u64_offsets(tiny_model)[field]
    data[at : at + 8] = struct.pack("<Q", value)
    path = tmp_path / "lying.gguf"
    path.write_bytes(data)
    load_fails(path)


def test_lying_count_is_one_clear_line(tiny_model: Path, tmp_path: Path) -> None:
    data = bytearray(tiny_model.read_bytes())
    at = _u64_offsets(tiny_model)["tokens-array-count"]
    data[at : at + 8] = struct.pack("<Q", 2**62)
    path = tmp_path / "lying.gguf"
    path.write_bytes(data)
    assert_one_line_error(cli("tokenize", str(path), "hi"), "lying.gguf")


# --- tokenizer metadata that lies -------------------------------------------------------------------------

BYTE_TOKENS = [f"<0x{i:02X}>" for i in range(256)]
WORDS = [f"\u2581w{i}" for i in range(N_VOCAB - 259)]
SPM_TOKENS = ["<unk>", "<s>", "</s>", *BYTE_TOKENS, *WORDS]
SPM_TYPES = [2, 3, 3] + [6] * 256 + [1] * len(WORDS)


def tokens(values: list[str] | list[bytes]) -> tuple[list[str] | list[bytes], V, V]:
    return (values, V.ARRAY, V.STRING)


# overrides of the tiny model's metadata that must be refused with TokenizerError
REFUSED: dict[str, dict[str, object]] = {
    "scores-are-strings": {"tokenizer.ggml.scores": (["0.5"] * N_VOCAB, V.ARRAY, V.STRING)},
    "scores-are-a-string": {"tokenizer.ggml.scores": ("0.5", V.STRING)},
    "scores-are-bools": {"tokenizer.ggml.scores": ([True] * N_VOCAB, V.ARRAY, V.BOOL)},
    "scores-too-short": {"tokenizer.ggml.scores": ([0.0] * (N_VOCAB - 1), V.ARRAY, V.FLOAT32)},
    "scores-nested": {"tokenizer.ggml.scores": ([[0.0]] * N_VOCAB, V.ARRAY, V.ARRAY)},
    "bos-beyond-vocab": {"tokenizer.ggml.bos_token_id": N_VOCAB},
    "eos-u32-max": {"tokenizer.ggml.eos_token_id": 2**32 - 1},
    "unk-negative": {"tokenizer.ggml.unknown_token_id": (-1, V.INT32)},
    "pad-u64-huge": {"tokenizer.ggml.padding_token_id": (2**63, V.UINT64)},
    "eot-is-a-string": {"tokenizer.ggml.eot_token_id": ("2", V.STRING)},
    "bos-is-a-float": {"tokenizer.ggml.bos_token_id": (1.0, V.FLOAT32)},
    "eos-is-a-bool": {"tokenizer.ggml.eos_token_id": (True, V.BOOL)},
    "token-type-too-short": {"tokenizer.ggml.token_type": (SPM_TYPES[:-1], V.ARRAY, V.INT32)},
    "token-type-floats": {"tokenizer.ggml.token_type": ([1.0] * N_VOCAB, V.ARRAY, V.FLOAT32)},
    "token-type-strings": {"tokenizer.ggml.token_type": (["1"] * N_VOCAB, V.ARRAY, V.STRING)},
    "tokens-not-strings": {"tokenizer.ggml.tokens": (list(range(N_VOCAB)), V.ARRAY, V.INT32)},
    "tokens-duplicated": {"tokenizer.ggml.tokens": tokens([*SPM_TOKENS[:-1], SPM_TOKENS[-2]])},
    "tokens-missing": {"tokenizer.ggml.tokens": DROP},
    "model-unknown": {"tokenizer.ggml.model": "bert"},
    "model-is-an-int": {"tokenizer.ggml.model": (1, V.UINT32)},
    "add-bos-is-an-int": {"tokenizer.ggml.add_bos_token": (1, V.UINT8)},
}

# lies llama.cpp tolerates; the tokenizer must build and then encode, decode and stream every id
TOLERATED: dict[str, dict[str, object]] = {
    "malformed-byte-tokens": {
        "tokenizer.ggml.tokens": tokens(
            [
                "<unk>",
                "<s>",
                "</s>",
                "<0xZZ>",
                "<0x",
                "<0x-1>",
                "<0xFFFF>",
                "<0x>",
                "<0x+F>",
                *BYTE_TOKENS[6:],
                *WORDS,
            ]
        )
    },
    "token-type-longer-than-vocab": {"tokenizer.ggml.token_type": ([*SPM_TYPES, 1, 1, 1], V.ARRAY, V.INT32)},
    "token-types-out-of-range": {"tokenizer.ggml.token_type": ([99, -1, 7] * 107)[:N_VOCAB]},
    "scores-nan-and-inf": {
        "tokenizer.ggml.scores": ([float("nan"), float("inf"), float("-inf")] * 107)[:N_VOCAB]
    },
    "tokens-with-invalid-utf8": {
        "tokenizer.ggml.tokens": tokens(
            [t.encode() for t in SPM_TOKENS[:-3]] + [b"\xff\xfe", b"\xe6\x97", b"\xf0\x9f\x91"]
        )
    },
}


def _typed(overrides: dict[str, object]) -> dict[str, object]:
    """Plain lists keep the original key's array type (rewrite_gguf needs value, type, item type)."""
    out: dict[str, object] = {}
    for k, v in overrides.items():
        if isinstance(v, list):
            item = V.FLOAT32 if isinstance(v[0], float) else V.INT32
            out[k] = (v, V.ARRAY, item)
        else:
            out[k] = v
    return out


def exercise(tok: Tokenizer) -> None:
    for text in ("hello w1 world", "日本 🤖 \u2028 é", "<s></s><unk>", ""):
        ids = tok.encode(text)
        assert all(0 <= i < tok.vocab_size for i in ids)
    everything = list(range(tok.vocab_size))
    assert isinstance(tok.decode(everything), str)
    stream = tok.stream()
    streamed = "".join(stream.push(i) for i in everything) + stream.flush()
    assert streamed == tok.decode(everything)


@pytest.mark.parametrize("case", list(REFUSED))
def test_lying_tokenizer_metadata_is_refused(case: str, tiny_model: Path, tmp_path: Path) -> None:
    path = rewrite_gguf(tiny_model, tmp_path / f"{case}.gguf", _typed(REFUSED[case]))
    with pytest.raises(TokenizerError):
        load_tokenizer(open_gguf(path).metadata)


@pytest.mark.parametrize("case", ["tokens-duplicated", "bos-beyond-vocab", "token-type-too-short"])
def test_lying_tokenizer_is_refused_before_llama_cpp_reads_it(
    case: str, tiny_model: Path, tmp_path: Path
) -> None:
    # llama.cpp aborts the process (GGML_ASSERT) on a vocabulary with the same text twice: the CLI must give
    # one clear line instead, with exit status 1 (a subprocess, so an abort cannot take the test run down)
    path = rewrite_gguf(tiny_model, tmp_path / f"{case}.gguf", _typed(REFUSED[case]))
    assert_one_line_error(
        cli("run", str(path), "hi", "--max-tokens", "1", "--ctx-size", "64"), "tokenizer.ggml"
    )


@pytest.mark.parametrize("case", list(TOLERATED))
def test_tolerated_tokenizer_lies_still_tokenize(case: str, tiny_model: Path, tmp_path: Path) -> None:
    path = rewrite_gguf(tiny_model, tmp_path / f"{case}.gguf", _typed(TOLERATED[case]))
    exercise(load_tokenizer(open_gguf(path).metadata))


def test_raw_bytes_of_invalid_utf8_tokens_are_kept(tiny_model: Path, tmp_path: Path) -> None:
    path = rewrite_gguf(tiny_model, tmp_path / "bytes.gguf", _typed(TOLERATED["tokens-with-invalid-utf8"]))
    tok = load_tokenizer(open_gguf(path).metadata)
    assert tok.token_bytes(N_VOCAB - 3) == b"\xff\xfe"
    assert tok.decode_bytes([N_VOCAB - 2, N_VOCAB - 1]) == b"\xe6\x97\xf0\x9f\x91"


def test_malformed_byte_tokens_decode_as_llama_cpp_does(tiny_model: Path, tmp_path: Path) -> None:
    path = rewrite_gguf(tiny_model, tmp_path / "bytes.gguf", _typed(TOLERATED["malformed-byte-tokens"]))
    tok = load_tokenizer(open_gguf(path).metadata)
    # (uint8_t) strtol(text.substr(3, 2), NULL, 16): no hex digits give 0, "-1" gives 0xFF, "+F" 15
    assert [tok.token_bytes(i) for i in range(3, 9)] == [b"\0", b"\0", b"\xff", b"\xff", b"\0", b"\x0f"]


# BPE vocabularies (merges): a metadata-only GGUF per case, through the reader and the CLI


def write_meta_gguf(path: Path, meta: dict[str, object]) -> Path:
    w = gguf.GGUFWriter(path, "llama")
    for key, value in meta.items():
        if isinstance(value, str):
            w.add_key_value(key, value, V.STRING)
        elif isinstance(value, bool):
            w.add_key_value(key, value, V.BOOL)
        elif isinstance(value, int):
            w.add_key_value(key, value, V.UINT32)
        elif isinstance(value, np.ndarray):
            w.add_key_value(key, value.tolist(), V.ARRAY, V.INT32)
        elif isinstance(value, list) and value and not isinstance(value[0], (str, bytes)):
            w.add_key_value(key, value, V.ARRAY, V.INT32)
        else:
            w.add_key_value(key, value, V.ARRAY, V.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


MERGES = list(tiny_bpe_meta()["tokenizer.ggml.merges"])  # type: ignore[call-overload]
BPE_REFUSED: dict[str, dict[str, object]] = {
    "merge-of-three": {"tokenizer.ggml.merges": [*MERGES, "h e l"]},
    "merge-of-unknown-text": {"tokenizer.ggml.merges": [*MERGES, "qq zz"]},
    "merges-are-ints": {"tokenizer.ggml.merges": [1, 2, 3]},
    "merges-missing": {"tokenizer.ggml.merges": None},
    "tokens-invalid-utf8": {
        "tokenizer.ggml.tokens": [*tiny_bpe_meta()["tokenizer.ggml.tokens"][:-1], b"\xff"]
    },  # type: ignore[misc]
    "pre-unknown": {"tokenizer.ggml.pre": "../../etc/passwd"},
}


@pytest.mark.parametrize("case", list(BPE_REFUSED))
def test_lying_bpe_metadata_is_refused(case: str, tmp_path: Path) -> None:
    path = write_meta_gguf(tmp_path / f"{case}.gguf", tiny_bpe_meta(**BPE_REFUSED[case]))
    with pytest.raises(TokenizerError):
        load_tokenizer(open_gguf(path).metadata)


def test_lying_bpe_metadata_is_one_clear_line(tmp_path: Path) -> None:
    path = write_meta_gguf(tmp_path / "three.gguf", tiny_bpe_meta(**BPE_REFUSED["merge-of-three"]))
    assert_one_line_error(cli("tokenize", str(path), "hello", "--json"), "merge 'h e l'")


def test_merge_without_a_space_is_ignored_like_llama_cpp(tmp_path: Path) -> None:
    # llama.cpp splits at the first space after the first character; with none the pair can never match
    plain = load_tokenizer(open_gguf(write_meta_gguf(tmp_path / "a.gguf", tiny_bpe_meta())).metadata)
    odd = tiny_bpe_meta(**{"tokenizer.ggml.merges": [*MERGES, "hello", " ", ""]})
    tok = load_tokenizer(open_gguf(write_meta_gguf(tmp_path / "b.gguf", odd)).metadata)
    for text in ("hello world", "hellohello", " h e"):
        assert tok.encode(text) == plain.encode(text)


# --- shapes that overflow, hyper-parameters that lie -------------------------------------------------------


def test_tensor_shape_whose_size_overflows(tmp_path: Path) -> None:
    info = pack_tensor_info("token_embd.weight", (2**32, 2**32), 0, 0)
    path = tmp_path / "overflow.gguf"
    path.write_bytes(
        craft_gguf([pack_kv("general.architecture", 8, pack_string("llama"))], [info], b"\0" * 64)
    )
    assert "overflows" in load_fails(path).message


# metadata that disagrees with the tensors: the graph engine and llama.cpp must both refuse it cleanly
LYING_HPARAMS: dict[str, dict[str, object]] = {
    "embedding-length-65": {"llama.embedding_length": 65},
    "embedding-length-2^31": {"llama.embedding_length": 2**31},
    "heads-2^20": {"llama.attention.head_count": 2**20, "llama.attention.head_count_kv": 2**20},
    "feed-forward-129": {"llama.feed_forward_length": 129},
    "block-count-2^31": {
        "llama.block_count": 2**31
    },  # the graph engine allocated per layer; llama.cpp aborted
    "kv-heads-per-layer-array": {"llama.attention.head_count_kv": ([2, 2], V.ARRAY, V.UINT32)},
}


@pytest.mark.parametrize("case", list(LYING_HPARAMS))
def test_lying_hyper_parameters_in_the_graph_engine(
    case: str, tiny_model: Path, tmp_path: Path, graph_cache: Path
) -> None:
    from edge.devices.graph_decoder import GraphDecoder, GraphOptions

    path = rewrite_gguf(tiny_model, tmp_path / f"{case}.gguf", LYING_HPARAMS[case])
    start = time.perf_counter()
    with pytest.raises(ModelFormatError):
        GraphDecoder(open_gguf(path), GraphOptions(capacity=64, threads=1))
    assert time.perf_counter() - start < MAX_SECONDS


@pytest.mark.parametrize(
    ("case", "needle"),
    [("block-count-2^31", "block_count"), ("embedding-length-65", "embedding-length-65.gguf")],
)
def test_lying_hyper_parameters_in_the_cli(case: str, needle: str, tiny_model: Path, tmp_path: Path) -> None:
    path = rewrite_gguf(tiny_model, tmp_path / f"{case}.gguf", LYING_HPARAMS[case])
    assert_one_line_error(cli("run", str(path), "hi", "--max-tokens", "1", "--ctx-size", "64"), needle)


# --- a model larger than free memory ----------------------------------------------------------------------


def test_model_larger_than_available_memory_fails_fast(tiny_model: Path) -> None:
    err = load_fails(tiny_model, InsufficientMemoryError, n_ctx=64, available_memory=1 << 20)
    assert isinstance(err, InsufficientMemoryError)
    assert err.available == 1 << 20 and err.needed > err.available
    assert "MiB of memory" in err.message and "but 1 MiB is available" in err.message
    need = llamacpp_memory(open_gguf(tiny_model), 64)
    assert need.weights == sum(t.nbytes for t in open_gguf(tiny_model).tensors.values())
    # sized as llama.cpp sizes it (the graphs' f32 ring is sized by graph_memory)
    with load(str(tiny_model), backend="llamacpp", n_ctx=64, n_threads=1, available_memory=need.total) as m:
        assert m.decoder.n_ctx >= 64  # exactly enough is enough


def test_kv_cache_counts_toward_the_need(tiny_model: Path) -> None:
    g = open_gguf(tiny_model)
    small, big = llamacpp_memory(g, 64), llamacpp_memory(g, 1 << 20)
    # 2 layers x 2 KV heads x (16 + 16) dims x 2 bytes per token; llama.cpp pads 64 to 256 tokens
    assert big.kv_cache - small.kv_cache == ((1 << 20) - 256) * 2 * 2 * 2 * 32
    with pytest.raises(InsufficientMemoryError, match="KV cache for 1048576 tokens"):
        load(str(tiny_model), backend="llamacpp", n_ctx=1 << 20, available_memory=big.total - 1)


def _pack_value(key: str, value: Any) -> bytes:
    """One metadata pair of a string, an integer (u32) or an array of strings or int32s."""
    if isinstance(value, str):
        return pack_kv(key, V.STRING, pack_string(value))
    if isinstance(value, int):
        return pack_kv(key, V.UINT32, struct.pack("<I", value))
    items = list(value)
    if all(isinstance(v, str) for v in items):
        body = b"".join(pack_string(v) for v in items)
        return pack_kv(key, V.ARRAY, struct.pack("<IQ", V.STRING, len(items)) + body)
    body = np.asarray(items, dtype="<i4").tobytes()
    return pack_kv(key, V.ARRAY, struct.pack("<IQ", V.INT32, len(items)) + body)


@pytest.fixture
def sparse_2tib_model(tmp_path: Path) -> Path:
    """A valid GGUF whose one tensor holds 2 TiB of (sparse, unwritten) data."""
    n = 2**39  # F32 elements
    # a real tokenizer: the file passes every check of the way in (models/checked.py) but the memory one
    tokenizer = [_pack_value(k, v) for k, v in tiny_bpe_meta().items()]
    head = craft_gguf(
        [pack_kv("general.architecture", 8, pack_string("llama")), *tokenizer],
        [pack_tensor_info("token_embd.weight", (n,), 0, 0)],
    )
    path = tmp_path / "huge.gguf"
    try:
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(len(head) + 4 * n)
    except OSError as exc:  # a file system without sparse files or without 2 TiB files
        pytest.skip(f"cannot make a sparse 2 TiB file here: {exc}")
    return path


def test_model_larger_than_free_memory_without_an_override(sparse_2tib_model: Path) -> None:
    err = load_fails(sparse_2tib_model, InsufficientMemoryError, n_ctx=4096, n_threads=None)
    assert isinstance(err, InsufficientMemoryError) and err.needed > 2**41 > err.available
    assert_one_line_error(
        cli("run", str(sparse_2tib_model), "hi"), "huge.gguf needs about", "MiB is available"
    )
