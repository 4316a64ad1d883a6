"""Per-token log-probs: the math against a hand-computed softmax, then a real tiny model on every backend."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import edge
from edge.grammar import Grammar, compile_grammar
from edge.logprobs import choice_logprobs, log_softmax
from edge.sampling import Sampler, SamplingConfig
from tests.tiny_models import TinySpec, write_tiny_model

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_log_softmax_matches_a_hand_computed_softmax() -> None:
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    z = math.exp(2) + math.exp(1) + 1 + math.exp(-1)
    want = [math.log(math.exp(v) / z) for v in (2.0, 1.0, 0.0, -1.0)]
    np.testing.assert_allclose(log_softmax(logits), want, rtol=1e-12)
    lp, top = choice_logprobs(logits, 1, 3)
    assert lp == pytest.approx(want[1])
    assert [i for i, _ in top] == [0, 1, 2]
    assert [v for _, v in top] == pytest.approx(want[:3])


def test_masked_and_penalized_row_is_what_is_reported() -> None:
    s = Sampler(SamplingConfig(temperature=0.0, repeat_penalty=2.0))
    row = s.prepare(np.array([2.0, 1.0, 0.0, -1.0]), history=[0], allowed=np.array([True, True, False, True]))
    # token 0 penalized 2 -> 1, token 2 masked out: softmax over [1, 1, -1]
    z = 2 * math.e + math.exp(-1)
    lp, top = choice_logprobs(row, s.draw(row), 5)
    assert lp == pytest.approx(math.log(math.e / z))
    assert [i for i, _ in top] == [0, 1, 3]  # the masked id is never an alternative; ties by lower id
    assert top[2][1] == pytest.approx(math.log(math.exp(-1) / z))


def test_out_of_range_top_is_refused() -> None:
    with pytest.raises(ValueError, match="between 0 and 20"):
        edge.GenerateOptions(logprobs=21).config()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", TinySpec(arch="llama"))


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["llamacpp", "ort", "openvino"])
def test_greedy_logprobs_on_every_backend(backend: str, tiny_model: Path, edge_cache: Path) -> None:
    with edge.load(str(tiny_model), backend=backend, draft="none", n_ctx=256) as m:
        r = m.generate("x", raw=True, max_tokens=12, logprobs=5)
        assert r.logprobs is not None and len(r.logprobs) == len(r.token_ids)
        for e, tid in zip(r.logprobs, r.token_ids, strict=True):
            assert e.id == tid and e.logprob <= 0 and len(e.top) == 5
            assert e.logprob == pytest.approx(e.top[0].logprob)  # greedy: the chosen token is the argmax
            assert [t.logprob for t in e.top] == sorted((t.logprob for t in e.top), reverse=True)
        assert b"".join(bytes(e.bytes) for e in r.logprobs).decode("utf-8", "replace") == r.text
        assert m.generate("x", raw=True, max_tokens=4).logprobs is None


@pytest.mark.slow
def test_schema_logprobs_alternatives_are_admitted(tiny_model: Path, edge_cache: Path) -> None:
    with edge.load(str(tiny_model), backend="llamacpp", draft="none", n_ctx=512) as m:
        grammar = Grammar.json_schema(PERSON)
        r = m.generate("x", response_format=grammar, temperature=0.7, seed=3, max_tokens=200, logprobs=20)
        assert r.stats.stop_reason in ("grammar", "length")
        assert r.logprobs is not None
        c = compile_grammar(grammar, m.tokenizer, m.decoder.vocab_size)
        for e in r.logprobs:
            allowed = c.allowed()
            assert all(allowed[t.id] for t in e.top) and allowed[e.id]
            assert sum(math.exp(t.logprob) for t in e.top) <= 1 + 1e-9
            c.advance(e.id)
