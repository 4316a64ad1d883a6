"""Per-token log-probabilities of a generation (OpenAI's `logprobs` / `top_logprobs`).

What is reported: log-softmax of the logits the sampler draws from after the grammar mask and the repeat
penalty, at temperature 1 and before top-k / top-p / min-p: the model's own distribution restricted to what
the grammar admits. That is what OpenAI reports (the model's log-probs, independent of temperature), it is
defined for greedy runs too, and the alternatives are never -inf merely because a truncation dropped them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    """One token and its log-probability; `bytes` are the token's raw bytes (one token can be a partial
    UTF-8 sequence, so `token` may hold U+FFFD); `top` the most likely alternatives, best first."""

    token: str
    logprob: float
    bytes: tuple[int, ...]
    id: int
    top: tuple[TokenLogprob, ...] = ()


def check_top(n: int) -> int:
    if not 0 <= n <= MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs must be between 0 and {MAX_TOP_LOGPROBS} (got {n})")
    return n


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-softmax; -inf entries (masked ids) stay -inf."""
    x = logits.astype(np.float64)
    m = x.max()
    return x - (m + np.log(np.exp(x - m).sum()))


def top_ids(lp: np.ndarray, n: int) -> np.ndarray:
    """The `n` ids of highest log-prob, best first (ties by lower id); masked (-inf) ids are never listed."""
    n = min(n, int(np.isfinite(lp).sum()))
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    part = np.argpartition(-lp, n - 1)[:n]
    return part[np.lexsort((part, -lp[part]))]


def choice_logprobs(logits: np.ndarray, token: int, n: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-prob and the top `n` (id, log-prob) of one prepared logits row."""
    lp = log_softmax(logits)
    return float(lp[token]), [(int(i), float(lp[i])) for i in top_ids(lp, n)]
