"""What the own graphs do not implement stops them with a clear error instead of being ignored: a tensor the
builder would not read (Llama 3.1's rope_freqs, an extra norm) and RoPE scaling metadata. llama.cpp, which
knows them, still runs the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFValueType as T

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.registry import DecoderOptions, open_decoder
from edge.errors import ModelFormatError
from edge.models.gguf_file import open_gguf
from tests.reliability.ggufs import rewrite_gguf
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", TinySpec(arch="llama"))


def _graph(path: Path) -> None:
    GraphDecoder(open_gguf(path), GraphOptions(backend="ort", threads=1, capacity=32)).close()


def test_llama3_rope_frequency_factors_are_refused_not_ignored(tiny: Path, tmp_path: Path) -> None:
    factors = np.linspace(1.0, 8.0, TinySpec().head_dim // 2, dtype=np.float32)
    path = rewrite_gguf(tiny, tmp_path / "rope_freqs.gguf", extra_tensors={"rope_freqs.weight": factors})
    with pytest.raises(ModelFormatError, match=r"rope_freqs\.weight.*Llama 3") as exc:
        _graph(path)
    assert "--backend llamacpp" in (exc.value.hint or "")
    dec = open_decoder("llamacpp", path, "cpu", DecoderOptions(n_ctx=32, n_threads=1))  # llama.cpp knows it
    try:
        assert np.isfinite(dec.forward([1, 2, 3])).all()
    finally:
        dec.close()


def test_a_tensor_the_builder_does_not_read_is_refused(tiny: Path, tmp_path: Path) -> None:
    norm = np.ones(TinySpec().head_dim, np.float32)  # QK-norm is a qwen3 / gemma3 trait, not llama's
    path = rewrite_gguf(tiny, tmp_path / "qknorm.gguf", extra_tensors={"blk.0.attn_q_norm.weight": norm})
    with pytest.raises(ModelFormatError, match=r"blk\.0\.attn_q_norm\.weight"):
        _graph(path)


@pytest.mark.parametrize(
    "meta",
    [
        {"llama.rope.scaling.type": ("linear", T.STRING), "llama.rope.scaling.factor": (4.0, T.FLOAT32)},
        {"llama.rope.scaling.factor": (2.0, T.FLOAT32)},
    ],
)
def test_rope_scaling_is_refused(tiny: Path, tmp_path: Path, meta: dict[str, Any]) -> None:
    path = rewrite_gguf(tiny, tmp_path / "scaled.gguf", meta)
    with pytest.raises(ModelFormatError, match="RoPE scaling"):
        _graph(path)


def test_no_scaling_declared_runs(tiny: Path, tmp_path: Path) -> None:
    path = rewrite_gguf(tiny, tmp_path / "none.gguf", {"llama.rope.scaling.type": ("none", T.STRING)})
    _graph(path)
