"""Every answer with a strict `json_schema` parses and validates: the schema set of tests/data/schemas.json
(the one benchmarks/grammar_engines.py measures), sampled at temperature 0.7 by smollm2-135m through `edge
serve` with the real `openai` client, on each backend (llamacpp, ort, openvino). The schemas the engine
refuses are a 400 naming the keyword, never an unconstrained answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import openai
import pytest

import edge
from edge.errors import GrammarError
from edge.grammar import Grammar
from edge.server import Server
from tests.server.schema_asks import ask_with_schema

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m"
MAX_TOKENS = 160
SCHEMAS = json.loads((Path(__file__).parents[1] / "data" / "schemas.json").read_text())


def _enforceable(schema: dict) -> bool:
    try:
        Grammar.json_schema(schema)
    except GrammarError:
        return False
    return True


ENFORCED = [s for s in SCHEMAS if _enforceable(s["schema"])]
REFUSED = [s for s in SCHEMAS if not _enforceable(s["schema"])]


@pytest.fixture(scope="module", params=["llamacpp", "ort", "openvino"])
def served(request: pytest.FixtureRequest, edge_cache: Path) -> Iterator[tuple[str, openai.OpenAI]]:
    server: Server = edge.serve(
        MODEL, port=0, block=False, backend=request.param, n_threads=2, n_ctx=2048, draft="none", grace_s=1.0
    )
    yield request.param, openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    server.stop()


def test_the_set_covers_what_the_issue_names() -> None:
    assert len(ENFORCED) >= 30
    text = json.dumps([s["schema"] for s in ENFORCED])
    for keyword in (
        "anyOf",
        "const",
        "enum",
        "minItems",
        "maxItems",
        "pattern",
        "maxLength",
        "minimum",
        "null",
    ):
        assert keyword in text, keyword


def test_every_answer_validates(served: tuple[str, openai.OpenAI]) -> None:
    """A finished answer always validates. One cut at max_tokens (a 135M model at 0.7 may run on inside a
    string or a number, which the schema leaves unbounded) says so with finish_reason "length" and its
    full token count; they stay a minority (5 of 38 at 200 tokens on llama.cpp here)."""
    backend, client = served
    bad, cut = [], []
    for i, case in enumerate(ENFORCED):
        schema = case["schema"]
        ask = f"Reply with a JSON value for this JSON Schema, short realistic values:\n{json.dumps(schema)}"
        r = ask_with_schema(client, MODEL, ask, case["name"], schema, i, MAX_TOKENS)
        choice, text = r.choices[0], r.choices[0].message.content or ""
        if choice.finish_reason == "length":
            assert r.usage is not None and r.usage.completion_tokens == MAX_TOKENS, (case["name"], r.usage)
            cut.append(case["name"])
            continue
        assert choice.finish_reason == "stop", (case["name"], choice.finish_reason)
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError) as exc:
            bad.append((case["name"], str(exc)[:160], text[-80:]))
    assert not bad, (backend, bad)
    assert len(cut) <= len(ENFORCED) // 4, (backend, cut)


def test_a_schema_the_engine_refuses_is_a_400_naming_the_keyword(served: tuple[str, openai.OpenAI]) -> None:
    _, client = served
    assert REFUSED
    for case in REFUSED:
        fmt = {"type": "json_schema", "json_schema": {"name": case["name"], "schema": case["schema"]}}
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                response_format=fmt,  # type: ignore[arg-type]
            )
        assert err.value.param == "response_format" and "Unimplemented keys" in err.value.message
