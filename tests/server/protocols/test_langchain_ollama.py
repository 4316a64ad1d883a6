"""Ollama's API as LangChain's `ChatOllama` and the `ollama` client's model management use it, against the
shared real `edge serve`: invoke and stream agree, a schema through `with_structured_output` validates, a tool
call comes back with valid arguments; pulling the served catalog model (already in the cache: no download)
streams Ollama's lines; deleting it while it serves is refused, the file untouched."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import ollama
import pytest
from langchain_core.messages import AIMessage
from langchain_ollama import ChatOllama

from edge.models.catalog import CATALOG
from edge.models.store import is_verified, model_path
from edge.server import Server
from tests.server.protocols.conftest import CITY, MODEL, WEATHER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def chat(protocol_server: Server) -> ChatOllama:
    return ChatOllama(model=f"{MODEL}:latest", base_url=protocol_server.url, temperature=0, num_predict=16)


def test_invoke_and_stream_agree(chat: ChatOllama) -> None:
    prompt = [("system", "You are terse."), ("human", "Name three colours.")]
    whole = chat.invoke(prompt)
    assert isinstance(whole, AIMessage) and whole.content
    streamed = "".join(str(chunk.content) for chunk in chat.stream(prompt))
    assert streamed == whole.content
    usage = whole.usage_metadata
    assert usage is not None and usage["input_tokens"] > 5 and 0 < usage["output_tokens"] <= 16


def test_structured_output_is_guaranteed(chat: ChatOllama) -> None:
    structured = chat.model_copy(update={"num_predict": 60}).with_structured_output(
        CITY, method="json_schema"
    )
    out = structured.invoke("Tell me about Paris as JSON.")
    jsonschema.validate(out, CITY)


def test_tool_call_has_valid_arguments(chat: ChatOllama) -> None:
    tool = {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER},
    }
    out = (
        chat.model_copy(update={"num_predict": 80})
        .bind_tools([tool])
        .invoke("What is the weather in Paris, in celsius?")
    )
    assert isinstance(out, AIMessage) and out.tool_calls, out
    assert out.tool_calls[0]["name"] == "get_weather"
    jsonschema.validate(out.tool_calls[0]["args"], WEATHER)


def test_pull_of_the_cached_model_and_delete_refused(
    protocol_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = CATALOG[MODEL]
    assert is_verified(entry)  # the server pulled it when it started: nothing is downloaded here
    client = ollama.Client(host=protocol_server.url, timeout=120)
    progress = list(client.pull(f"{MODEL}:latest", stream=True))
    digest = f"sha256:{entry.sha256}"
    assert [p.status for p in progress] == [
        "pulling manifest",
        f"downloading {digest}",
        "verifying sha256 digest",
        "success",
    ]
    assert progress[1].digest == digest and progress[1].completed == progress[1].total == entry.size
    path = model_path(entry)
    # the delete runs against an empty cache of this test's: were the refusal ever missed, nothing real goes
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path))
    with pytest.raises(ollama.ResponseError) as info:
        client.delete(MODEL)
    assert info.value.status_code == 400 and "loaded" in info.value.error
    monkeypatch.undo()
    assert path.exists() and is_verified(entry)
