"""`edge bench MODEL --embed`: an embedding model's speed on each backend, side by side: sentences/s and
tokens/s over N short sentences embedded in one call, and one short query's latency (median of 20). llama.cpp
runs the same weights as a BERT GGUF written the way its converter writes one (f16, models/bert_gguf.py), in
the same process with the same threads.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edge.embed import EmbeddingModel, load_embedder
from edge.errors import BackendUnavailableError

__all__ = ["EmbedBench", "run_embed_bench", "short_sentences"]

BACKENDS = ("ort", "openvino", "llamacpp")
QUERY = "what is a cat?"
_WORDS = [
    "the",
    "a",
    "cat",
    "dog",
    "sat",
    "ran",
    "on",
    "under",
    "over",
    "mat",
    "field",
    "river",
    "house",
    "old",
    "new",
    "green",
    "bright",
    "quiet",
    "city",
    "night",
    "morning",
    "people",
    "read",
    "write",
    "code",
    "music",
    "tea",
    "coffee",
    "rain",
    "sun",
    "snow",
    "train",
    "station",
    "market",
    "book",
    "window",
    "garden",
]


def short_sentences(n: int, seed: int = 0) -> list[str]:
    """`n` sentences of 5 to 14 common words, the same for a given seed."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "." for _ in range(n)
    ]


@dataclass(frozen=True)
class EmbedBench:
    backend: str
    sentences_s: float
    tokens_s: float
    query_ms: float
    load_s: float


def _time(fn: Any, repeat: int) -> float:
    """The best of `repeat` runs, in seconds (the machine's other load only ever adds time)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _latency_ms(fn: Any) -> float:
    runs = []
    for _ in range(20):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs) * 1e3


def _edge(
    model: str, backend: str, texts: list[str], threads: int | None, precision: str, repeat: int
) -> tuple[EmbedBench, EmbeddingModel]:
    t0 = time.perf_counter()
    m = load_embedder(model, backend=backend, precision=precision, n_threads=threads)
    load = time.perf_counter() - t0
    n_tokens = sum(
        len(s) for s in m.tokenize(texts, truncate=True)
    )  # cut to the model's length, as llama.cpp
    m.embed(texts[:32], truncate=True)  # first-run costs
    best = _time(lambda: m.embed(texts, truncate=True), repeat)
    query = _latency_ms(lambda: m.embed(QUERY))
    return EmbedBench(backend, len(texts) / best, n_tokens / best, query, load), m


def _llamacpp(m: EmbeddingModel, texts: list[str], threads: int | None, repeat: int, tmp: Path) -> EmbedBench:
    try:
        import llama_cpp
    except ImportError as exc:
        raise BackendUnavailableError(f"llama-cpp-python cannot be imported: {exc}") from None
    from edge.models.bert_gguf import write_bert_gguf

    path = write_bert_gguf(m.folder, tmp / f"{m.name}.f16.gguf", dtype="f16")
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(
        # a larger batch costs it more: its attention spans the whole batch
        str(path), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512,
        n_threads=threads, n_threads_batch=threads, verbose=False,
    )  # fmt: skip
    load = time.perf_counter() - t0
    try:
        n_tokens = sum(len(llm.tokenize(t.encode())) for t in texts)
        llm.embed(texts[:32])
        best = _time(lambda: llm.embed(texts), repeat)
        query = _latency_ms(lambda: llm.embed(QUERY))
    finally:
        llm.close()
    return EmbedBench("llamacpp", len(texts) / best, n_tokens / best, query, load)


def run_embed_bench(
    model: str,
    backends: tuple[str, ...] = BACKENDS,
    *,
    sentences: int = 512,
    threads: int | None = None,
    precision: str = "fast",
    repeat: int = 3,
) -> list[EmbedBench]:
    """Each backend's figures on the same sentences, in the order given."""
    texts = short_sentences(sentences)
    out: list[EmbedBench] = []
    ref: EmbeddingModel | None = None
    with tempfile.TemporaryDirectory(prefix="edge-bench-embed-") as tmp:
        for b in backends:
            if b == "llamacpp":
                ref = ref or load_embedder(model, backend="ort", precision="exact", n_threads=threads)
                out.append(_llamacpp(ref, texts, threads, repeat, Path(tmp)))
            else:
                result, ref = _edge(model, b, texts, threads, precision, repeat)
                out.append(result)
    return out


def to_dict(model: str, results: list[EmbedBench], sentences: int, threads: int | None) -> dict[str, Any]:
    return {
        "model": model,
        "sentences": sentences,
        "threads": threads,
        "results": [asdict(r) for r in results],
    }
