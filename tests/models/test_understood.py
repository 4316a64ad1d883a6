"""What the own graphs do not implement stops them with a clear error instead of being ignored: a tensor the
builder would not read (Llama 3.1's rope_freqs, an extra norm) and RoPE scaling metadata. llama.cpp, which
knows them, still runs the file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.registry import DecoderOptions, open_decoder
from edge.errors import ModelFormatError
from edge.models.gguf_file import open_gguf
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")


def _copy(src: Path, dst: Path, tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> Path:
    """`src` with extra tensors and metadata values (float or str) added."""
    reader = GGUFReader(str(src))
    w = GGUFWriter(str(dst), str(reader.fields["general.architecture"].contents()))
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for key, value in meta.items():
        if isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_float32(key, float(value))
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data))
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", TinySpec(arch="llama"))


def _graph(path: Path) -> None:
    GraphDecoder(open_gguf(path), GraphOptions(backend="ort", threads=1, capacity=32)).close()


def test_llama3_rope_frequency_factors_are_refused_not_ignored(tiny: Path, tmp_path: Path) -> None:
    factors = np.linspace(1.0, 8.0, TinySpec().head_dim // 2, dtype=np.float32)
    path = _copy(tiny, tmp_path / "rope_freqs.gguf", {"rope_freqs.weight": factors}, {})
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
    path = _copy(tiny, tmp_path / "qknorm.gguf", {"blk.0.attn_q_norm.weight": norm}, {})
    with pytest.raises(ModelFormatError, match=r"blk\.0\.attn_q_norm\.weight"):
        _graph(path)


@pytest.mark.parametrize(
    "meta",
    [
        {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0},
        {"llama.rope.scaling.factor": 2.0},
    ],
)
def test_rope_scaling_is_refused(tiny: Path, tmp_path: Path, meta: dict[str, Any]) -> None:
    path = _copy(tiny, tmp_path / "scaled.gguf", {}, meta)
    with pytest.raises(ModelFormatError, match="RoPE scaling"):
        _graph(path)


def test_no_scaling_declared_runs(tiny: Path, tmp_path: Path) -> None:
    path = _copy(tiny, tmp_path / "none.gguf", {}, {"llama.rope.scaling.type": "none"})
    _graph(path)
