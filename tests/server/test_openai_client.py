"""The real `openai` client (and curl) against `edge serve` on a tiny model: models, chat and completions,
streamed and not, usage, edge's extra field, errors in OpenAI's shape."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import httpx
import openai
import pytest

from edge.server import Server

HI = [{"role": "user", "content": "hi"}]


def client(server: Server, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=30)


def test_models_list_names_the_served_model(server: Server) -> None:
    ids = [m.id for m in client(server).models.list()]
    assert "tiny.gguf" in ids
    assert all("/" not in i for i in ids)  # ids, never paths


def test_chat_non_stream_usage_and_edge_stats(server: Server) -> None:
    r = client(server).chat.completions.create(model="tiny.gguf", messages=HI, max_tokens=12, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens <= 12 and r.usage.prompt_tokens > 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.model_extra["edge"]
    assert extra["backend"] == "llamacpp:cpu" and extra["ttft_ms"] > 0 and extra["fallback"] is None


def test_chat_stream_equals_non_stream_and_reports_usage(server: Server) -> None:
    c = client(server)
    full = c.chat.completions.create(model="tiny.gguf", messages=HI, max_tokens=16, temperature=0, seed=1)
    stream = c.chat.completions.create(
        model="tiny.gguf",
        messages=HI,
        max_tokens=16,
        temperature=0,
        seed=1,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [full.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_history_sent_again_reuses_the_kv(server: Server) -> None:
    c = client(server)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "w1 w2 w3"}]
    first = c.chat.completions.create(model="tiny.gguf", messages=msgs, max_tokens=8, temperature=0)
    msgs += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "w4"},
    ]
    second = c.chat.completions.create(model="tiny.gguf", messages=msgs, max_tokens=8, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 2


def test_a_model_named_at_start_is_warmed_before_the_first_request(server: Server) -> None:
    model = server.registry.loaded()["tiny.gguf"].replicas[0]
    end = time.monotonic() + 60
    while model.kv_state().position == 0:  # the warm-up runs in the background after start
        assert time.monotonic() < end, "the warm-up did not prefill the template's opening"
        time.sleep(0.05)
    held = model.kv_state().position
    first = client(server).chat.completions.create(
        model="tiny.gguf", messages=HI, max_tokens=4, temperature=0
    )
    assert first.usage.prompt_tokens_details.cached_tokens == held  # the opening was not prefilled again


def test_completions_stream_and_not(server: Server) -> None:
    c = client(server)
    r = c.completions.create(model="tiny.gguf", prompt="w1 w2", max_tokens=10, temperature=0)
    assert r.object == "text_completion" and r.usage.completion_tokens <= 10
    pieces = list(
        c.completions.create(model="tiny.gguf", prompt="w1 w2", max_tokens=10, temperature=0, stream=True)
    )
    assert "".join(p.choices[0].text for p in pieces if p.choices) == r.choices[0].text


def test_sampling_fields_and_stop(server: Server) -> None:
    c = client(server)
    a = c.chat.completions.create(
        model="tiny.gguf", messages=HI, max_tokens=12, temperature=0.9, top_p=0.9, seed=7
    )
    b = c.chat.completions.create(
        model="tiny.gguf", messages=HI, max_tokens=12, temperature=0.9, top_p=0.9, seed=7
    )
    assert a.choices[0].message.content == b.choices[0].message.content  # the seed fixes the draws
    text = a.choices[0].message.content
    assert len(text) > 3, text  # else the stop check below would test nothing
    cut = c.chat.completions.create(
        model="tiny.gguf", messages=HI, max_tokens=12, temperature=0.9, top_p=0.9, seed=7, stop=[text[2:4]]
    )
    assert cut.choices[0].message.content == text[: text.index(text[2:4])]
    assert cut.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"tools": [{"type": "function", "function": {"name": "no spaces"}}]}, "tools"),
        ({"tools": [{"type": "retrieval"}]}, "tools"),
        ({"tool_choice": "required"}, "tools"),
        ({"temperature": 5}, "temperature"),
        ({"max_tokens": 10**6}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"response_format": {"type": "grammar"}}, "response_format"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "s", "schema": {"type": "array", "uniqueItems": True}},
                }
            },
            "response_format",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0]",
        ),
        ({"messages": []}, "messages"),
    ],
)
def test_unsupported_values_are_a_400_naming_the_field(server: Server, extra: dict, param: str) -> None:
    body = {"model": "tiny.gguf", "messages": HI, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_unknown_fields_are_ignored(server: Server) -> None:
    body = {"model": "tiny.gguf", "messages": HI, "max_tokens": 4, "frobnicate": {"x": 1}, "user": "u1"}
    r = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["role"] == "assistant"


def test_openai_client_raises_typed_errors(server: Server) -> None:
    c = client(server)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="no-such-model", messages=HI)
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model="tiny.gguf", messages=HI, n=3)
    assert info.value.param == "n"


def test_health(server: Server) -> None:
    r = httpx.get(server.url + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert r.json()["models"]["tiny.gguf"]["replicas"] == 1


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_chat_stream_and_models(server: Server) -> None:
    body = json.dumps({"model": "tiny.gguf", "messages": HI, "max_tokens": 6, "stream": True})
    out = subprocess.run(
        ["curl", "-sS", "-N", "-H", "Content-Type: application/json", "-d", body, server.url + "/v1/chat/completions"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    events = [line[len("data: ") :] for line in out.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[0])["object"] == "chat.completion.chunk"
    models = subprocess.run(
        ["curl", "-sS", server.url + "/v1/models"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert json.loads(models)["data"][0]["id"] == "tiny.gguf"
