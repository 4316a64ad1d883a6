"""An embedding model's zip unpacked beside it: members that point outside the folder are refused, the
catalog's member hashes are checked, and a folder changed since it was unpacked is unpacked again."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from edge.errors import ChecksumError, ModelFormatError
from edge.models.catalog import CATALOG, CatalogEntry
from edge.models.unpack import unpacked_folder

Entry = tuple[CatalogEntry, bytes]


@pytest.fixture
def entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Entry:
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache" / "models").mkdir(parents=True)
    body = b"weights"
    return dataclasses.replace(
        CATALOG["all-minilm-l6-v2"], members=(("model.safetensors", hashlib.sha256(body).hexdigest()),)
    ), body


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_unpacks_once_and_again_when_changed(entry: Entry, tmp_path: Path) -> None:
    e, body = entry
    archive = _zip(tmp_path / "m.zip", {"model.safetensors": body, "1_Pooling/config.json": b"{}"})
    folder = unpacked_folder(e, archive)
    assert (folder / "model.safetensors").read_bytes() == body and (
        folder / "1_Pooling/config.json"
    ).is_file()
    (folder / "1_Pooling/config.json").write_text('{"changed": true}')
    again = unpacked_folder(e, archive)
    assert (again / "1_Pooling/config.json").read_bytes() == b"{}"  # the marker no longer matched


@pytest.mark.parametrize("name", ["../evil.json", "/abs.json", "a\\..\\..\\b.json"])
def test_members_outside_the_folder_are_refused(entry: Entry, tmp_path: Path, name: str) -> None:
    e, body = entry
    archive = _zip(tmp_path / "m.zip", {"model.safetensors": body, name: b"x"})
    with pytest.raises(ModelFormatError, match="outside its folder"):
        unpacked_folder(e, archive)
    assert not (tmp_path / "evil.json").exists()


def test_a_member_with_the_wrong_hash_is_refused(entry: Entry, tmp_path: Path) -> None:
    e, _ = entry
    archive = _zip(tmp_path / "m.zip", {"model.safetensors": b"other"})
    with pytest.raises(ChecksumError, match=r"model\.safetensors has sha256"):
        unpacked_folder(e, archive)
    assert not any(p.is_dir() for p in (tmp_path / "cache" / "models").iterdir())  # nothing left half-made
