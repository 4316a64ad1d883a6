"""One checked way in for embedding models: a catalog name (or alias) pulled, SHA-256-verified and unpacked
on first use, a local sentence-transformers folder (models/encoder_folder.py) or a BERT GGUF
(models/bert_gguf.py); each read and checked before a graph is built. A chat model named here is refused,
saying what it is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from edge.errors import ModelFormatError, ModelNotFoundError
from edge.models.catalog import CATALOG, lookup
from edge.models.encoder_folder import EncoderSource, open_encoder_folder
from edge.models.store import PullProgress

__all__ = ["CheckedEncoder", "check_encoder", "embedding_names", "is_embedding_model"]


@dataclass(frozen=True, eq=False)
class CheckedEncoder:
    name: str  # the catalog name, or the folder's name
    folder: EncoderSource


def embedding_names() -> list[str]:
    """The catalog's embedding models, by name."""
    return [e.name for e in CATALOG.values() if e.embedding]


def is_embedding_model(ref: str) -> bool:
    """Whether a MODEL argument names an embedding model (a catalog one, a sentence-transformers folder, a
    BERT GGUF)."""
    entry = lookup(ref)
    if entry is not None:
        return entry.embedding
    path = Path(ref).expanduser()
    if path.suffix == ".gguf" and path.is_file():  # a BERT GGUF (one header read, no tensors)
        from edge.models.gguf_file import open_gguf

        try:
            return open_gguf(path).metadata.get("general.architecture") == "bert"
        except ModelFormatError:
            return False
    return (path / "modules.json").is_file()


def check_encoder(
    model: str | os.PathLike[str], *, on_progress: PullProgress | None = None
) -> CheckedEncoder:
    ref = os.fspath(model)
    entry = lookup(ref)
    if entry is not None:
        if not entry.embedding:
            raise ModelFormatError(
                f"{entry.name} is a chat model (text generation), not an embedding model",
                hint=f"embedding models: {', '.join(embedding_names())}",
            )
        from edge.models.resolve import resolve_model
        from edge.models.unpack import unpacked_folder

        archive = resolve_model(entry.name, on_progress=on_progress)
        return CheckedEncoder(entry.name, open_encoder_folder(unpacked_folder(entry, archive)))
    path = Path(ref).expanduser()
    if (path / "modules.json").is_file() or (path / "config.json").is_file():
        return CheckedEncoder(path.name, open_encoder_folder(path))
    if path.is_file() and path.suffix == ".gguf":
        from edge.models.bert_gguf import open_bert_gguf

        return CheckedEncoder(path.name, open_bert_gguf(path))
    if path.is_file():
        raise ModelFormatError(
            f"{path.name} is not an embedding model edge reads",
            hint="pass a sentence-transformers folder (modules.json, config.json, model.safetensors)",
        )
    raise ModelNotFoundError(
        f"no embedding model named {ref!r} and no such folder",
        hint=f"use a catalog name ({', '.join(embedding_names())}) or a sentence-transformers folder",
    )
