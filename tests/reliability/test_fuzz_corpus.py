"""The fuzz corpus (tests/reliability/corpus) replayed through the fuzz targets, plus a few hundred seeded
mutations: the quick, deterministic part of `python -m tests.reliability.fuzz` (which CI runs for minutes)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.reliability import fuzz


@pytest.mark.parametrize("target", sorted(fuzz.TARGETS))
def test_corpus_replays_cleanly(target: str) -> None:
    files = sorted((fuzz.CORPUS / target).iterdir())
    assert len(files) >= 5 and sum(f.stat().st_size for f in files) < 512 << 10  # small, kept in the repo
    assert all(f.stat().st_size <= fuzz.MAX_LEN[target] for f in files)
    for f in files:
        fuzz.TARGETS[target](f.read_bytes())


@pytest.mark.parametrize("target", sorted(fuzz.TARGETS))
def test_seeded_mutations_run_cleanly(target: str) -> None:
    rng = random.Random(target)
    seeds = [f.read_bytes() for f in sorted((fuzz.CORPUS / target).iterdir())]
    for _ in range(200):
        fuzz.TARGETS[target](fuzz._mutate(rng, rng.choice(seeds), fuzz.MAX_LEN[target]))


def test_the_gguf_seeds_cover_valid_files() -> None:
    from edge.models.gguf_file import open_gguf

    valid = [
        f for f in sorted((fuzz.CORPUS / "gguf").iterdir()) if f.name.startswith(("tiny", "tokenizer", "one"))
    ]
    for f in valid:
        open_gguf(f)  # the mutations start from files that parse, so they reach deep into the reader


def test_replay_of_a_reproducer(tmp_path: Path) -> None:
    f = tmp_path / "input"
    f.write_bytes(b"GGUF")
    assert fuzz.main(["--replay", "gguf", str(f)]) == 0
