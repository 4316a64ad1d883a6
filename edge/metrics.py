"""Pure functions comparing two decoders' logits over the same tokens (no I/O, no model).

Row-wise functions take logits [n, vocab] and return one value per row, so a caller can stream a long text
chunk by chunk and keep only O(n) floats; `summarize` turns the collected rows into the reported figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EvalMetrics",
    "RowStats",
    "compare_rows",
    "kl_divergence",
    "log_softmax",
    "perplexity",
    "rms",
    "summarize",
    "target_logprob",
    "top1_agreement",
]

# Rows handled at once in float64: bounds the temporaries to ~BLOCK * vocab * 8 bytes each.
_BLOCK = 16


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p over the last axis, in float64. [n, vocab] -> [n, vocab]"""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def kl_divergence(ref_logits: np.ndarray, test_logits: np.ndarray) -> np.ndarray:
    """KL(P_ref || P_test) in nats, per row. [n, vocab] x2 -> [n]"""
    _check_pair(ref_logits, test_logits)
    out = np.empty(ref_logits.shape[0], dtype=np.float64)
    for i in range(0, ref_logits.shape[0], _BLOCK):
        lp = log_softmax(ref_logits[i : i + _BLOCK])
        lq = log_softmax(test_logits[i : i + _BLOCK])
        out[i : i + _BLOCK] = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    # Rounding can leave -1e-17 where the distributions agree; KL is never negative.
    return np.maximum(out, 0.0)


def target_logprob(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """log p(target) per row. [n, vocab], [n] -> [n]"""
    targets = np.asarray(targets, dtype=np.int64)
    if logits.ndim != 2 or targets.shape != (logits.shape[0],):
        raise ValueError(f"logits {logits.shape} and targets {targets.shape} do not match")
    out = np.empty(len(targets), dtype=np.float64)
    for i in range(0, len(targets), _BLOCK):
        lp = log_softmax(logits[i : i + _BLOCK])
        out[i : i + _BLOCK] = lp[np.arange(lp.shape[0]), targets[i : i + _BLOCK]]
    return out


def top1_agreement(ref_logits: np.ndarray, test_logits: np.ndarray) -> np.ndarray:
    """True where both put their highest logit on the same token (first index on ties). -> [n] bool"""
    _check_pair(ref_logits, test_logits)
    return np.argmax(ref_logits, axis=-1) == np.argmax(test_logits, axis=-1)


def perplexity(logprobs: np.ndarray) -> float:
    """exp of the mean negative log-likelihood of the observed tokens."""
    lp = np.asarray(logprobs, dtype=np.float64)
    if lp.size == 0:
        raise ValueError("perplexity of zero tokens")
    return float(np.exp(-lp.mean()))


def rms(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    return float(np.sqrt(np.mean(x * x))) if x.size else 0.0


@dataclass(frozen=True)
class RowStats:
    """Per-token values for one chunk of text (all [n])."""

    logprob_ref: np.ndarray  # log p_ref(correct next token)
    logprob_test: np.ndarray
    kl: np.ndarray  # KL(P_ref || P_test)
    agree: np.ndarray  # top-1 tokens equal


def compare_rows(ref_logits: np.ndarray, test_logits: np.ndarray, targets: np.ndarray) -> RowStats:
    """Everything `summarize` needs from one chunk: ref/test logits [n, vocab], targets [n] (next tokens)."""
    return RowStats(
        logprob_ref=target_logprob(ref_logits, targets),
        logprob_test=target_logprob(test_logits, targets),
        kl=kl_divergence(ref_logits, test_logits),
        agree=top1_agreement(ref_logits, test_logits),
    )


@dataclass(frozen=True)
class EvalMetrics:
    tokens: int  # scored tokens (predictions)
    ppl: float  # test decoder
    ppl_ref: float
    kl_mean: float  # nats
    kl_p99: float  # 99th percentile over tokens (linear interpolation)
    top1_agree: float  # fraction of tokens
    rms_dp: float  # RMS over tokens of p_test(correct) - p_ref(correct)


def summarize(chunks: Iterable[RowStats]) -> EvalMetrics:
    parts = list(chunks)
    if not parts:
        raise ValueError("no tokens to summarize")
    lp_ref = np.concatenate([c.logprob_ref for c in parts])
    lp_test = np.concatenate([c.logprob_test for c in parts])
    kl = np.concatenate([c.kl for c in parts])
    agree = np.concatenate([c.agree for c in parts])
    return EvalMetrics(
        tokens=int(lp_ref.size),
        ppl=perplexity(lp_test),
        ppl_ref=perplexity(lp_ref),
        kl_mean=float(kl.mean()),
        kl_p99=float(np.percentile(kl, 99)),
        top1_agree=float(agree.mean()),
        rms_dp=rms(np.exp(lp_test) - np.exp(lp_ref)),
    )


def _check_pair(a: np.ndarray, b: np.ndarray) -> None:
    if a.ndim != 2 or a.shape != b.shape:
        raise ValueError(f"logits must both be [n, vocab] (got {a.shape} and {b.shape})")
