"""Real-world JSON Schemas as clients send them (tests/data/schemas_real_world.json: SchemaStore configs,
Kubernetes kinds, function parameters of the Berkeley function-calling leaderboard), each asked for once through
`edge serve smollm2-135m` (ort) with the real `openai` client, `json_schema` strict, at temperature 0.7 and
repeat_penalty 1.1 (issue 45). A schema the engine accepts is never answered with invalid JSON; one it refuses
is a 400 naming the keyword. The issue's target, 80% of the set answered with valid JSON, is not met (69%):
answers cut at max_tokens (finish_reason "length": the model loops inside a string or number the schema leaves
unbounded) are counted apart, neither valid nor invalid, and keep it at 69%.
benchmarks/results/schemas-real-world-2026-12-07-xeon.md holds the figures."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

import edge
from edge.schemas import KEYWORDS
from edge.server import Server
from tests.server.schema_asks import ask_with_schema

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m"
# enough for the shortest valid answer of every schema in the set; a longer budget only makes cuts rarer
MAX_TOKENS = int(os.environ.get("EDGE_SCHEMAS_MAX_TOKENS", "384"))
# llama.cpp's long-time default: without it a 135M model at 0.7 loops inside an open string or object until
# max_tokens (27 of 56 accepted schemas cut at 384 tokens, none invalid; the results file has both figures)
REPEAT_PENALTY = float(os.environ.get("EDGE_SCHEMAS_REPEAT_PENALTY", "1.1"))
DATA = json.loads((Path(__file__).parents[1] / "data" / "schemas_real_world.json").read_text())
# the entries written from public sources (the others are hand-made examples of the same shapes)
REAL = {name: entry for name, entry in DATA.items() if not entry["source"].startswith("edge:")}
_ECMA_GROUP = re.compile(r"\(\?<(?=[A-Za-z_])")


def _ecma_pattern(
    validator: Any, pattern: str, instance: Any, schema: Any
) -> Iterator[jsonschema.ValidationError]:
    # a pattern is ECMA-262: its named groups (?<name>...) are (?P<name>...) to Python's re
    if validator.is_type(instance, "string") and not re.search(_ECMA_GROUP.sub("(?P<", pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _validator(schema: dict[str, Any]) -> jsonschema.protocols.Validator:
    """The validator of the schema's own draft ($schema; 2020-12 where it names none)."""
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return jsonschema.validators.extend(cls, {"pattern": _ecma_pattern})(schema)


@pytest.fixture(scope="module")
def client(edge_cache: Path) -> Iterator[openai.OpenAI]:
    server: Server = edge.serve(
        MODEL, port=0, block=False, backend="ort", n_threads=2, n_ctx=2048, draft="none", grace_s=1.0
    )
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=600)
    server.stop()


def test_the_set_is_real_world_and_varied() -> None:
    assert len(REAL) >= 60
    for prefix, least in (("schemastore-", 30), ("kubernetes-", 10), ("bfcl-", 12)):
        assert sum(name.startswith(prefix) for name in REAL) >= least, prefix
    for entry in REAL.values():
        assert entry["source"].startswith("https://github.com/") and "Apache-2.0" in entry["license"]
    assert len(json.dumps(DATA)) < 1_500_000


@dataclass
class Outcomes:
    """Each schema of the set asked for once: the answers that validate, those cut at max_tokens, those that
    do not validate (name, errors, text), and the refusals (name, message)."""

    valid: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)
    invalid: list[tuple[str, list[str], str]] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)


@pytest.fixture(scope="module")
def outcomes(client: openai.OpenAI) -> Outcomes:
    out = Outcomes()
    for i, (name, entry) in enumerate(REAL.items()):
        schema = entry["schema"]
        # the name and title only: the whole schema (140 KB for a Deployment) would not fit the context
        about = schema.get("title") or schema.get("description") or name
        ask = f"Reply with a short JSON value for a {name.split('-', 1)[1]} ({str(about)[:200]})."
        try:
            r = ask_with_schema(
                client, MODEL, ask, f"s{i}", schema, i, MAX_TOKENS, repeat_penalty=REPEAT_PENALTY
            )
        except openai.BadRequestError as exc:
            out.refused.append((name, exc.message))
            print(f"{name}: refused", flush=True)  # one line a schema: a slow run shows where it is
            continue
        choice, text = r.choices[0], r.choices[0].message.content or ""
        if choice.finish_reason == "length":
            assert r.usage is not None and r.usage.completion_tokens == MAX_TOKENS, (name, r.usage)
            out.cut.append(name)
            print(f"{name}: cut, ends {text[-80:]!r}", flush=True)
            continue
        assert choice.finish_reason == "stop", (name, choice.finish_reason)
        try:
            errors = [e.message[:160] for e in _validator(schema).iter_errors(json.loads(text))]
        except ValueError as exc:
            errors = [f"not JSON: {exc}"]
        if errors:
            out.invalid.append((name, errors, text[:200]))
        else:
            out.valid.append(name)
        tokens = r.usage.completion_tokens if r.usage else 0
        print(f"{name}: {'INVALID' if errors else 'valid'} in {tokens} tokens", flush=True)
    print(
        f"\n{len(REAL)} schemas, max_tokens {MAX_TOKENS}, repeat_penalty {REPEAT_PENALTY}: "
        f"{len(REAL) - len(out.refused)} accepted, {len(out.valid)} valid, {len(out.cut)} cut, "
        f"{len(out.invalid)} invalid, {len(out.refused)} refused"
    )
    for name, message in out.refused:
        print(f"refused {name}: {message[:220]}")
    return out


def test_an_accepted_schema_is_never_answered_with_invalid_json(outcomes: Outcomes) -> None:
    assert not outcomes.invalid, outcomes.invalid
    assert len(REAL) - len(outcomes.refused) >= 0.8 * len(REAL)  # 56 of 68 accepted


def test_every_refusal_names_a_keyword_the_schema_holds(outcomes: Outcomes) -> None:
    assert outcomes.refused
    for name, message in outcomes.refused:
        named = {k for k in KEYWORDS if re.search(rf"\b{re.escape(k)}\b", message)}
        assert named & set(re.findall(r'"([$\w]+)"\s*:', json.dumps(REAL[name]["schema"]))), (name, message)


# NOTE: the target is 80%, not met by smollm2-135m at 0.7 (47 of 68 valid at 384 tokens, 49 at 1024; 0
# invalid): its cut answers loop inside a string or number the schema leaves unbounded. This guards what is
# measured (69%, the same twice, seeded), with room for three answers to move.
def test_the_share_answered_with_valid_json_holds(outcomes: Outcomes) -> None:
    assert len(outcomes.valid) >= 0.65 * len(REAL), (len(outcomes.valid), outcomes.cut)
