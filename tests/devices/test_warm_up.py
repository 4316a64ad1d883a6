"""The load-time warm-up (RingDecoder.warm_up): where a runtime prepares its weights on its first runs
(OpenVINO), a decoder runs a many-row and a one-row forward at load and forgets them, so the first prompt runs
warm; it leaves no trace in the decoder's state or its results."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from edge.devices.graph_decoder import GraphDecoder
from edge.devices.registry import DecoderOptions, open_decoder, runnable_backends
from edge.devices.ring_decoder import WARM_ROWS
from edge.devices.runners import Runner
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")

PROMPT = [1, *range(300, 311)]


class Recording:
    """The decoder's real runner, recording the rows of each run and saying it prepares on its first runs."""

    prepares_on_first_run = True

    def __init__(self, runner: Runner) -> None:
        self.inner, self.backend, self.device = runner, runner.backend, runner.device
        self.rows: list[int] = []

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
        self.rows.append(int(feeds["hidden"].shape[1]))
        return self.inner.run(feeds, outputs)

    def close(self) -> None:
        self.inner.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("warm") / "tiny.gguf", TinySpec(seed=5))


def _open(path: Path, backend: str) -> GraphDecoder:
    dec = open_decoder(backend, path, "cpu", DecoderOptions(n_ctx=128, n_threads=1, precision="exact"))
    assert isinstance(dec, GraphDecoder)
    return dec


def test_warm_up_runs_both_kernel_kinds_and_forgets_them(tiny: Path) -> None:
    dec = _open(tiny, "ort")  # ONNX Runtime prepacks at session creation: no warm-up at load
    try:
        expected = dec.forward(PROMPT)
        dec.reset()
        rec = Recording(dec.runner)
        dec.runner = rec
        assert dec.warm_up([rec])
        assert rec.rows == [min(WARM_ROWS, dec.chunk), 1]
        assert dec.position == 0 and dec.kv_fill().position == 0
        np.testing.assert_array_equal(dec.forward(PROMPT), expected)
    finally:
        dec.close()


def test_no_warm_up_over_held_tokens_or_for_runners_that_prepare_at_load(tiny: Path) -> None:
    dec = _open(tiny, "ort")
    try:
        assert not dec.runner.prepares_on_first_run
        assert not dec.warm_up([dec.runner])
        dec.forward(PROMPT[:4])
        rec = Recording(dec.runner)
        assert not dec.warm_up([rec])  # the tokens it holds are the user's
        assert rec.rows == [] and dec.position == 4
    finally:
        dec.close()


@pytest.mark.skipif("openvino" not in runnable_backends(), reason="openvino does not import")
def test_openvino_decoder_is_warmed_at_load_and_fresh(tiny: Path) -> None:
    dec = _open(tiny, "openvino")
    try:
        assert dec.runner.prepares_on_first_run
        assert dec.runner._repack_runs == 0  # the warm-up's two runs were the repacking runs
        assert dec.position == 0 and dec.kv_fill().position == 0
        first = dec.forward(PROMPT)
        dec.reset()
        np.testing.assert_array_equal(dec.forward(PROMPT), first)
        # and the same logits as ONNX Runtime's exact graph, to fp32 rounding
        ort = _open(tiny, "ort")
        try:
            np.testing.assert_allclose(ort.forward(PROMPT), first, rtol=1e-3, atol=1e-3)
        finally:
            ort.close()
    finally:
        dec.close()
