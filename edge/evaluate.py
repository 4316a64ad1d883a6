"""`edge eval`: how far a backend's next-token distributions are from a reference backend's on a text.

Both decoders are teacher-forced over the same token ids in lockstep, a chunk at a time, so only two
[chunk, vocab] logit blocks are alive at once (not [N, vocab] twice) and per-token results are O(N) floats.

`test_prompt` gives the tested decoder each window's first tokens in one forward, as a prompt (a phase split's
prefill half runs it), and the rest in `test_chunk` pieces (its decode path over the prompt's K/V); the prompt's
rows and the rows after are then also reported apart. Those prompt logits are alive whole: test_prompt x vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from edge.data import read_text
from edge.devices.base import Decoder
from edge.devices.phase_split import parse_phase_plan
from edge.devices.planned import DeviceRequest, PlannedOptions, open_requested
from edge.devices.registry import DecoderOptions, check_precision, open_decoder, require_backend
from edge.errors import EdgeError
from edge.metrics import EvalMetrics, RowStats, compare_rows, summarize
from edge.models.artifact import is_artifact
from edge.models.checked import CheckedModel, check_model
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
    kv_dtype: str = "auto"  # the tested decoder's KV cache type (the reference's: auto)
    reference_precision: str = "fast"
    # the tested decoder split by phase, in place of `backend` (--plan prefill=B:D[:P],decode=B:D[:P])
    plan: str | None = None
    # tokens at each window's start the tested decoder takes in one forward (its prompt path), before its
    # `test_chunk` pieces; None: no prompt, every block in `test_chunk` pieces
    test_prompt: int | None = None

    def __post_init__(self) -> None:
        check_precision(self.precision)
        check_precision(self.reference_precision)
        if self.tokens < 1:
            raise ValueError(f"--tokens must be >= 1 (got {self.tokens})")
        if self.chunk < 1 or self.max_ctx < 2:
            raise ValueError("chunk must be >= 1 and max_ctx >= 2")
        if self.test_chunk is not None and self.test_chunk < 1:
            raise ValueError(f"--test-chunk must be >= 1 (got {self.test_chunk})")
        if self.test_prompt is not None and not 1 <= self.test_prompt < self.tokens:
            raise ValueError(f"--test-prompt must be >= 1 and below --tokens (got {self.test_prompt})")
        if self.plan is not None:
            if self.backend is not None:
                raise ValueError("--plan names the tested halves' backends; it takes no --backend")
            parse_phase_plan(self.plan, self.precision)  # a PlanError now, before any model loads


@dataclass(frozen=True)
class EvalResult:
    model: str
    backend: str
    reference: str
    text: str
    metrics: EvalMetrics
    test_chunk: int  # tokens per forward the tested backend was given
    plan: str | None = None
    test_prompt: int | None = None
    prompt: EvalMetrics | None = None  # with test_prompt: the prompts' rows alone
    after: EvalMetrics | None = None  # and the rows after them (None when no token followed a prompt)

    def to_dict(self) -> dict[str, Any]:
        m = asdict(self.metrics)
        parts = {k: asdict(v) for k, v in (("prompt", self.prompt), ("after", self.after)) if v is not None}
        return {
            "model": self.model,
            "backend": self.backend,
            "reference": self.reference,
            **m,
            "text": self.text,
            "test_chunk": self.test_chunk,
            "plan": self.plan,
            "test_prompt": self.test_prompt,
            **parts,
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
    if cfg.plan is None:
        require_backend(backend)
    ids = text_ids(checked.tokenizer, read_text(cfg.text), cfg.tokens)
    window = min(len(ids), cfg.max_ctx, _context_length(gguf.metadata) or cfg.max_ctx)
    opts = DecoderOptions(n_ctx=window, n_threads=cfg.threads, precision=cfg.reference_precision)
    ref_dec = open_decoder(ref_backend, ref, cfg.device, opts)
    try:
        test, backend = _open_test(checked, backend, cfg, opts)
        try:
            _check_split_paths(test, cfg.test_prompt, min(cfg.test_chunk or cfg.chunk, cfg.chunk))
            rows = _teacher_force(
                ref_dec, test, ids, window, cfg.chunk, on_progress, cfg.test_chunk, cfg.test_prompt
            )
        finally:
            test.close()
    finally:
        ref_dec.close()
    text = str(cfg.text) if cfg.text is not None else "edge/data/eval.txt"
    piece = min(cfg.test_chunk or cfg.chunk, cfg.chunk)
    prompt, after = rows
    parts = (
        (None, None) if cfg.test_prompt is None else (summarize(prompt), summarize(after) if after else None)
    )
    metrics = summarize(prompt + after)
    return EvalResult(model, backend, cfg.reference, text, metrics, piece, cfg.plan, cfg.test_prompt, *parts)


def _open_test(
    checked: CheckedModel, backend: str, cfg: EvalConfig, opts: DecoderOptions
) -> tuple[Decoder, str]:
    """The tested decoder and its backend's name: `backend` alone, or the phase split `cfg.plan` names."""
    if cfg.plan is None:
        tested = replace(opts, precision=cfg.precision, kv_dtype=cfg.kv_dtype)
        return open_decoder(backend, checked, cfg.device, tested), backend
    request = DeviceRequest(device=cfg.device, phases=cfg.plan)
    options = PlannedOptions(
        n_ctx=opts.n_ctx, threads=cfg.threads, precision=cfg.precision, kv_dtype=cfg.kv_dtype
    )
    dec, placement, _ = open_requested(checked, request, options)
    return dec, placement.backend


def _check_split_paths(test: Decoder, test_prompt: int | None, piece: int) -> None:
    """A split runs a forward on its prefill half only when it is longer than its threshold, else on its decode
    half: a --test-prompt that short would score the decode half alone and call it the split's, and pieces
    (--test-chunk) that long would score the prefill half as the rows after the prompt."""
    phases = test.capabilities().phases
    if phases is None:
        return
    if test_prompt is not None and test_prompt <= phases.threshold:
        raise EdgeError(
            f"--test-prompt {test_prompt} is no prompt to this split: its prefill half ({phases.prefill}) "
            f"takes forwards of more than {phases.threshold} tokens",
            hint=f"pass --test-prompt {phases.threshold + 1} or more",
        )
    if piece > phases.threshold:
        raise EdgeError(
            f"pieces of {piece} tokens run on this split's prefill half ({phases.prefill}), not on its decode "
            f"half ({phases.decode}), which takes forwards of up to {phases.threshold} tokens",
            hint=f"pass --test-chunk {phases.threshold} or fewer (1: the decode path generation runs)",
        )


def _teacher_force(
    ref: Decoder,
    test: Decoder,
    ids: list[int],
    window: int,
    chunk: int,
    on_progress: Callable[[int, int], None] | None,
    test_chunk: int | None = None,
    test_prompt: int | None = None,
) -> tuple[list[RowStats], list[RowStats]]:
    """Row j of the logits predicts ids[j + 1]; every id but the first is scored once. Returns the rows of the
    tested decoder's prompts (each window's first `test_prompt` tokens, one forward) and the rows after them.

    The test decoder takes the other blocks in pieces of `test_chunk` tokens (same logits rows, another code
    path).
    """
    if ref.vocab_size != test.vocab_size:
        raise EdgeError(f"vocab sizes differ: reference {ref.vocab_size}, test {test.vocab_size}")
    total = len(ids) - 1
    prompts: list[RowStats] = []
    rows: list[RowStats] = []
    for start in range(0, total, window):
        ref.reset()
        test.reset()
        end = min(start + window, total)
        mid = start if test_prompt is None else min(start + test_prompt, end)
        if mid > start:
            logits = test.forward(ids[start:mid])  # [mid - start, vocab]: the tested decoder's prompt path
            for s in range(start, mid, chunk):
                e = min(s + chunk, mid)
                got = logits[s - start : e - start]
                prompts.append(compare_rows(ref.forward(ids[s:e]), got, ids[s + 1 : e + 1]))
                if on_progress is not None:
                    on_progress(e, total)
            del logits
        for s in range(mid, end, chunk):
            e = min(s + chunk, end)
            block = ids[s:e]
            rows.append(
                compare_rows(ref.forward(block), _forward(test, block, test_chunk), ids[s + 1 : e + 1])
            )
            if on_progress is not None:
                on_progress(e, total)
    return prompts, rows


def _forward(dec: Decoder, block: list[int], piece: int | None) -> np.ndarray:
    if piece is None or piece >= len(block):
        return dec.forward(block)
    return np.concatenate([dec.forward(block[i : i + piece]) for i in range(0, len(block), piece)])
