"""Embeddings from edge's own encoder graphs against a float64 numpy forward of the same weights: tiny random
sentence-transformers folders written here, and the real all-minilm-l6-v2 (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import edge
from edge.errors import ContextOverflowError, ModelFormatError, TokenizerError
from tests.encoder_reference import cosine, reference_embedding, write_tiny_folder

TINY_TEXTS = ["the cat sat on the mat", "a dog", "cats run", "the", "", "dogs sat on a cat on a mat"]
EXACT = 0.99999
FAST = 0.999


@pytest.fixture(scope="module", params=["mean", "cls", "max"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_folder(tmp_path_factory.mktemp("enc") / request.param, pooling=request.param, seed=3)


@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_tiny_folder_equals_the_float64_forward(tiny: Path, backend: str) -> None:
    """Inputs of different lengths share a padded forward; each must equal its own unpadded reference."""
    with edge.load_embedder(tiny, backend=backend, precision="exact", n_threads=1) as m:
        vectors = m.embed(TINY_TEXTS)
        seqs = m.tokenize(TINY_TEXTS)
        assert vectors.shape == (len(TINY_TEXTS), m.dim)
        for v, ids in zip(vectors, seqs, strict=True):
            assert cosine(v, reference_embedding(m.folder, ids)) >= EXACT
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # 2_Normalize declared
        # one input alone gives what it gave inside the padded group
        assert cosine(m.embed(TINY_TEXTS[0])[0], vectors[0]) >= EXACT


def test_token_ids_get_what_text_gets_and_bad_input_is_refused(tmp_path: Path) -> None:
    folder = write_tiny_folder(tmp_path / "t")
    with edge.load_embedder(folder, precision="exact", n_threads=1) as m:
        plain = m.folder.tokenizer.encode("the cat sat", add_special_tokens=False).ids
        assert m.wrap_ids([plain]) == m.tokenize(["the cat sat"])
        with pytest.raises(TokenizerError, match=r"token id 99 is outside the vocabulary \(0\.\.13\)"):
            m.wrap_ids([[5, 99]])
        long = " ".join(["cat"] * 20)  # 22 tokens with [CLS]/[SEP]; the folder declares 16
        with pytest.raises(ContextOverflowError, match=r"input 0 has 22 tokens; .* at most 16"):
            m.embed(long)
        cut = m.tokenize([long], truncate=True)[0]
        assert len(cut) == 16 and cut[-1] == 3  # [SEP] kept
        assert m.embed(long, truncate=True).shape == (1, m.dim)


def test_a_chat_model_is_not_an_embedder_and_back() -> None:
    with pytest.raises(ModelFormatError, match="smollm2-135m is a chat model"):
        edge.load_embedder("smollm2-135m")
    with pytest.raises(ModelFormatError, match="all-minilm-l6-v2 is an embedding model"):
        edge.load("all-minilm")


def test_edge_embed_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from edge.cli import main

    folder = write_tiny_folder(tmp_path / "t")
    assert main(["embed", str(folder), "the cat", "a dog", "--json", "--precision", "exact"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dim"] == 32 and out["n_tokens"] == [4, 4] and len(out["embeddings"]) == 2
    monkeypatch.setattr("sys.stdin", io.StringIO("the cat\n\na dog\n"))
    assert main(["embed", str(folder), "--precision", "exact"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2  # the empty line is skipped
    assert np.allclose([float(x) for x in lines[0].split()], out["embeddings"][0], atol=1e-5)


# -- the real model ------------------------------------------------------------------------------------
TEXTS = [
    "The cat sits on the mat.",
    "Le chat est assis sur le tapis.",
    "Die Katze sitzt auf der Matte.",
    "猫がマットの上に座っている。",
    "def add(a: int, b: int) -> int:\n    return a + b",
    "SELECT name FROM users WHERE id = 42;",
    "I love pizza 🍕🔥 and tacos 🌮",
    "¿Dónde está la biblioteca?",
    "Quantum computers use qubits instead of bits.",
    "x",
]
DOCS = [
    "Python functions are defined with the def keyword.",
    "Paris is the capital of France.",
    "Cats are small domesticated carnivorous mammals.",
    "The stock market fell sharply on Monday.",
    "Photosynthesis turns light into chemical energy in plants.",
]
QUERIES = [
    "how do I write a function in python",
    "what is the capital city of france",
    "tell me about kittens",
]


@pytest.fixture(scope="module")
def minilm_exact() -> edge.EmbeddingModel:
    return edge.load_embedder("all-minilm", precision="exact", n_threads=2)


@pytest.fixture(scope="module")
def minilm_refs(minilm_exact: edge.EmbeddingModel) -> np.ndarray:
    return np.array([reference_embedding(minilm_exact.folder, ids) for ids in minilm_exact.tokenize(TEXTS)])


@pytest.mark.slow
def test_real_model_equals_the_float64_forward(
    minilm_exact: edge.EmbeddingModel, minilm_refs: np.ndarray
) -> None:
    m = minilm_exact
    assert (m.dim, m.max_tokens, m.pooling, m.normalized) == (384, 256, "mean", True)  # read from its files
    worst = min(cosine(v, r) for v, r in zip(m.embed(TEXTS), minilm_refs, strict=True))
    assert worst >= EXACT, worst


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_real_model_fast_on_each_backend(minilm_refs: np.ndarray, backend: str) -> None:
    with edge.load_embedder("all-minilm-l6-v2", backend=backend, precision="fast", n_threads=2) as fast:
        worst = min(cosine(v, r) for v, r in zip(fast.embed(TEXTS), minilm_refs, strict=True))
    assert worst >= FAST, worst


@pytest.mark.slow
def test_real_model_ranks_as_the_reference(minilm_exact: edge.EmbeddingModel) -> None:
    m = minilm_exact
    docs, queries = m.embed(DOCS), m.embed(QUERIES)
    ref_docs = np.array([reference_embedding(m.folder, ids) for ids in m.tokenize(DOCS)])
    ref_q = np.array([reference_embedding(m.folder, ids) for ids in m.tokenize(QUERIES)])
    ours = np.argsort(-(queries @ docs.T), axis=1)
    theirs = np.argsort(-(ref_q @ ref_docs.T), axis=1)
    assert (ours == theirs).all()
    assert list(ours[:, 0]) == [0, 1, 2]  # and the ranking is the sensible one


def test_bench_embed_measures_each_backend(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp")
    from edge.bench_embed import run_embed_bench

    folder = write_tiny_folder(tmp_path / "t")
    results = run_embed_bench(str(folder), ("ort", "openvino", "llamacpp"), sentences=16, threads=1, repeat=1)
    assert [r.backend for r in results] == ["ort", "openvino", "llamacpp"]
    for r in results:
        assert r.sentences_s > 0 and r.tokens_s > r.sentences_s and r.query_ms > 0 and r.load_s >= 0
