"""What the own graphs do not implement stops them with a clear error instead of being ignored: a tensor the
family's builder would not read (an extra norm, a bias, frequency factors of another family) and RoPE scaling
metadata other than linear. llama.cpp, which knows them, still runs the file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter
from gguf import GGUFValueType as T

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.registry import DecoderOptions, open_decoder
from edge.errors import ModelFormatError
from edge.models.gguf_file import open_gguf
from tests.reliability.ggufs import field_value, rewrite_gguf
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", TinySpec(arch="llama"))


def _graph(path: Path) -> None:
    GraphDecoder(open_gguf(path), GraphOptions(backend="ort", threads=1, capacity=32)).close()


def test_rope_frequency_factors_outside_llama_are_refused_not_ignored(tmp_path: Path) -> None:
    """rope_freqs.weight is implemented for llama (test_graph_engine's llama3 model); a qwen2 file holding it
    is one llama.cpp would not read either: refused, naming the tensor and what it is."""
    src = write_tiny_model(tmp_path / "qwen2.gguf", TinySpec(arch="qwen2"))
    factors = np.linspace(1.0, 8.0, TinySpec().head_dim // 2, dtype=np.float32)
    path = rewrite_gguf(src, tmp_path / "rope_freqs.gguf", extra_tensors={"rope_freqs.weight": factors})
    with pytest.raises(ModelFormatError, match=r"rope_freqs\.weight.*Llama 3") as exc:
        _graph(path)
    assert "--backend llamacpp" in (exc.value.hint or "")


def test_llama3_rope_frequency_factors_run_on_both_engines(tiny: Path, tmp_path: Path) -> None:
    factors = np.linspace(1.0, 8.0, TinySpec().head_dim // 2, dtype=np.float32)
    path = rewrite_gguf(tiny, tmp_path / "rope_freqs.gguf", extra_tensors={"rope_freqs.weight": factors})
    _graph(path)
    dec = open_decoder("llamacpp", path, "cpu", DecoderOptions(n_ctx=32, n_threads=1))
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
        {"llama.rope.scaling.type": ("yarn", T.STRING), "llama.rope.scaling.factor": (4.0, T.FLOAT32)},
        {"llama.rope.scaling.type": ("longrope", T.STRING)},
        {"llama.rope.scaling.type": ("llama3", T.STRING)},  # llama.cpp reads llama3 scaling from rope_freqs
        {"llama.rope.scaling.factor": ("four", T.STRING)},
    ],
)
def test_rope_scaling_not_implemented_is_refused(tiny: Path, tmp_path: Path, meta: dict[str, Any]) -> None:
    path = rewrite_gguf(tiny, tmp_path / "scaled.gguf", meta)
    with pytest.raises(ModelFormatError, match=r"rope\.scaling"):
        _graph(path)


@pytest.mark.parametrize(
    ("arch", "tensor", "shape"),
    [
        ("qwen3", "blk.0.attn_q.bias", (64,)),  # qwen3 has no biases (llama.cpp does not load them)
        ("phi3", "blk.0.ffn_gate.weight", (128, 64)),  # phi3's gate lives in ffn_up
        ("phi3", "rope_freqs.weight", (8,)),  # llama's factors table, not phi3's
        ("qwen2", "blk.0.attn_output.bias", (64,)),
        ("gemma3", "rope_factors_long.weight", (8,)),
    ],
)
def test_a_tensor_outside_the_family_is_refused(
    arch: str, tensor: str, shape: tuple[int, ...], tmp_path: Path
) -> None:
    src = write_tiny_model(tmp_path / f"{arch}.gguf", TinySpec(arch=arch))
    extra = {tensor: np.ones(shape, np.float32)}
    path = rewrite_gguf(src, tmp_path / "extra.gguf", extra_tensors=extra)
    with pytest.raises(ModelFormatError, match=re.escape(repr(tensor))):
        _graph(path)


def test_no_scaling_declared_runs(tiny: Path, tmp_path: Path) -> None:
    path = rewrite_gguf(tiny, tmp_path / "none.gguf", {"llama.rope.scaling.type": ("none", T.STRING)})
    _graph(path)


def _as_arch(src: Path, dst: Path, arch: str) -> Path:
    """The tiny llama relabelled as another llama.cpp architecture (its keys renamed)."""
    reader = GGUFReader(src)
    w = GGUFWriter(dst, arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value, vtype, sub = field_value(field)
        w.add_key_value(key.replace("llama.", f"{arch}.", 1), value, vtype, sub)
    for t in reader.tensors:
        w.add_tensor(t.name, np.asarray(t.data).copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_an_architecture_without_a_builder_runs_on_llamacpp(tiny: Path, tmp_path: Path) -> None:
    """mistral3 (llama's tensors, llama.cpp knows it): the own graphs refuse it naming what they support and
    llama.cpp; llama.cpp runs it."""
    path = _as_arch(tiny, tmp_path / "mistral3.gguf", "mistral3")
    with pytest.raises(ModelFormatError, match="'mistral3' has no graph builder") as exc:
        _graph(path)
    assert "qwen3" in (exc.value.hint or "") and "--backend llamacpp" in (exc.value.hint or "")
    dec = open_decoder("llamacpp", path, "cpu", DecoderOptions(n_ctx=32, n_threads=1))
    try:
        assert np.isfinite(dec.forward([1, 2, 3])).all()
    finally:
        dec.close()
