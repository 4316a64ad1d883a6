"""edge's K-quant kernels against a float64 dequantize-and-dot on random blocks, on every instruction set this
CPU runs (the portable C everywhere): extreme and tiny scales and mins, all-zero blocks, odd row counts."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

from edge.devices.kquant import ISAS, isa_runs, matmul
from edge.graph_opt.kquant_op import row_bytes

TYPES = [T.Q4_K, T.Q5_K, T.Q6_K]
# where each type keeps its f16 super-scales (d, and dmin where it has one), as byte offsets in a block
_D_AT = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
_BLOCK = {T.Q4_K: 144, T.Q5_K: 176, T.Q6_K: 210}


def _blocks(t: T, n: int, k: int, rng: np.random.Generator, scale: float) -> np.ndarray:
    """n rows of k weights: random codes, sub-scales and mins, f16 super-scales of magnitude ~scale."""
    nb = k // 256
    raw = rng.integers(0, 256, size=(n, nb, _BLOCK[t]), dtype=np.uint8)
    for off in _D_AT[t]:
        d = (rng.uniform(0.25, 1.0, size=(n, nb)) * scale).astype(np.float16)
        raw[:, :, off : off + 2] = d.view(np.uint8).reshape(n, nb, 2)
    return raw.reshape(n, nb * _BLOCK[t])


def _q8(x: np.ndarray) -> np.ndarray:
    """x as the kernels quantize it: per 256, int8 codes round(x * 127 / amax) times amax / 127."""
    b = x.reshape(x.shape[0], -1, 256).astype(np.float32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    safe = np.where(amax > 0, amax, np.float32(1))
    codes = np.rint(b * (np.float32(127) / safe)).astype(np.float32)
    return (np.where(amax > 0, codes * (safe / np.float32(127)), 0)).reshape(x.shape).astype(np.float64)


def _reference(x: np.ndarray, w: np.ndarray, t: T, k: int) -> np.ndarray:
    wf = dequantize(w, t).reshape(w.shape[0], k).astype(np.float64)
    return _q8(x) @ wf.T


def _isas() -> list[str]:
    return [isa for isa in ISAS if isa_runs(isa)]


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", _isas())
@pytest.mark.parametrize(
    ("m", "n", "k"), [(1, 1, 256), (3, 13, 512), (5, 8, 1536), (1, 37, 2304), (9, 32, 256), (21, 70, 768)]
)
def test_matches_float64_dequantize_and_dot(t: T, isa: str, m: int, n: int, k: int) -> None:
    rng = np.random.default_rng(m * 1000 + n + k)
    w = _blocks(t, n, k, rng, scale=1e-3)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = matmul(x, w, t, isa=isa)
    want = _reference(x, w, t, k)
    # only float32 accumulation is left between the two: relative to the products' magnitude
    bound = 1e-5 * (np.abs(_q8(x)) @ np.abs(dequantize(w, t).reshape(n, k).astype(np.float64)).T) + 1e-30
    assert np.all(np.abs(got - want) <= bound)
    # and the activations' 8-bit rounding (at most half a step of amax / 127 each) moves each product by at
    # most ~0.4% of the magnitudes it sums
    wf = dequantize(w, t).reshape(n, k).astype(np.float64)
    exact = x.astype(np.float64) @ wf.T
    assert np.all(np.abs(got - exact) <= 0.004 * (np.abs(x).astype(np.float64) @ np.abs(wf).T))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", _isas())
@pytest.mark.parametrize("scale", [60000.0, 1e-7], ids=["huge", "subnormal"])
def test_extreme_super_scales(t: T, isa: str, scale: float) -> None:
    rng = np.random.default_rng(7)
    k = 512
    w = _blocks(t, 5, k, rng, scale=scale)
    x = rng.standard_normal((2, k)).astype(np.float32)
    got = matmul(x, w, t, isa=isa)
    want = _reference(x, w, t, k)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=np.abs(want).max() * 1e-5)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", _isas())
def test_zero_blocks_and_zero_activations(t: T, isa: str) -> None:
    k = 768
    w = _blocks(t, 4, k, np.random.default_rng(3), scale=1.0)
    w[1] = 0  # an all-zero row: every block's scales and codes zero
    x = np.random.default_rng(4).standard_normal((3, k)).astype(np.float32)
    x[1] = 0.0  # an all-zero activation row
    x[2, :256] = 0.0  # one all-zero activation block
    got = matmul(x, w, t, isa=isa)
    assert np.all(got[:, 1] == 0.0) and np.all(got[1] == 0.0)
    np.testing.assert_allclose(got, _reference(x, w, t, k), rtol=1e-4, atol=1e-3)


def test_simd_paths_agree_with_portable() -> None:
    """Every ISA's kernels give the portable C's products bit for bit: each block's integer sum is exact, and
    every kernel adds the blocks in the same order with the same fused multiply-adds. Covered: one activation
    row, groups of rows (2, 3, 4 and a remainder) and the tiled product (12 rows and more, each remainder of
    its row groups, 32 or 16 weight rows a tile, and weight rows left over past the last tile)."""
    rng = np.random.default_rng(11)
    for t in TYPES:
        w = _blocks(t, 70, 1024, rng, scale=1e-2)
        for m in (1, 4, 7, 8, 13, 14, 15, 40):
            x = rng.standard_normal((m, 1024)).astype(np.float32)
            base = matmul(x, w, t, isa="portable")
            for isa in _isas():
                np.testing.assert_array_equal(matmul(x, w, t, isa=isa), base, err_msg=f"{t.name} {isa} m={m}")


@pytest.mark.parametrize("isa", _isas())
def test_nan_and_inf_activations_give_nan_never_numbers(isa: str) -> None:
    w = _blocks(T.Q4_K, 3, 512, np.random.default_rng(2), scale=1e-2)
    x = np.random.default_rng(3).standard_normal((3, 512)).astype(np.float32)
    x[0, 7], x[1, 300] = np.nan, np.inf
    got = matmul(x, w, T.Q4_K, isa=isa)
    assert np.isnan(got[:2]).all() and np.isfinite(got[2]).all()


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("isa", _isas())
def test_a_row_gives_the_same_bits_alone_and_among_others(t: T, isa: str) -> None:
    """Batch-invariant rows: greedy speculative decoding's guarantee rests on a row's product not depending
    on how many rows share the call (one, a group of four, a remainder, a prompt's tiled product)."""
    rng = np.random.default_rng(5)
    w = _blocks(t, 41, 768, rng, scale=1e-2)
    for m in (7, 19):
        x = rng.standard_normal((m, 768)).astype(np.float32)
        together = matmul(x, w, t, isa=isa)
        for r in range(m):
            np.testing.assert_array_equal(matmul(x[r : r + 1], w, t, isa=isa)[0], together[r])


def test_shapes_it_does_not_take_are_refused() -> None:
    w = np.zeros((2, row_bytes(T.Q4_K, 256)), np.uint8)
    with pytest.raises(ValueError, match="take no type"):
        matmul(np.zeros((1, 300), np.float32), w, T.Q4_K)
    with pytest.raises(ValueError, match="bytes"):
        matmul(np.zeros((1, 512), np.float32), w, T.Q4_K)
    with pytest.raises(ValueError, match="take no type"):
        matmul(np.zeros((1, 256), np.float32), w, T.Q8_0)
