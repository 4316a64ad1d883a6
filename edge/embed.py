"""`edge.load_embedder`: an embedding model (an encoder: no KV cache, no sampler) opened on a runtime, and
`EmbeddingModel.embed(texts)` -> one vector per text.

An embedder is its own type, not `edge.Model`: a Model is a decoder (generate, chat, KV, drafts) and every
one of its methods would be wrong for an encoder; `edge.load` of an embedding model says to use this.

Texts are tokenized by the model's own tokenizer.json, sorted by length and run in batches of similar lengths
(padding costs little), and given back in their order. An input longer than the model's maximum is a
ContextOverflowError naming its token count and the limit, unless the caller asks for truncation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from edge.devices.encoder import EncoderOptions, EncoderRunner, open_encoder, resolve_backend
from edge.errors import ContextOverflowError, EdgeError, TokenizerError
from edge.models.encoder_folder import EncoderSource
from edge.models.encoder_source import check_encoder
from edge.models.store import PullProgress

__all__ = ["EmbeddingModel", "load_embedder"]

BATCH_TOKENS = 8192  # padded tokens per forward: bounds the attention's [b, h, s, s] memory


class EmbeddingModel:
    """An opened embedding model. `dim`: the vector's width; `max_tokens`: tokens per input, the model's
    own [CLS]/[SEP] included; `normalized`: vectors have unit length."""

    def __init__(self, name: str, folder: EncoderSource, runner: EncoderRunner) -> None:
        self.name = name
        self.folder = folder
        self._runner: EncoderRunner | None = runner
        self.dim = folder.config.hidden
        self.max_tokens = folder.max_seq_length
        self.vocab_size = folder.config.vocab_size
        self.normalized = folder.pooling.normalize
        self.pooling = folder.pooling.mode
        self.backend = runner.backend
        self.precision = runner.precision
        self._prefix, self._suffix = _special_template(folder.tokenizer)

    # -- tokens ------------------------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str], *, truncate: bool = False) -> list[list[int]]:
        """Each text's token ids as the model sees them ([CLS] ... [SEP]); longer than `max_tokens`: an error
        naming the count, or cut to it (the end marker kept) with `truncate`."""
        tok = self.folder.tokenizer
        if self.folder.lowercase:
            texts = [t.lower() for t in texts]
        if len(texts) < 16:  # encode_batch's thread pool costs more than it saves on a few texts
            seqs = [tok.encode(t, add_special_tokens=True).ids for t in texts]
        else:
            seqs = [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=True)]
        return [self._bounded(s, i, truncate) for i, s in enumerate(seqs)]

    def wrap_ids(self, seqs: Sequence[Sequence[int]], *, truncate: bool = False) -> list[list[int]]:
        """Token ids of texts (no special tokens) as the model sees them; ids outside the vocabulary raise
        TokenizerError."""
        out = []
        for i, ids in enumerate(seqs):
            bad = [t for t in ids if not 0 <= t < self.vocab_size]
            if bad:
                raise TokenizerError(
                    f"input {i}: token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})"
                )
            out.append(self._bounded([*self._prefix, *ids, *self._suffix], i, truncate))
        return out

    def _bounded(self, ids: list[int], i: int, truncate: bool) -> list[int]:
        if len(ids) <= self.max_tokens:
            return ids
        if truncate:
            keep = self.max_tokens - len(self._suffix)
            return ids[:keep] + ids[len(ids) - len(self._suffix) :]
        raise ContextOverflowError(
            f"input {i} has {len(ids)} tokens; {self.name} takes at most {self.max_tokens}",
            hint="shorten it, or ask for truncation",
        )

    # -- vectors -----------------------------------------------------------------------------------------
    def embed(self, texts: str | Sequence[str], *, truncate: bool = False) -> np.ndarray:
        """[len(texts), dim] float32 (one row for a single string: [1, dim])."""
        items = [texts] if isinstance(texts, str) else list(texts)
        return self.embed_tokens(self.tokenize(items, truncate=truncate))

    def embed_tokens(self, seqs: Sequence[Sequence[int]]) -> np.ndarray:
        """Vectors of token sequences already in the model's form (from `tokenize` or `wrap_ids`)."""
        out = np.zeros((len(seqs), self.dim), np.float32)
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        start = 0
        while start < len(order):
            # sorted by length: a group's last item is its longest; it grows while its padded tokens fit
            end = start + 1
            while end < len(order) and (end - start + 1) * len(seqs[order[end]]) <= BATCH_TOKENS:
                end += 1
            group = order[start:end]
            out[group] = self._forward([seqs[i] for i in group])
            start = end
        return out

    def _forward(self, seqs: list[Sequence[int]]) -> np.ndarray:
        if self._runner is None:
            raise EdgeError(f"{self.name} is closed")
        width = max(len(s) for s in seqs)
        ids = np.zeros((len(seqs), width), np.int64)
        mask = np.zeros_like(ids)
        for row, s in enumerate(seqs):
            ids[row, : len(s)] = s
            mask[row, : len(s)] = 1
        return self._runner.run(ids, mask, np.zeros_like(ids))

    # -- lifetime ----------------------------------------------------------------------------------------
    def close(self) -> None:
        self._runner = None

    def __enter__(self) -> EmbeddingModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _special_template(tok: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after one text ([CLS] / [SEP] for BERT), found by encoding a
    marker text, so token-id input gets exactly what text input gets."""
    plain = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    n = len(plain)
    for at in range(len(full) - n + 1):
        if full[at : at + n] == plain:
            return full[:at], full[at + n :]
    raise TokenizerError("the tokenizer's special tokens around a text cannot be found")


def load_embedder(
    model: str | os.PathLike[str] = "all-minilm-l6-v2",
    *,
    backend: str = "auto",
    precision: str = "fast",
    n_threads: int | None = None,
    on_progress: PullProgress | None = None,
) -> EmbeddingModel:
    """Open an embedding model: a catalog name (`all-minilm-l6-v2`, alias `all-minilm`; pulled and checked on
    first use), a sentence-transformers folder or a BERT GGUF. `backend`: auto (OpenVINO where installed, the
    faster here; else ONNX Runtime) | ort | openvino. `precision`: "fast" (int8 where it holds cosine >= 0.999
    to a float64 forward: OpenVINO; fp32 on ORT) or "exact" (fp32).

    >>> import edge
    >>> with edge.load_embedder("all-minilm") as m:                    # doctest: +SKIP
    ...     vectors = m.embed(["a cat", "a dog"])                       # [2, 384], unit length
    """
    from edge.models.encoder_graph import build_encoder

    backend = resolve_backend(backend)  # before the model is read
    checked = check_encoder(model, on_progress=on_progress)
    # ORT: its own attention kernel; OpenVINO at fast: int8 weights for its int8 kernels (devices/encoder.py)
    graph = build_encoder(
        checked.folder, fused=backend == "ort", int8_weights=backend == "openvino" and precision == "fast"
    )
    runner = open_encoder(graph, EncoderOptions(backend, precision, n_threads))
    return EmbeddingModel(checked.name, checked.folder, runner)
