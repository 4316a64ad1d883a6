"""Staged attention makes a forward's rows independent of how many tokens it carries (kvcache/staging.py):
on ORT at --precision fast, k tokens verified in one forward give bit for bit the logits k one-token decode
steps give, for every family and weight form, through ring wraps, sliding windows and rollbacks. That is what
lets `--draft auto` draft greedy generations at --precision fast without changing them.

The invariance is kernel behaviour, measured on the machine (devices/invariance.py). Where a kernel rounds one
row differently (on an AVX2 CPU without AVX512-VNNI, MLAS's 4-bit block-32 int8 kernel does for a one-row
input, which the body linears of a decode step are), the decoder must withdraw the claim: these tests then
check that the rows really differ, so a withdrawn claim is never a hidden failure of staging itself."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.kvcache.staging import WINDOW, split_windows
from edge.models.gguf_file import open_gguf
from tests.models.test_graph_engine import KQUANT_DIMS, retype
from tests.tiny_models import TinySpec, write_tiny_model

Q = gguf.GGMLQuantizationType
N_GEN = 2 * WINDOW + 7  # crosses two window ends

# (spec, K-quant crafted into every 2-D tensor or None): gguf-py quantizes the others itself
CASES: dict[str, tuple[TinySpec, Q | None]] = {
    "llama-q4_1": (TinySpec(arch="llama", weight_type=Q.Q4_1), None),
    "qwen2-q8_0": (TinySpec(arch="qwen2", weight_type=Q.Q8_0), None),
    "qwen3-f32": (TinySpec(arch="qwen3"), None),
    "llama-f16": (TinySpec(arch="llama", weight_type=Q.F16), None),
    "qwen2-q5_0": (TinySpec(arch="qwen2", weight_type=Q.Q5_0), None),
    "qwen2-q3_k": (TinySpec(arch="qwen2", **KQUANT_DIMS), Q.Q3_K),
    "gemma3-q4_k": (TinySpec(arch="gemma3", n_layer=3, **KQUANT_DIMS), Q.Q4_K),  # sliding windows of 8
    "phi3-q5_k": (TinySpec(arch="phi3", **KQUANT_DIMS), Q.Q5_K),
    "llama-mha-q6_k": (TinySpec(arch="llama", **{**KQUANT_DIMS, "n_head_kv": 4}), Q.Q6_K),  # one query a head
}


def _model(name: str, tmp_path: Path) -> Path:
    spec, kquant = CASES[name]
    path = write_tiny_model(tmp_path / f"{name}.gguf", spec)
    if kquant is None:
        return path
    return retype(path, tmp_path / f"{name}-k.gguf", lambda n: kquant)


def _decoder(path: Path, capacity: int, staged: bool = True) -> GraphDecoder:
    opts = GraphOptions(backend="ort", precision="fast", staged=staged, capacity=capacity, sink=2, threads=1)
    return GraphDecoder(open_gguf(path), opts)


def _plain(dec: GraphDecoder, prompt: list[int], n: int) -> tuple[list[int], np.ndarray]:
    dec.reset()
    token = int(dec.forward(prompt, last_only=True)[-1].argmax())
    tokens, rows = [], []
    for _ in range(n):
        tokens.append(token)
        rows.append(dec.forward([token])[-1])
        token = int(rows[-1].argmax())
    return tokens, np.stack(rows)


@pytest.mark.parametrize("name", sorted(CASES))
# 40: the ring wraps during the prompt and the generation; 20: the ring is shorter than the staging window
@pytest.mark.parametrize("capacity", [2048, 40, 20])
def test_verify_rows_equal_decode_steps(name: str, capacity: int, tmp_path: Path) -> None:
    dec = _decoder(_model(name, tmp_path), capacity)
    try:
        claimed = dec.capabilities().batch_invariant
        found: list[int] = []
        rng = np.random.default_rng(7)
        prompt = [int(t) for t in rng.integers(3, 300, 37)]  # > WINDOW: the prefill layout first
        tokens, plain = _plain(dec, prompt, N_GEN)
        for sizes in ([5, 4, 3, 6, 2, 7, 1, 8, 9, 4, 17, 5], [17] * 5):
            dec.reset()
            dec.forward(prompt, last_only=True)
            rows, at = [], 0
            for size in sizes:
                size = min(size, N_GEN - at)
                if size <= 0:
                    break
                # a rejected draft first: its tokens are scored and rolled back, as speculation does
                junk = [int(t) for t in rng.integers(3, 300, 3)]
                dec.forward(tokens[at : at + 1] + junk)
                dec.rollback(4)
                rows.append(dec.forward(tokens[at : at + size]))
                at += size
            got = np.concatenate(rows)
            assert got.shape == plain.shape
            differing = [j for j in range(N_GEN) if not np.array_equal(got[j], plain[j])]
            assert not (claimed and differing), f"{name}: rows {differing[:5]} differ (batches {sizes})"
            found += differing
        # withdrawn only where this machine's kernels really round some row differently
        assert claimed or found, f"{name}: the claim was withdrawn but every row is equal"
    finally:
        dec.close()


@pytest.mark.parametrize("name", ["llama-q4_1", "gemma3-q4_k", "qwen2-q8_0"])
@pytest.mark.parametrize("capacity", [2048, 40, 20])
def test_staged_decoding_matches_unstaged(name: str, capacity: int, tmp_path: Path) -> None:
    """Invariance alone would pass a mask that is wrong the same way at every step size: the staged graph must
    also attend over what the unstaged one does, so its logits differ only by int8 rounding (~0.05 here)."""
    path = _model(name, tmp_path)
    staged, unstaged = _decoder(path, capacity), _decoder(path, capacity, staged=False)
    try:
        prompt = [int(t) for t in np.random.default_rng(3).integers(3, 300, 37)]
        tokens, rows = _plain(staged, prompt, N_GEN)
        unstaged.forward(prompt, last_only=True)
        ref = np.stack([unstaged.forward([t])[-1] for t in tokens])
        worst = float(np.abs(rows - ref).max())
        assert worst < 0.25, f"{name} at capacity {capacity}: staged logits off by {worst}"
    finally:
        staged.close()
        unstaged.close()


def test_longer_verifies_void_the_claim(tmp_path: Path) -> None:
    """A forward of more than WINDOW tokens takes the prefill layout, whose rows are not invariant; a decoder
    whose undo log lets speculation verify that many tokens does not claim batch invariance."""
    path = _model("qwen2-q8_0", tmp_path)
    dec = _decoder(path, 2048)
    try:
        prompt = list(range(3, 40))
        tokens, plain = _plain(dec, prompt, WINDOW + 1)
        dec.reset()
        dec.forward(prompt, last_only=True)
        assert not np.array_equal(dec.forward(tokens), plain)
    finally:
        dec.close()
    opts = GraphOptions(backend="ort", precision="fast", capacity=2048, threads=1, max_rollback=WINDOW)
    dec = GraphDecoder(open_gguf(path), opts)
    try:
        assert dec.staged and not dec.capabilities().batch_invariant
    finally:
        dec.close()


@pytest.mark.parametrize(
    "override",
    [{"accuracy_level": 0}, {"head_accuracy_level": 0}, {"lowering": "nbits_fzp"}, {"lowering": "qdq"}],
)
def test_weight_options_keep_or_void_the_claim(override: dict[str, object], tmp_path: Path) -> None:
    """fp32 MatMulNBits (level 0, body or head) and ORT's float-zero-point form take another kernel for one
    row: a decoder built with them does not claim invariance; one that still claims it holds it."""
    path = _model("llama-q4_1", tmp_path)
    opts = GraphOptions(backend="ort", precision="fast", capacity=2048, threads=1, **override)  # type: ignore[arg-type]
    dec = GraphDecoder(open_gguf(path), opts)
    try:
        prompt = list(range(3, 40))
        tokens, plain = _plain(dec, prompt, 17)
        dec.reset()
        dec.forward(prompt, last_only=True)
        invariant = np.array_equal(dec.forward(tokens), plain)
        claimed = dec.capabilities().batch_invariant
        assert dec.staged and claimed == invariant
        # the others are never claimed; qdq (a float MatMul) where the machine's check finds it holds
        assert not claimed or override == {"lowering": "qdq"}
    finally:
        dec.close()


def test_a_forward_is_cut_at_window_ends() -> None:
    assert split_windows(0, 5) == [(0, 5)]
    assert split_windows(WINDOW - 2, 5) == [(0, 2), (2, 5)]
    assert split_windows(3 * WINDOW, WINDOW) == [(0, WINDOW)]


def test_unstaged_graph_differs_and_does_not_claim_it(tmp_path: Path) -> None:
    """The reason for staging, and that the test above can fail: the unstaged graph's rows change with the
    step size (one-row matmuls take another MLAS kernel, softmax lengths follow the step), and it does not
    claim the guarantee. Staging is the default only where it holds: ORT at --precision fast."""
    path = _model("qwen2-q8_0", tmp_path)
    dec = _decoder(path, 2048, staged=False)
    try:
        assert not dec.capabilities().batch_invariant
        prompt = list(range(3, 40))
        tokens, plain = _plain(dec, prompt, 8)
        dec.reset()
        dec.forward(prompt, last_only=True)
        assert not np.array_equal(dec.forward(tokens), plain)
    finally:
        dec.close()
    gguf_file = open_gguf(path)
    for backend, precision, staged in (
        ("ort", "fast", True),
        ("ort", "exact", False),
        ("openvino", "fast", False),
    ):
        dec = GraphDecoder(
            gguf_file, GraphOptions(backend=backend, precision=precision, capacity=64, threads=1)
        )
        try:
            assert dec.staged is staged and dec.capabilities().batch_invariant is staged
        finally:
            dec.close()


def test_the_claim_is_checked_on_this_machine_once(tmp_path: Path, edge_cache: Path) -> None:
    """The invariance measured here may not hold on another CPU or runtime build, so a decoder runs the check
    itself (devices/invariance.py) once per graph and machine, leaves its KV empty, and a cached verdict that
    it does not hold switches the claim off."""
    from edge.devices import invariance
    from edge.models.jsonstore import read_json, write_json

    path = _model("qwen2-q8_0", tmp_path)
    dec = _decoder(path, 2048)
    try:
        assert dec.capabilities().batch_invariant and dec.position == 0
        key = invariance._key(dec.graph_path, "ort")
        assert read_json(invariance._cache_file()).get(key) is True
    finally:
        dec.close()
    # as if this machine's kernels had failed the check
    write_json(invariance._cache_file(), {**read_json(invariance._cache_file()), key: False})
    dec = _decoder(path, 2048)
    try:
        assert not dec.capabilities().batch_invariant
    finally:
        dec.close()


def test_the_staged_graph_is_fused(tmp_path: Path) -> None:
    """ORT's pipeline fuses the staged form into one Attention per layer (the padded queries, the scattered
    window): no Softmax is left to run unfused."""
    import onnx

    dec = _decoder(_model("qwen2-q8_0", tmp_path), 2048)
    try:
        graph = onnx.load(str(dec.graph_path), load_external_data=False).graph
        ops = [n.op_type for n in graph.node]
        assert ops.count("Attention") == dec.cfg.n_layer and "Softmax" not in ops
        assert ops.count("ScatterND") == 2 * dec.cfg.n_layer
    finally:
        dec.close()
