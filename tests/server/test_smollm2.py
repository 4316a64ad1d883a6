"""`edge serve` on the real smollm2-135m with the real openai client: chat (its real chat template), stream,
completions, KV reuse of a resent history, and a disconnect that frees the model."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

import edge
from edge.server import Server

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def smol() -> Iterator[Server]:
    server = edge.serve(MODEL, port=0, block=False, n_threads=2, n_ctx=2048, grace_s=1.0)
    # the start's warm-up prefills the template's opening; the tests compare with a fresh edge.load, so they
    # begin once it is done (whether a request or the warm-up goes first is otherwise a race)
    model, end = server.registry.loaded()[MODEL].replicas[0], time.monotonic() + 120
    while model.kv_state().position == 0 and time.monotonic() < end:
        time.sleep(0.05)
    yield server
    server.stop()


def test_chat_matches_the_python_api(smol: Server) -> None:
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    c = openai.OpenAI(base_url=smol.url + "/v1", api_key="x", max_retries=0)
    r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0)
    with edge.load(MODEL, n_threads=2, n_ctx=2048) as m:
        direct = m.chat(msgs, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == direct.text
    assert r.usage.prompt_tokens == direct.stats.n_prompt_tokens
    stream = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24, temperature=0, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == direct.text


def test_completions_and_resent_history(smol: Server) -> None:
    c = openai.OpenAI(base_url=smol.url + "/v1", api_key="x", max_retries=0)
    r = c.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0)
    assert "Paris" in r.choices[0].text
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fruit."}]
    first = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
    msgs += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Another?"},
    ]
    second = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=16, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 2


def test_disconnect_frees_smollm2_within_one_token(smol: Server) -> None:
    sched = smol.registry.loaded()[MODEL]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a very long story."}]}
    with httpx.stream(
        "POST", smol.url + "/v1/chat/completions", json={**body, "max_tokens": 1000, "stream": True}
    ) as r:
        lines = r.iter_lines()
        assert sum(1 for _, line in zip(range(8), lines, strict=False) if line.startswith("data:")) >= 3
    t0 = time.monotonic()
    while sched.busy:
        assert time.monotonic() - t0 < 5
        time.sleep(0.01)
    record = sched.records[-1]
    assert record.stop_reason == "cancelled" and record.polls_after_cancel is not None
    assert record.polls_after_cancel <= 1


def test_a_pulled_catalog_model_loads_on_demand_only_with_models_max(
    start_server: Callable[..., Server],
) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    one = start_server()  # the tiny model only: smollm2 is neither listed nor loaded
    assert MODEL not in [m["id"] for m in httpx.get(one.url + "/v1/models").json()["data"]]
    assert httpx.post(one.url + "/v1/chat/completions", json=body).status_code == 404
    two = start_server(models_max=2)
    assert MODEL in [m["id"] for m in httpx.get(two.url + "/v1/models").json()["data"]]
    r = httpx.post(two.url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200 and r.json()["model"] == MODEL
    assert set(two.registry.loaded()) == {"tiny.gguf", MODEL}
