"""POST /v1/embeddings through the real `openai` client (base64 by default, and float), beside a chat model on
one `edge serve`; OpenAI's error shapes for bad input; the real all-minilm through LangChain (slow)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

import edge
from edge.server import Server
from edge.server.embeddings import MAX_INPUTS
from tests.encoder_reference import cosine, reference_embedding, write_tiny_folder
from tests.server.conftest import TEMPLATE
from tests.tiny_models import TinySpec, write_tiny_model


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    """One server holding a tiny chat GGUF and a tiny embedding folder side by side."""
    root = tmp_path_factory.mktemp("emb_serve")
    chat = write_tiny_model(root / "tiny.gguf", TinySpec(chat_template=TEMPLATE, seed=1))
    folder = write_tiny_folder(root / "tiny-embed")
    server = edge.serve(
        models=[str(chat), str(folder)], port=0, host="127.0.0.1", block=False, backend="llamacpp",
        n_ctx=512, n_threads=1, grace_s=1.0,
    )  # fmt: skip
    yield server, folder
    server.stop()


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=30)


def test_openai_client_gets_the_api_vectors(both: tuple[Server, Path]) -> None:
    server, folder = both
    texts = ["the cat sat", "a dog", "cats run on the mat"]
    with edge.load_embedder(folder, n_threads=1) as m:
        local = m.embed(texts)
        n_tokens = sum(len(s) for s in m.tokenize(texts))  # [CLS] and [SEP] counted: what the model reads
        ids = m.folder.tokenizer.encode("the cat sat", add_special_tokens=False).ids
    c = client(server)
    r = c.embeddings.create(model="tiny-embed", input=texts)  # the client asks for base64 and decodes it
    got = np.array([d.embedding for d in r.data])
    assert [d.index for d in r.data] == [0, 1, 2] and got.shape == (3, 32)
    assert np.allclose(got, local, atol=1e-6)
    assert r.usage.prompt_tokens == r.usage.total_tokens == n_tokens == 17
    floats = c.embeddings.create(model="tiny-embed", input="a dog", encoding_format="float")
    assert np.allclose(floats.data[0].embedding, local[1], atol=1e-6)
    by_ids = c.embeddings.create(model="tiny-embed", input=[ids, ids], encoding_format="float")
    assert np.allclose(by_ids.data[1].embedding, local[0], atol=1e-6)
    # the chat model still answers on the same server; /v1/models lists both
    hi = [{"role": "user", "content": "hi"}]
    chat = c.chat.completions.create(model="tiny.gguf", messages=hi, max_tokens=2)
    assert chat.choices[0].message.content is not None
    assert {m.id for m in c.models.list()} >= {"tiny.gguf", "tiny-embed"}
    with pytest.raises(openai.BadRequestError, match="tiny-embed is an embedding model"):
        c.chat.completions.create(model="tiny-embed", messages=hi, max_tokens=2)


@pytest.mark.parametrize(
    ("body", "status", "match"),
    [
        ({"input": "cat " * 30}, 400, "input 0 has 32 tokens; tiny-embed takes at most 16"),
        ({"input": ["a cat", ""]}, 400, r"input\[1\] is an empty string"),
        ({"input": []}, 400, "at least one input"),
        ({"input": [5, 10_000]}, 400, "token id 10000 is outside the vocabulary"),
        ({"input": "a cat", "dimensions": 8}, 400, "dimensions"),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, 413, f"at most {MAX_INPUTS}"),
        ({"input": "a cat", "model": "tiny.gguf"}, 400, "tiny.gguf is a chat model"),
        ({"input": "a cat", "model": "smollm2-135m"}, 400, "smollm2-135m is a chat model"),
        ({"input": "a cat", "model": "no-such"}, 404, "does not exist"),
        ({"input": "a cat", "encoding_format": "int8"}, 400, "encoding_format"),
        ({"input": {"a": 1}}, 400, "input"),
    ],
)
def test_bad_input_is_a_clear_error(both: tuple[Server, Path], body: dict, status: int, match: str) -> None:
    server, _ = both
    r = httpx.post(server.url + "/v1/embeddings", json={"model": "tiny-embed", **body}, timeout=30)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    import re

    assert re.search(match, err["message"]), err["message"]


@pytest.mark.slow
def test_langchain_and_openai_on_the_real_model() -> None:
    pytest.importorskip("langchain_openai")
    from langchain_openai import OpenAIEmbeddings

    server = edge.serve(
        models=["all-minilm"], port=0, host="127.0.0.1", block=False, n_threads=2, grace_s=1.0
    )
    try:
        lc = OpenAIEmbeddings(
            model="all-minilm", base_url=server.url + "/v1", api_key="none", check_embedding_ctx_length=False
        )
        docs = ["Paris is the capital of France.", "def f(x): return x * 2", "Ich liebe Pizza 🍕"]
        got = np.array(lc.embed_documents(docs))
        query = np.array(lc.embed_query("capital of france"))
        via_openai = client(server).embeddings.create(model="all-minilm-l6-v2", input=docs)
        with edge.load_embedder("all-minilm", precision="exact", n_threads=1) as m:
            refs = [reference_embedding(m.folder, ids) for ids in m.tokenize(docs)]
        for row, d, ref in zip(got, via_openai.data, refs, strict=True):
            assert cosine(row, ref) >= 0.999 and cosine(np.array(d.embedding), ref) >= 0.999
        assert int(np.argmax(got @ query)) == 0
        # LangChain's default sends tiktoken ids (its encoding needs a download, so they are written here):
        # not this model's ids, so a clear 400, never embedded
        with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
            client(server).embeddings.create(model="all-minilm", input=[[31373, 995, 50256]])
    finally:
        server.stop()


def test_concurrent_requests_each_get_their_own_vectors(both: tuple[Server, Path]) -> None:
    """The server embeds in a thread pool: requests at once on one model must not mix their results."""
    from concurrent.futures import ThreadPoolExecutor

    server, folder = both
    texts = [f"the cat sat on {'a ' * (i % 5)}mat" for i in range(24)]
    with edge.load_embedder(folder, n_threads=1) as m:
        expected = m.embed(texts)
    c = client(server)

    def one(i: int) -> np.ndarray:
        return np.array(c.embeddings.create(model="tiny-embed", input=texts[i]).data[0].embedding)

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(one, range(len(texts))))
    assert all(np.allclose(g, e, atol=1e-5) for g, e in zip(got, expected, strict=True))


def test_ollama_client_embeds_through_api_embed(both: tuple[Server, Path]) -> None:
    """The real `ollama` client: `embed` (a list, and `NAME:latest`) and the older `embeddings`; inputs past
    the model's maximum are cut as Ollama cuts them unless `truncate` is false; options are refused."""
    import ollama

    server, folder = both
    texts = ["the cat sat", "a dog"]
    with edge.load_embedder(folder, n_threads=1) as m:
        local = m.embed(texts)
        limit = m.max_tokens
    c = ollama.Client(host=server.url)
    r = c.embed(model="tiny-embed:latest", input=texts)
    assert np.allclose(np.array(r.embeddings), local, atol=1e-6)
    assert r.prompt_eval_count and r.prompt_eval_count > 0
    old = c.embeddings(model="tiny-embed", prompt="a dog")
    assert np.allclose(old.embedding, local[1], atol=1e-6)
    long_text = " ".join(["cat"] * (limit + 20))
    assert len(c.embed(model="tiny-embed", input=long_text).embeddings[0]) == local.shape[1]
    with pytest.raises(ollama.ResponseError, match="at most"):
        c.embed(model="tiny-embed", input=long_text, truncate=False)
    with pytest.raises(ollama.ResponseError, match="options"):
        c.embed(model="tiny-embed", input="a dog", options={"num_ctx": 64})
    with pytest.raises(ollama.ResponseError) as missing:
        c.embed(model="no-such-model", input="a dog")
    assert missing.value.status_code == 404
