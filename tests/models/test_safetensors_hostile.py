"""Hostile and broken safetensors files and sentence-transformers folders: each ends in ModelFormatError
naming the rule that fired, before any tensor is read (as hostile GGUFs do: test_gguf_hostile.py)."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edge.errors import ModelFormatError
from edge.models.encoder_folder import open_encoder_folder
from edge.models.safetensors_file import open_safetensors
from tests.encoder_reference import write_tiny_folder


def craft(path: Path, header: dict, data: bytes, *, length: int | None = None) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def entry(dtype: str = "F32", shape: list[int] | None = None, offsets: list[int] | None = None) -> dict:
    return {"dtype": dtype, "shape": shape or [2, 2], "data_offsets": offsets or [0, 16]}


CASES = {
    "offsets past the end": ({"w": entry(offsets=[0, 32])}, 16, "outside the data"),
    "overlapping tensors": (
        {"a": entry(offsets=[0, 16]), "b": entry(shape=[2], offsets=[8, 16])},
        16,
        "overlaps",
    ),
    "a hole between tensors": ({"a": entry(shape=[2], offsets=[8, 16])}, 16, "belong to none"),
    "bytes after the last": ({"a": entry()}, 20, "after the last tensor"),
    "unknown dtype": ({"w": entry(dtype="F8_E4M3X")}, 16, "unknown dtype"),
    "size not dtype x shape": ({"w": entry(dtype="F16")}, 16, "needs 8"),
    "negative shape": ({"w": entry(shape=[-1, 4])}, 16, "not a list"),
    "float shape": ({"w": {"dtype": "F32", "shape": [2.0, 2], "data_offsets": [0, 16]}}, 16, "not a list"),
    "extra key": ({"w": {**entry(), "x": 1}}, 16, "exactly dtype"),
    "metadata not strings": ({"__metadata__": {"a": 1}, "w": entry()}, 16, "__metadata__"),
    "reversed offsets": ({"w": entry(offsets=[16, 0])}, 16, "outside the data"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_hostile_header_is_refused(tmp_path: Path, case: str) -> None:
    header, n_data, match = CASES[case]
    path = craft(tmp_path / "m.safetensors", header, b"\0" * n_data)
    with pytest.raises(ModelFormatError, match=match):
        open_safetensors(path)


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x01\x00", "too short"),
        (struct.pack("<Q", 1 << 40) + b"{}", "header length"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
    ],
)
def test_broken_framing_is_refused(tmp_path: Path, raw: bytes, match: str) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(raw)
    with pytest.raises(ModelFormatError, match=match):
        open_safetensors(path)


def test_the_real_library_writes_what_the_reader_reads(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    h = np.linspace(-2, 2, 6).astype(np.float16)
    save_file({"w": w, "h": h, "i": np.arange(3, dtype=np.int64)}, str(tmp_path / "m.safetensors"))
    f = open_safetensors(tmp_path / "m.safetensors")
    assert np.array_equal(f.array("w"), w)
    assert np.array_equal(f.array("h"), h.astype(np.float32))
    assert f.tensors["i"].dtype == "I64"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_folder(tmp_path_factory.mktemp("st") / "tiny")


def _edited(tiny: Path, tmp_path: Path, name: str, edit: Callable[[Any], Any]) -> Path:
    folder = tmp_path / "f"
    shutil.copytree(tiny, folder)
    path = folder / name
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return folder


@pytest.mark.parametrize(
    ("name", "edit", "match"),
    [
        ("config.json", lambda c: {**c, "hidden_size": 48}, "has shape"),
        ("config.json", lambda c: {**c, "num_hidden_layers": 3}, "no tensor"),
        ("config.json", lambda c: {**c, "hidden_act": "relu"}, "hidden_act"),
        (
            "config.json",
            lambda c: {**c, "position_embedding_type": "relative_key"},
            "position_embedding_type",
        ),
        ("config.json", lambda c: {**c, "model_type": "roberta"}, "model_type"),
        (
            "modules.json",
            lambda m: [*m, {"type": "sentence_transformers.models.Dense", "path": "3"}],
            "not covered",
        ),
        ("modules.json", lambda m: [m[0], {**m[1], "path": "../x"}, m[2]], "outside the folder"),
        ("1_Pooling/config.json", lambda p: {**p, "pooling_mode_cls_token": True}, "pooling"),
        ("sentence_bert_config.json", lambda s: {**s, "max_seq_length": 4096}, "max_seq_length"),
    ],
)
def test_folder_declarations_are_checked(
    tiny: Path, tmp_path: Path, name: str, edit: Callable[[Any], Any], match: str
) -> None:
    with pytest.raises(ModelFormatError, match=match):
        open_encoder_folder(_edited(tiny, tmp_path, name, edit))


def test_a_weight_of_the_wrong_dtype_is_refused(tiny: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "f"
    shutil.copytree(tiny, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["embeddings.LayerNorm.bias"] = tensors["embeddings.LayerNorm.bias"].astype(np.int32)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ModelFormatError, match="is I32"):
        open_encoder_folder(folder)


def test_an_unknown_tensor_is_refused(tiny: Path, tmp_path: Path) -> None:
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "f"
    shutil.copytree(tiny, folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["encoder.layer.0.attention.self.rotary.weight"] = np.zeros(4, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ModelFormatError, match="does not know"):
        open_encoder_folder(folder)
