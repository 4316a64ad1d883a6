"""Tiny random BERT folders written as GGUF the way llama.cpp's converter writes them (gguf's writer and its
tensor name map): llama.cpp's embeddings of the GGUF equal edge's of the folder, token for token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edge
from edge.models.bert_gguf import write_bert_gguf
from tests.encoder_reference import cosine, write_tiny_folder

TEXTS = ["the cat sat on the mat", "a dog", "cats run", "the dog sat on a cat"]


@pytest.mark.parametrize(("pooling", "dtype", "floor"), [("mean", "f32", 0.99999), ("cls", "f16", 0.999)])
def test_llamacpp_on_the_gguf_equals_edge_on_the_folder(
    tmp_path: Path, pooling: str, dtype: str, floor: float
) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    folder = write_tiny_folder(tmp_path / "t", pooling=pooling, seed=5)
    with edge.load_embedder(folder, precision="exact", n_threads=1) as m:
        ours, seqs = m.embed(TEXTS), m.tokenize(TEXTS)
        path = write_bert_gguf(m.folder, tmp_path / "t.gguf", dtype=dtype)
    llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=64, n_threads=1, verbose=False)
    try:
        for text, ids, vec in zip(TEXTS, seqs, ours, strict=True):
            assert llm.tokenize(text.encode()) == ids  # the phantom-space vocabulary tokenizes alike
            theirs = np.array(llm.embed(text, normalize=True))
            assert cosine(theirs, vec) >= floor, text
    finally:
        llm.close()


@pytest.mark.parametrize(("dtype", "floor"), [("f32", 0.99999), ("f16", 0.999), ("q8_0", 0.99)])
def test_edge_on_the_gguf_equals_edge_on_the_folder(tmp_path: Path, dtype: str, floor: float) -> None:
    folder = write_tiny_folder(tmp_path / "t", seed=7)
    with edge.load_embedder(folder, precision="exact", n_threads=1) as m:
        ours, seqs = m.embed(TEXTS), m.tokenize(TEXTS)
        path = write_bert_gguf(m.folder, tmp_path / f"t-{dtype}.gguf", dtype=dtype)
    with edge.load_embedder(path, precision="exact", n_threads=1) as g:
        assert g.name == path.name and g.pooling == "mean" and g.normalized
        assert g.tokenize(TEXTS) == seqs  # the phantom-space vocabulary back as WordPiece
        for a, b in zip(g.embed(TEXTS), ours, strict=True):
            assert cosine(a, b) >= floor


def test_a_chat_gguf_is_not_an_embedder(tmp_path: Path) -> None:
    from edge.errors import ModelFormatError
    from tests.tiny_models import TinySpec, write_tiny_model

    path = write_tiny_model(tmp_path / "chat.gguf", TinySpec())
    with pytest.raises(ModelFormatError, match="architecture 'llama' is not an encoder"):
        edge.load_embedder(path)


@pytest.mark.slow
def test_real_model_as_gguf_f16_equals_the_folder(tmp_path: Path) -> None:
    texts = [
        "The cat sits on the mat.",
        "Où est la bibliothèque ?",
        "def f(x): return x * 2",
        "pizza 🍕",
        "猫",
    ]
    with edge.load_embedder("all-minilm", precision="exact", n_threads=2) as m:
        ours, seqs = m.embed(texts), m.tokenize(texts)
        path = write_bert_gguf(m.folder, tmp_path / "minilm-f16.gguf", dtype="f16")
    with edge.load_embedder(path, precision="exact", n_threads=2) as g:
        assert g.tokenize(texts) == seqs
        assert min(cosine(a, b) for a, b in zip(g.embed(texts), ours, strict=True)) >= 0.999
