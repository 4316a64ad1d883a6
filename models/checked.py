"""One checked way in: every model edge opens (API, CLI, server, bench, eval, drafts) passes here first.

A `CheckedModel` is the proof that a file passed every check edge makes before native code (llama.cpp,
OpenVINO GenAI's GGUF reader) reads it: a catalog file's SHA-256 (models/store.py: verified when pulled, its
marker tied to the file's size and mtime), the whole layout (models/gguf_file.py: header, metadata, tensor
table, bounds), `block_count` against the tensors and the tokenizer built from the metadata (lying
vocabularies are refused here; llama.cpp aborts the process on some). Tensor shapes against the
hyper-parameters are the own graph builder's check (models/arch.py), made when a graph is built; llama.cpp
checks them itself and fails cleanly.

The openers (devices/registry.open_decoder, devices.llamacpp.LlamaCppDecoder) take a CheckedModel, or check
a bare path themselves through `as_checked`, so no caller can reach native code around these checks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from edge.errors import ModelFormatError
from edge.models.arch import check_block_count
from edge.models.artifact import Artifact, is_artifact, open_artifact
from edge.models.catalog import CATALOG, DEFAULT_MODEL, lookup
from edge.models.gguf_file import GGUFFile, open_gguf
from edge.models.resolve import resolve_model
from edge.models.store import PullProgress
from edge.models.tokenizer import Tokenizer, load_tokenizer

__all__ = ["CheckedModel", "as_checked", "check_model"]


@dataclass(frozen=True, eq=False)
class CheckedModel:
    """A model that passed `check_model`. `gguf` holds the metadata (an artifact's own metadata file for
    `edge convert` output, whose weights are its partitions); `name` is the catalog name or the file name."""

    name: str
    path: Path
    gguf: GGUFFile
    tokenizer: Tokenizer
    artifact: Artifact | None = None

    def source(self) -> CheckedModel:
        """The GGUF itself: an artifact's source file (llama.cpp runs that), checked, else this model."""
        return self if self.artifact is None else self._source

    @cached_property
    def _source(self) -> CheckedModel:  # once: finding the source hashes the whole file
        assert self.artifact is not None
        return _check_path(self.artifact.source_path(), self.name)


def check_model(
    model: str | os.PathLike[str] | None = None,
    *,
    pull_missing: bool = True,
    on_progress: PullProgress | None = None,
) -> CheckedModel:
    """Resolve `model` (a catalog name, pulled and SHA-256-verified on first use; a .gguf path; an `edge
    convert` directory; None: the default model) and check it. Raises ModelNotFoundError, ModelFormatError or
    TokenizerError, in bounded time and memory, before anything native has read the file."""
    ref = DEFAULT_MODEL if model is None else os.fspath(model)
    entry = lookup(ref)
    if entry is not None and entry.embedding:
        raise ModelFormatError(
            f"{entry.name} is an embedding model: it makes vectors, not text",
            hint="use edge.load_embedder, `edge embed` or /v1/embeddings",
        )
    path = resolve_model(ref, pull_missing=pull_missing, on_progress=on_progress)
    return _check_path(path, ref if ref in CATALOG else path.name)


def as_checked(model: CheckedModel | str | os.PathLike[str]) -> CheckedModel:
    """`model` itself when checked already, else the check of that path (never pulled: a path is a file)."""
    if isinstance(model, CheckedModel):
        return model
    path = Path(model)
    return _check_path(resolve_model(str(path), pull_missing=False), path.name)


def _check_path(path: Path, name: str) -> CheckedModel:
    if is_artifact(path):
        artifact = open_artifact(path)
        gguf = artifact.metadata  # tokenizer, template and hyper-parameters; weights are the partitions
    else:
        artifact = None
        gguf = open_gguf(path)  # the whole layout, every offset and size against the file
        # NOTE: llama.cpp aborts the process (GGML_ASSERT) on some lying metadata, e.g. a vocabulary with the
        # same text twice or a block_count beyond the tensors: both are checked before it reads them.
        check_block_count(gguf.metadata, gguf.tensors)
    tokenizer = load_tokenizer(gguf.metadata)
    return CheckedModel(name, path, gguf, tokenizer, artifact)
