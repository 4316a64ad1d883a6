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
