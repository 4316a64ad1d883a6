"""Sampling on hand-made logits: each filter keeps exactly the tokens it should."""

from __future__ import annotations

import numpy as np
import pytest

from edge.sampling import Sampler, SamplingConfig, apply_repeat_penalty, probabilities

LOGITS = np.log(np.array([0.5, 0.25, 0.125, 0.0625, 0.0625], dtype=np.float32))


def cfg(**kw: float) -> SamplingConfig:
    base = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    base.update(kw)
    return SamplingConfig(**base)  # type: ignore[arg-type]


def test_greedy_is_argmax() -> None:
    s = Sampler(SamplingConfig(temperature=0.0))
    assert s(np.array([0.1, 3.0, 2.9])) == 1


def test_plain_temperature_one_keeps_distribution() -> None:
    np.testing.assert_allclose(probabilities(LOGITS, cfg()), [0.5, 0.25, 0.125, 0.0625, 0.0625], rtol=1e-6)


def test_top_k() -> None:
    p = probabilities(LOGITS, cfg(top_k=2))
    np.testing.assert_allclose(p, [2 / 3, 1 / 3, 0, 0, 0], rtol=1e-6)


def test_top_p_keeps_smallest_prefix_reaching_mass() -> None:
    p = probabilities(LOGITS, cfg(top_p=0.7))  # 0.5 < 0.7 <= 0.75 -> two tokens
    np.testing.assert_allclose(p, [2 / 3, 1 / 3, 0, 0, 0], rtol=1e-6)


def test_min_p() -> None:
    p = probabilities(LOGITS, cfg(min_p=0.2))  # keep p >= 0.1
    np.testing.assert_allclose(p, [4 / 7, 2 / 7, 1 / 7, 0, 0], rtol=1e-6)


def test_temperature_sharpens() -> None:
    p = probabilities(LOGITS, cfg(temperature=0.5))
    q = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625]) ** 2
    np.testing.assert_allclose(p, q / q.sum(), rtol=1e-6)


def test_repeat_penalty_as_llama_cpp() -> None:
    out = apply_repeat_penalty(np.array([2.0, -2.0, 1.0]), [0, 1, 1], penalty=2.0, last_n=64)
    np.testing.assert_allclose(out, [1.0, -4.0, 1.0])
    # only the last_n tokens count
    out = apply_repeat_penalty(np.array([2.0, -2.0, 1.0]), [0, 1], penalty=2.0, last_n=1)
    np.testing.assert_allclose(out, [2.0, -4.0, 1.0])


def test_seeded_draws_repeat_and_follow_distribution() -> None:
    c = cfg(seed=1234)
    a = [Sampler(c)(LOGITS) for _ in range(3)]
    s1, s2 = Sampler(c), Sampler(c)
    seq1 = [s1(LOGITS) for _ in range(4000)]
    seq2 = [s2(LOGITS) for _ in range(4000)]
    assert seq1 == seq2 and len(set(a)) == 1
    freq = np.bincount(seq1, minlength=5) / 4000
    np.testing.assert_allclose(freq, [0.5, 0.25, 0.125, 0.0625, 0.0625], atol=0.03)


@pytest.mark.parametrize("bad", [{"temperature": -1}, {"top_p": 0.0}, {"min_p": 1.5}, {"repeat_penalty": 0}])
def test_invalid_config_rejected(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        SamplingConfig(**bad)  # type: ignore[arg-type]
