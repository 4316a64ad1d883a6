"""logprobs through `edge serve` with the real `openai` client on a tiny random model: chat's and the legacy
completions' shapes, streamed and not, under a json_schema mask, and the 400s."""

from __future__ import annotations

import itertools
import math

import httpx
import openai
import pytest

from edge.server import Server
from tests.server.test_openai_client import HI, client
from tests.server.test_structured import FORMAT


def _check_chat(entries: list, content: str, top: int) -> None:
    assert entries, "no logprobs"
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) <= top and (top == 0 or e.top_logprobs)
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True) and all(v <= 0 for v in lps)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace") == content


def test_chat_logprobs_greedy_streamed_and_not(server: Server) -> None:
    c = client(server)
    kw = {"model": "tiny.gguf", "messages": HI, "max_tokens": 16, "temperature": 0, "logprobs": True}
    r = c.chat.completions.create(**kw, top_logprobs=5)
    choice = r.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    _check_chat(choice.logprobs.content, choice.message.content or "", 5)
    assert all(len(e.top_logprobs) == 5 for e in choice.logprobs.content)
    for e in choice.logprobs.content:  # temperature 0: the chosen token is the argmax
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob) and e.token == e.top_logprobs[0].token
    stream = c.chat.completions.create(**kw, top_logprobs=5, stream=True)
    streamed = [
        e for ch in stream if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in choice.logprobs.content]
    plain = c.chat.completions.create(**kw, top_logprobs=0)
    assert plain.choices[0].logprobs is not None
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    none = c.chat.completions.create(model="tiny.gguf", messages=HI, max_tokens=4)
    assert none.choices[0].logprobs is None


def test_chat_logprobs_under_a_schema_are_of_the_masked_distribution(server: Server) -> None:
    c = client(server)
    r = c.chat.completions.create(
        model="tiny.gguf",
        messages=HI,
        response_format=FORMAT,
        temperature=0.7,
        seed=1,
        max_tokens=120,
        logprobs=True,
        top_logprobs=20,
    )
    entries = r.choices[0].logprobs.content
    _check_chat(entries, r.choices[0].message.content or "", 20)
    # masked: the alternatives are what the grammar admits, so where it admits a single token (the
    # opening brace, a property name's fixed spelling) that token is the only one, with all the mass
    assert entries[0].token == "{" and entries[0].logprob == pytest.approx(0.0, abs=1e-9)
    assert [t.token for t in entries[0].top_logprobs] == ["{"]
    assert any(len(e.top_logprobs) == 20 for e in entries)  # and where the string is free, 20 of them
    for e in entries:
        assert sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1 + 1e-6


def test_legacy_completion_logprobs_streamed_and_not(server: Server) -> None:
    c = client(server)
    kw = {"model": "tiny.gguf", "prompt": "x", "max_tokens": 12, "temperature": 0, "logprobs": 3}
    r = c.completions.create(**kw)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset
    # the legacy shape has no bytes: a token that is part of a UTF-8 sequence reads "bytes:\\x..", so the
    # tokens spell the text up to the first such token (the random model emits some)
    whole = list(itertools.takewhile(lambda t: not t.startswith("bytes:"), lp.tokens))
    assert whole and r.choices[0].text.startswith("".join(whole))
    assert r.usage is not None and len(lp.tokens) == r.usage.completion_tokens
    assert lp.text_offset[: len(whole)] == [sum(len(t) for t in whole[:i]) for i in range(len(whole))]
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen <= 0 and len(top) == 3 and chosen == pytest.approx(max(top.values()))
    chunks = [ch.choices[0].logprobs for ch in c.completions.create(**kw, stream=True) if ch.choices]
    tokens = [t for chunk in chunks if chunk for t in chunk.tokens]
    offsets = [o for chunk in chunks if chunk for o in chunk.text_offset]
    assert tokens == lp.tokens and offsets == lp.text_offset


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
        ("/v1/completions", {"logprobs": True}, "logprobs"),
    ],
)
def test_out_of_range_logprobs_are_a_400(server: Server, path: str, extra: dict, param: str) -> None:
    body = {"model": "tiny.gguf", **({"messages": HI} if "chat" in path else {"prompt": "x"}), **extra}
    r = httpx.post(server.url + path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "logprobs" in err["message"]


def test_openai_client_sees_the_400(server: Server) -> None:
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        client(server).chat.completions.create(model="tiny.gguf", messages=HI, logprobs=True, top_logprobs=30)
