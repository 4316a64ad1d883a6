"""The eval metrics on hand-made logits whose answers are known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge.metrics import (
    RowStats,
    compare_rows,
    kl_divergence,
    log_softmax,
    perplexity,
    rms,
    summarize,
    target_logprob,
    top1_agreement,
)


def _logits(*rows: list[float]) -> np.ndarray:
    """Logits whose softmax is exactly the given probability rows."""
    return np.log(np.array(rows, dtype=np.float64)).astype(np.float32)


def test_log_softmax_is_shift_invariant_and_stable() -> None:
    x = np.array([[1000.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    lp = log_softmax(x)
    assert np.all(np.isfinite(lp))
    assert np.allclose(np.exp(lp).sum(axis=-1), 1.0)
    assert np.allclose(lp[1], [math.log(0.5)] * 2)
    assert np.allclose(log_softmax(x + 7.0), lp)


def test_kl_of_identical_logits_is_exactly_zero() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(40, 1000)).astype(np.float32) * 5
    assert np.array_equal(kl_divergence(logits, logits.copy()), np.zeros(40))


def test_kl_of_two_hand_distributions() -> None:
    ref = _logits([0.5, 0.5], [0.9, 0.1])
    test = _logits([0.25, 0.75], [0.9, 0.1])
    kl = kl_divergence(ref, test)
    # KL(P||Q) = sum p ln(p/q) = 0.5 ln(0.5/0.25) + 0.5 ln(0.5/0.75) = 0.5 ln(4/3)
    assert kl[0] == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)
    assert kl[1] == pytest.approx(0.0, abs=1e-7)
    # direction matters: KL(Q||P) = 0.25 ln(0.5) + 0.75 ln(1.5)
    assert kl_divergence(test, ref)[0] == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5), abs=1e-6)


def test_kl_blocks_match_row_by_row() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(2, 37, 50)).astype(np.float32)  # 37 rows: not a multiple of the block size
    whole = kl_divergence(a, b)
    rows = [kl_divergence(a[i : i + 1], b[i : i + 1])[0] for i in range(37)]
    assert np.allclose(whole, rows, rtol=0, atol=1e-12)
    assert np.all(whole > 0)


def test_perplexity_of_uniform_is_vocab_size() -> None:
    vocab = 1000
    logits = np.zeros((5, vocab), dtype=np.float32)
    lp = target_logprob(logits, np.array([0, 1, 2, 999, 500]))
    assert perplexity(lp) == pytest.approx(vocab, rel=1e-9)


def test_perplexity_of_half_sure_model_is_two() -> None:
    logits = _logits([0.5, 0.25, 0.25], [0.25, 0.5, 0.25])
    assert perplexity(target_logprob(logits, np.array([0, 1]))) == pytest.approx(2.0, rel=1e-6)
    with pytest.raises(ValueError):
        perplexity(np.array([]))


def test_top1_agreement() -> None:
    ref = np.array([[0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    test = np.array([[0.0, 5.0, 1.0], [0.0, 3.0, 0.0], [1.0, 1.0, 2.0]])
    assert top1_agreement(ref, test).tolist() == [True, False, True]


def test_rms_dp_of_the_correct_token() -> None:
    ref = _logits([0.5, 0.5], [0.8, 0.2])
    test = _logits([0.25, 0.75], [0.8, 0.2])
    rows = compare_rows(ref, test, np.array([0, 0]))  # correct token 0: dp = -0.25 then 0
    m = summarize([rows])
    assert m.rms_dp == pytest.approx(math.sqrt((0.25**2 + 0.0) / 2), abs=1e-6)
    assert m.top1_agree == 0.5  # row 0: ref ties on token 0 (first index), test picks token 1
    assert m.ppl_ref == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.8)) / 2), rel=1e-6)
    assert m.ppl == pytest.approx(math.exp(-(math.log(0.25) + math.log(0.8)) / 2), rel=1e-6)
    assert rms(np.array([3.0, -4.0])) == pytest.approx(math.sqrt(12.5))


def test_summarize_streams_chunks_and_takes_p99() -> None:
    def chunk(kl: np.ndarray) -> RowStats:
        n = len(kl)
        zeros = np.full(n, math.log(0.5))
        return RowStats(zeros, zeros, kl, np.ones(n, dtype=bool))

    kl = np.arange(101, dtype=np.float64)  # 0..100: the 99th percentile is 99 exactly
    m = summarize([chunk(kl[:40]), chunk(kl[40:])])
    assert m.tokens == 101
    assert m.kl_mean == pytest.approx(50.0)
    assert m.kl_p99 == pytest.approx(99.0)
    assert m.top1_agree == 1.0 and m.rms_dp == 0.0 and m.ppl == pytest.approx(2.0)


def test_identical_rows_give_the_sanity_figures() -> None:
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(20, 300)).astype(np.float32)
    targets = rng.integers(0, 300, size=20)
    m = summarize([compare_rows(logits, logits.copy(), targets)])
    assert (m.kl_mean, m.kl_p99, m.top1_agree, m.rms_dp) == (0.0, 0.0, 1.0, 0.0)
    assert m.ppl == m.ppl_ref


def test_shape_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError):
        kl_divergence(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(ValueError):
        target_logprob(np.zeros((2, 3)), np.array([0]))
