"""A converted model on disk (`edge convert -o DIR`): ONNX partitions, embeddings, metadata and a manifest.

DIR/manifest.json          what it is: source (name, file, sha256), arch, target, quant, passes, partitions,
                           shapes; no timestamps, keys sorted, so equal inputs give equal bytes
DIR/metadata.gguf          the source's metadata alone (tokenizer, chat template, hyper-parameters)
DIR/embed.npy              token_embd rows in a GGUF block format (uint8 [n_vocab, row bytes]), decoded
                           per looked-up row by the numpy embed partition
DIR/part<i>.<shape>.onnx   partition i per shape variant: "dynamic", or "prefill" and "decode" (static)
DIR/part<i>.weights        its initializers (external data, shared by its shape variants)
DIR/part<i>.<shape>.mlpackage   coreml target: the Core ML program of each shape (devices/coreml.py), listed
                           in the partition's "mlpackages" once written
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGMLQuantizationType

from edge.errors import ModelFormatError, ModelNotFoundError
from edge.models.arch import ArchConfig
from edge.models.gguf_file import GGUFFile, open_gguf

__all__ = [
    "MANIFEST",
    "Artifact",
    "ArtifactPartition",
    "ArtifactShapes",
    "file_sha256",
    "is_artifact",
    "open_artifact",
    "record_mlpackages",
]

MANIFEST = "manifest.json"
FORMAT = 1


def is_artifact(path: str | Path) -> bool:
    p = Path(path)
    return p.is_dir() and (p / MANIFEST).is_file()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class ArtifactPartition:
    first_layer: int
    last_layer: int  # exclusive
    head: bool
    graphs: dict[str, str]  # shape variant -> file name
    weights: str
    mlpackages: dict[str, str] = field(default_factory=dict)  # shape variant -> .mlpackage dir (coreml)

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.last_layer)


@dataclass(frozen=True)
class ArtifactShapes:
    static: bool
    prefill_chunk: int | None = None  # static: the prefill graph's token count (decode: 1)
    capacity: int | None = None  # static: KV slots of global layers (sliding-window layers: their window)

    def to_dict(self) -> dict[str, Any]:
        return {"static": self.static, "prefill_chunk": self.prefill_chunk, "capacity": self.capacity}


class Artifact:
    """An opened artifact directory (manifest checked; files opened lazily)."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        try:
            self.target: str = manifest["target"]
            self.source: dict[str, Any] = manifest["source"]
            self.partitions = [
                ArtifactPartition(
                    int(p["first_layer"]),
                    int(p["last_layer"]),
                    bool(p["head"]),
                    dict(p["graphs"]),
                    p["weights"],
                    dict(p.get("mlpackages", {})),
                )
                for p in manifest["partitions"]
            ]
            s = manifest["shapes"]
            self.shapes = ArtifactShapes(bool(s["static"]), s.get("prefill_chunk"), s.get("capacity"))
            self._embed = manifest["embed"]
            self._tensor_names: list[str] = list(manifest["tensor_names"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFormatError(
                f"{path / MANIFEST}: not an edge artifact manifest ({exc!r})", hint="convert the model again"
            ) from None
        if manifest.get("format") != FORMAT:
            raise ModelFormatError(
                f"{path}: artifact format {manifest.get('format')!r}, this edge reads {FORMAT}",
                hint="convert the model again with this version of edge",
            )
        for part in self.partitions:
            for name in (*part.graphs.values(), part.weights):
                if Path(name).name != name or not (path / name).is_file():
                    raise ModelFormatError(f"{path}: partition file {name!r} is missing or not a plain name")
            for name in part.mlpackages.values():
                if Path(name).name != name or not (path / name).is_dir():
                    raise ModelFormatError(f"{path}: Core ML package {name!r} is missing or not a plain name")

    @cached_property
    def metadata(self) -> GGUFFile:
        """The source's metadata (no tensors)."""
        return open_gguf(self.path / self.manifest["metadata"])

    @cached_property
    def config(self) -> ArchConfig:
        return ArchConfig.from_gguf(self.metadata.metadata, set(self._tensor_names))

    def embedder(self) -> Callable[[Sequence[int]], np.ndarray]:
        """Token ids -> hidden [1, q, d] float32, rows decoded from the stored blocks."""
        from edge.models.weights import dequantize_raw

        e = self._embed
        raw = np.load(self.path / e["file"], mmap_mode="r")
        shape, qtype = [int(d) for d in e["shape"]], GGMLQuantizationType[e["ggml_type"]].value
        scale = np.float32(e["scale"]) if e.get("scale") is not None else None

        def embed(ids: Sequence[int]) -> np.ndarray:
            rows = dequantize_raw(raw, shape, qtype, ids=np.asarray(ids, np.int64), name="token_embd.weight")
            if scale is not None:
                rows = rows * scale
            return rows[None].astype(np.float32, copy=False)

        return embed

    def source_path(self, *, verify: bool = True) -> Path:
        """The GGUF the artifact was converted from (a catalog model by name, else its recorded path); with
        verify, its sha256 must match the manifest's."""
        from edge.models.resolve import resolve_model

        name, recorded = self.source.get("name"), self.source.get("path")
        if name:
            path = resolve_model(name)
        elif recorded and Path(recorded).is_file():
            path = Path(recorded)
        else:
            raise ModelNotFoundError(
                f"{self.path}: its source {self.source.get('file')!r} is not at {recorded!r}",
                hint="put the source GGUF back or convert again",
            )
        if verify and file_sha256(path) != self.source["sha256"]:
            raise ModelFormatError(
                f"{path} is not the file {self.path.name} was converted from (sha256 differs)",
                hint="convert the model again from this file",
            )
        return path

    def graph(self, index: int, variant: str) -> Path:
        return self.path / self.partitions[index].graphs[variant]

    def __repr__(self) -> str:
        return f"Artifact({self.path}, target={self.target}, {len(self.partitions)} partition(s))"


def open_artifact(path: str | Path) -> Artifact:
    p = Path(path)
    try:
        manifest = json.loads((p / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{p}: cannot read {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict):
        raise ModelFormatError(f"{p / MANIFEST} is not a JSON object")
    return Artifact(p, manifest)


def record_mlpackages(path: str | Path, packages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
    """List each partition's Core ML packages (shape variant -> directory name) in the manifest; returns it."""
    p = Path(path)
    manifest = open_artifact(p).manifest
    if len(packages) != len(manifest["partitions"]):
        raise ValueError(f"{len(packages)} package sets for {len(manifest['partitions'])} partitions")
    for part, pkgs in zip(manifest["partitions"], packages, strict=True):
        part["mlpackages"] = dict(pkgs)
    (p / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    open_artifact(p)  # the names written must pass the same checks as on reading
    return manifest


def embed_scale(cfg: ArchConfig) -> float | None:
    return math.sqrt(cfg.n_embd) if cfg.traits.embed_scale else None
