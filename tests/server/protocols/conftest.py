"""One server for every protocol test (Ollama's API, Anthropic's Messages, OpenAI's Responses):
qwen2.5-coder-0.5b on llama.cpp, started once per session, so the real clients' tests cost little time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import edge
from edge.server import Server

MODEL = "qwen2.5-coder-0.5b"

# a schema both Ollama clients' structured-output tests ask for
CITY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "maximum": 99999999},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}

WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME: dict[str, Any] = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 40}},
    "required": ["timezone"],
    "additionalProperties": False,
}


@pytest.fixture(scope="session")
def protocol_server() -> Iterator[Server]:
    server = edge.serve(MODEL, port=0, block=False, backend="llamacpp", n_threads=2, n_ctx=2048, grace_s=1.0)
    yield server
    server.stop()
