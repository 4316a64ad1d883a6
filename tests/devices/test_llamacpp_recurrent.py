"""A recurrent model on llama.cpp (a tiny Mamba): its state cannot be cut at a position, so the decoder declares
no rollback (nothing drafts on it) and a rollback llama.cpp refuses raises, leaving `position` true to the KV."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
from edge.devices.registry import runnable_backends
from edge.errors import DeviceError
from edge.kvcache import RollbackError
from tests.tiny_models import TinySpec, write_tiny_mamba, write_tiny_model

pytestmark = pytest.mark.skipif(
    "llamacpp" not in runnable_backends(), reason="llama-cpp-python not installed"
)

PROMPT = [1, *range(260, 268)]


@pytest.fixture(scope="module")
def mamba_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_mamba(tmp_path_factory.mktemp("mamba") / "mamba.gguf")


def _open(path: Path) -> LlamaCppDecoder:
    return LlamaCppDecoder(path, LlamaCppOptions(n_ctx=256, n_threads=1))


@pytest.fixture
def mamba(mamba_file: Path) -> Iterator[LlamaCppDecoder]:
    dec = _open(mamba_file)
    yield dec
    dec.close()


def _alone(path: Path, tokens: list[int]) -> np.ndarray:
    """The last row a fresh decoder gives for `tokens`."""
    dec = _open(path)
    try:
        return dec.forward(tokens, last_only=True)[-1]
    finally:
        dec.close()


def test_a_recurrent_model_declares_no_rollback(mamba: LlamaCppDecoder, tmp_path: Path) -> None:
    caps = mamba.capabilities()
    assert caps.max_rollback == 0 and caps.batching is None
    tiny = _open(write_tiny_model(tmp_path / "llama.gguf", TinySpec()))
    try:  # a transformer's KV: any suffix
        assert tiny.capabilities().max_rollback is None
    finally:
        tiny.close()


def test_a_refused_rollback_raises_and_keeps_the_state(mamba: LlamaCppDecoder, mamba_file: Path) -> None:
    mamba.forward(PROMPT)
    for n in (1, 3):
        with pytest.raises(RollbackError, match=f"from position {len(PROMPT) - n} on.*still holds all 9"):
            mamba.rollback(n)
    assert mamba.position == len(PROMPT) and mamba.kv_fill().fill == len(PROMPT)
    row = mamba.forward([5])[-1]  # the state ran on from all 9 tokens, as a fresh prefill of 10
    np.testing.assert_allclose(row, _alone(mamba_file, [*PROMPT, 5]), rtol=1e-4, atol=1e-4)
    mamba.rollback(mamba.position)  # wholly: llama.cpp can
    assert mamba.position == 0
    np.testing.assert_allclose(mamba.forward(PROMPT)[-1], _alone(mamba_file, PROMPT), rtol=1e-4, atol=1e-4)


def test_a_decode_failed_past_the_state_empties_it(
    mamba: LlamaCppDecoder, mamba_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mamba.forward(PROMPT)
    real = mamba._ctx.decode

    def advanced_then_failed(batch: object) -> None:
        real(batch)  # the state moved on: no cut brings it back to the 9 tokens
        raise RuntimeError("llama_decode returned -3")

    monkeypatch.setattr(mamba._ctx, "decode", advanced_then_failed)
    with pytest.raises(DeviceError, match="could not be cut back to 9 and was emptied"):
        mamba.forward([5, 6])
    monkeypatch.undo()
    assert mamba.position == 0
    np.testing.assert_allclose(mamba.forward(PROMPT)[-1], _alone(mamba_file, PROMPT), rtol=1e-4, atol=1e-4)
