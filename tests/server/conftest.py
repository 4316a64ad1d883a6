"""Servers for the tests: `edge.serve` in a background thread on 127.0.0.1 with a free port, on tiny random
GGUFs (with a chat template) or the real smollm2-135m."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import edge
from edge.server import Server
from tests.tiny_models import TinySpec, write_tiny_model

TEMPLATE = (
    "{% for m in messages %}<s>{{ m.role }}: {{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
LONG_CTX = 32768  # the tiny model's context: room for generations long enough to interrupt


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("serve") / "tiny.gguf"
    return write_tiny_model(
        path, TinySpec(chat_template=TEMPLATE, ctx=LONG_CTX, seed=1)
    )  # seed 1: greedy runs on without EOS


@pytest.fixture
def start_server(tiny_model: Path) -> Iterator[Callable[..., Server]]:
    """Start servers (`start(**serve_kwargs)`, the tiny model unless `models` is given); all stop at the end."""
    started: list[Server] = []

    def start(**kwargs: Any) -> Server:
        kwargs.setdefault("models", [str(tiny_model)])
        kwargs.setdefault("n_ctx", 2048)
        kwargs.setdefault("n_threads", 1)
        kwargs.setdefault("backend", "llamacpp")  # these tests were written against llama.cpp's outputs
        kwargs.setdefault("grace_s", 1.0)
        server = edge.serve(port=0, host="127.0.0.1", block=False, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(start_server: Callable[..., Server]) -> Server:
    return start_server()
