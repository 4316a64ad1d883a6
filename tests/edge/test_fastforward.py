"""Forced-token fast-forward (edge/fastforward.py): the same greedy output as plain constrained decoding, with
the grammar's forced tokens fed in multi-token forwards, and the KV session left consistent."""

from __future__ import annotations

from pathlib import Path

import pytest

import edge
from edge.generate import GenerationConfig
from edge.grammar import Grammar
from tests.edge.test_grammar import PERSON
from tests.tiny_models import TinySpec, write_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("ff") / "tiny.gguf", TinySpec(arch="llama"))


@pytest.mark.parametrize("backend", ["ort", "llamacpp"])
def test_fast_forward_keeps_the_greedy_output(backend: str, tiny_model: Path, edge_cache: Path) -> None:
    with edge.load(str(tiny_model), backend=backend, draft="none", n_ctx=512) as m:
        out = {}
        for ff in (False, True):
            cfg = GenerationConfig(max_tokens=120, grammar=Grammar.json_schema(PERSON), fast_forward=ff)
            out[ff] = m.generate("x", cfg, raw=True)
        assert out[True].token_ids == out[False].token_ids
        forced = out[True].stats.forced
        assert forced is not None and forced.forced > 0 and forced.rounds > 0, forced
        assert out[False].stats.forced is None
        assert out[True].stats.stop_reason == out[False].stats.stop_reason
        # the session holds exactly what was fed: the next turn reuses it
        assert m.decoder.position == len(m.session.held)
