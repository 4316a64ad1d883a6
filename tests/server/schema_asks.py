"""One strict `json_schema` request at temperature 0.7 through the real `openai` client: what both schema sets'
tests (test_schemas_real.py, test_schemas_real_world.py) send, each case seeded by its index."""

from __future__ import annotations

from typing import Any

import openai
from openai.types.chat import ChatCompletion


def ask_with_schema(
    client: openai.OpenAI, model: str, ask: str, name: str, schema: dict[str, Any], seed: int, max_tokens: int,
    **extra: Any,
) -> ChatCompletion:  # fmt: skip
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    return client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": ask}],
        response_format=fmt,  # type: ignore[arg-type]
        temperature=0.7,
        seed=seed,
        max_tokens=max_tokens,
        extra_body=extra or None,
    )
