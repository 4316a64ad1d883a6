"""A catalog model in a local wheel index: random bytes split over wheels, as the real models are on PyPI."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import numpy as np

from edge.models.catalog import CatalogEntry, WheelPart


def make_wheel(folder: Path, name: str, member: str, data: bytes) -> None:
    dist = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(folder / f"{name}-1.0-py3-none-any.whl", "w") as z:
        z.writestr(member, data)
        z.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        z.writestr(
            f"{dist}/WHEEL",
            "Wheel-Version: 1.0\nGenerator: edge-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{dist}/RECORD", "")


def wheel_model(
    folder: Path, name: str, parts: int, part_bytes: int, seed: int
) -> tuple[CatalogEntry, bytes]:
    """Wheels `edge<name>test1..N` in `folder`, each holding one part; the catalog entry and the whole file."""
    rng = np.random.default_rng(seed)
    wheels, blobs = [], []
    for i in range(1, parts + 1):
        package = f"edge{name.replace('-', '')}test{i}"
        blob = rng.integers(0, 256, part_bytes, dtype=np.uint8).tobytes()
        make_wheel(folder, package, f"{package}/part.bin", blob)
        wheels.append(WheelPart(package, "1.0", f"{package}/part.bin"))
        blobs.append(blob)
    data = b"".join(blobs)
    entry = CatalogEntry(
        name=f"{name}-test",
        arch="llama",
        file=f"{name}-test.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        licence="test",
        description=f"{parts} wheels of random bytes",
        parts=tuple(wheels),
        chat=False,
    )
    return entry, data
