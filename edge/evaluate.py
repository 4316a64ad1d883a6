"""`edge eval`: how far a backend's next-token distributions are from a reference backend's on a text.

Both decoders are teacher-forced over the same token ids in lockstep, a chunk at a time, so only two
[chunk, vocab] logit blocks are alive at once (not [N, vocab] twice) and per-token results are O(N) floats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edge.data import read_text
from edge.devices.base import Decoder
from edge.devices.registry import DecoderOptions, check_precision, open_decoder, require_backend
from edge.errors import EdgeError
from edge.metrics import EvalMetrics, RowStats, compare_rows, summarize
from edge.models.artifact import is_artifact
from edge.models.checked import check_model
from edge.models.tokenizer import Tokenizer

__all__ = ["EvalConfig", "EvalResult", "evaluate"]


@dataclass(frozen=True)
class EvalConfig:
    backend: str | None = None  # None: llamacpp; for an artifact directory, its target
    reference: str = "llamacpp"
    device: str = "cpu"
    tokens: int = 1024  # tokens of the text to score
    text: Path | None = None  # None: the shipped eval.txt
    chunk: int = 128  # tokens per forward; bounds the logits held: 2 x chunk x vocab x 4 bytes
    # tokens per forward of the tested decoder (None: `chunk`); 1 scores its one-token decode path, the one
    # generation runs, and `--backend llamacpp --test-chunk 1` measures how far llama.cpp's own decode path
    # is from its batched one: the floor for any agreement figure against it
    test_chunk: int | None = None
    max_ctx: int = 2048  # longer texts run in windows of this many tokens, the KV reset between them
    threads: int | None = None
    precision: str = "fast"  # the tested backend's
    reference_precision: str = "fast"

    def __post_init__(self) -> None:
        check_precision(self.precision)
        check_precision(self.reference_precision)
        if self.tokens < 1:
            raise ValueError(f"--tokens must be >= 1 (got {self.tokens})")
        if self.chunk < 1 or self.max_ctx < 2:
            raise ValueError("chunk must be >= 1 and max_ctx >= 2")
        if self.test_chunk is not None and self.test_chunk < 1:
            raise ValueError(f"--test-chunk must be >= 1 (got {self.test_chunk})")


@dataclass(frozen=True)
class EvalResult:
    model: str
    backend: str
    reference: str
    text: str
    metrics: EvalMetrics
    test_chunk: int  # tokens per forward the tested backend was given

    def to_dict(self) -> dict[str, Any]:
        m = asdict(self.metrics)
        return {
            "model": self.model,
            "backend": self.backend,
            "reference": self.reference,
            **m,
            "text": self.text,
            "test_chunk": self.test_chunk,
        }


def text_ids(tokenizer: Tokenizer, text: str, n: int) -> list[int]:
    """BOS (when the model wants one) + the first n tokens of the text: n predictions to score."""
    ids = tokenizer.encode(text, parse_special=False)
    head = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    # Without a BOS the first text token is context only, so one more is read to still score n.
    need = n if head else n + 1
    if len(ids) < need:
        most = len(ids) if head else len(ids) - 1
        raise EdgeError(
            f"the text has only {len(ids)} tokens, too few to score --tokens {n}",
            hint=f"pass --tokens {max(most, 1)} or a longer --text",
        )
    return head + ids[:need]


def _context_length(metadata: dict[str, Any]) -> int | None:
    value = metadata.get(f"{metadata.get('general.architecture')}.context_length")
    return int(value) if isinstance(value, int) else None


def evaluate(
    model: str, cfg: EvalConfig, on_progress: Callable[[int, int], None] | None = None
) -> EvalResult:
    """Teacher-force both decoders over the text; `on_progress(done, total)` after each chunk."""
    checked = check_model(model)
    artifact = checked.artifact
    backend = cfg.backend or (artifact.target if artifact is not None else "llamacpp")
    # the reference: a backend on the same model, or an artifact directory of the same model in another form
    # (e.g. unquantized, or converted from another quantization of it: same tokenizer, same vocabulary)
    gguf = checked.gguf
    ref, ref_backend = checked, cfg.reference
    if is_artifact(cfg.reference):
        ref = check_model(cfg.reference)
        ref_backend = ref.artifact.target if ref.artifact is not None else ref_backend
        key = "tokenizer.ggml.tokens"
        if ref.gguf.metadata.get(key) != gguf.metadata.get(key):
            raise EdgeError(
                f"{cfg.reference} has another tokenizer than {model}: not the same model",
                hint="convert the reference from the same model (any quantization of it)",
            )
    require_backend(ref_backend)
    require_backend(backend)
    ids = text_ids(checked.tokenizer, read_text(cfg.text), cfg.tokens)
    window = min(len(ids), cfg.max_ctx, _context_length(gguf.metadata) or cfg.max_ctx)
    opts = DecoderOptions(n_ctx=window, n_threads=cfg.threads, precision=cfg.reference_precision)
    ref_dec = open_decoder(ref_backend, ref, cfg.device, opts)
    try:
        test = open_decoder(backend, checked, cfg.device, replace(opts, precision=cfg.precision))
        try:
            rows = _teacher_force(ref_dec, test, ids, window, cfg.chunk, on_progress, cfg.test_chunk)
        finally:
            test.close()
    finally:
        ref_dec.close()
    text = str(cfg.text) if cfg.text is not None else "edge/data/eval.txt"
    piece = min(cfg.test_chunk or cfg.chunk, cfg.chunk)
    return EvalResult(model, backend, cfg.reference, text, summarize(rows), piece)


def _teacher_force(
    ref: Decoder,
    test: Decoder,
    ids: list[int],
    window: int,
    chunk: int,
    on_progress: Callable[[int, int], None] | None,
    test_chunk: int | None = None,
) -> list[RowStats]:
    """Row j of the logits predicts ids[j + 1]; every id but the first is scored once.

    The test decoder takes each block in pieces of `test_chunk` tokens (same logits rows, another code path).
    """
    if ref.vocab_size != test.vocab_size:
        raise EdgeError(f"vocab sizes differ: reference {ref.vocab_size}, test {test.vocab_size}")
    total = len(ids) - 1
    rows: list[RowStats] = []
    for start in range(0, total, window):
        ref.reset()
        test.reset()
        end = min(start + window, total)
        for s in range(start, end, chunk):
            e = min(s + chunk, end)
            block = ids[s:e]
            rows.append(
                compare_rows(ref.forward(block), _forward(test, block, test_chunk), ids[s + 1 : e + 1])
            )
            if on_progress is not None:
                on_progress(e, total)
    return rows


def _forward(dec: Decoder, block: list[int], piece: int | None) -> np.ndarray:
    if piece is None or piece >= len(block):
        return dec.forward(block)
    return np.concatenate([dec.forward(block[i : i + piece]) for i in range(0, len(block), piece)])
