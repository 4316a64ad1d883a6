"""Token sampling on one logits row: pure numpy, deterministic for a seed.

Order as in llama.cpp's default chain: repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edge.errors import ConstraintError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1 disables
    min_p: float = 0.05  # 0 disables
    repeat_penalty: float = 1.0  # 1 disables
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1 or not 0 <= self.min_p <= 1:
            raise ValueError(
                "sampling: need temperature >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1 "
                f"(got temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p}, min_p={self.min_p})"
            )
        if self.repeat_penalty <= 0:
            raise ValueError(f"sampling: repeat_penalty must be > 0 (got {self.repeat_penalty})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def mask_logits(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """`logits` with every id outside `allowed` at -inf (a copy). Nothing allowed is an error: a draw from
    nothing would be an arbitrary token."""
    if not allowed.any():
        raise ConstraintError("the grammar admits no next token", hint="check the schema or grammar")
    return np.where(allowed[: logits.shape[0]], logits, -np.inf)


def apply_repeat_penalty(
    logits: np.ndarray, history: Sequence[int], penalty: float, last_n: int
) -> np.ndarray:
    """CTRL-style penalty as llama.cpp applies it: divide positive logits, multiply negative ones."""
    if penalty == 1.0 or not history or last_n == 0:
        return logits
    recent = np.unique(np.asarray(history[-last_n:], dtype=np.int64))
    out = logits.copy()
    vals = out[recent]
    out[recent] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def probabilities(logits: np.ndarray, cfg: SamplingConfig) -> np.ndarray:
    """The distribution a non-greedy draw samples from (zeros outside the kept set)."""
    x = logits.astype(np.float64)
    keep = np.ones(x.shape[0], dtype=bool)
    if 0 < cfg.top_k < x.shape[0]:
        kth = np.partition(x, -cfg.top_k)[-cfg.top_k]
        keep &= x >= kth
    x = np.where(keep, x, -np.inf)
    p = np.exp(x - x.max())
    p /= p.sum()
    if cfg.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        cum = np.cumsum(p[order])
        # keep the smallest prefix whose mass reaches top_p (at least one token)
        cut = int(np.searchsorted(cum, cfg.top_p)) + 1
        mask = np.zeros_like(keep)
        mask[order[:cut]] = True
        keep &= mask
    if cfg.min_p > 0.0:
        keep &= p >= cfg.min_p * p.max()
    x = np.where(keep, logits.astype(np.float64) / cfg.temperature, -np.inf)
    q = np.exp(x - x.max())
    return q / q.sum()


class Sampler:
    """Draws the next token id from a logits row; owns its random generator so runs repeat for a seed."""

    def __init__(self, cfg: SamplingConfig) -> None:
        self.cfg = cfg
        self._rng = np.random.default_rng(cfg.seed)

    def __call__(
        self, logits: np.ndarray, history: Sequence[int] = (), allowed: np.ndarray | None = None
    ) -> int:
        """`allowed` (bool per id, a grammar's mask): every other id is removed before the chain runs, so the
        draw is from the model's distribution restricted to what the grammar admits."""
        return self.draw(self.prepare(logits, history, allowed))

    def prepare(
        self, logits: np.ndarray, history: Sequence[int] = (), allowed: np.ndarray | None = None
    ) -> np.ndarray:
        """The row the draw starts from: grammar mask, then repeat penalty (edge.logprobs reports on it)."""
        cfg = self.cfg
        if allowed is not None:
            logits = mask_logits(logits, allowed)
        return apply_repeat_penalty(logits, history, cfg.repeat_penalty, cfg.repeat_last_n)

    def draw(self, logits: np.ndarray) -> int:
        """A token from a prepared row: its argmax when greedy, else a draw from `probabilities`."""
        cfg = self.cfg
        if cfg.greedy:
            return int(np.argmax(logits))
        p = probabilities(logits, cfg)
        return int(self._rng.choice(p.shape[0], p=p))
