"""examples/tk_stream.py: its non-UI part with a fake model, and the real window under Xvfb (headless X)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.apps.fake_model import ANSWER, FakeModel

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tk_stream.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tk_stream", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_stream_answer_puts_every_piece_then_end() -> None:
    ex = load_example()
    got: list[str | None] = []
    result = ex.stream_answer(FakeModel(), "hi", got.append, threading.Event(), max_tokens=8)
    assert got[-1] is None and "".join(p for p in got if p) == ANSWER == result.text


def test_stream_answer_stops_on_cancel() -> None:
    ex = load_example()
    stop = threading.Event()
    got: list[str | None] = []

    def put(piece: str | None) -> None:
        got.append(piece)
        stop.set()  # stop after the first piece

    result = ex.stream_answer(FakeModel(), "hi", put, stop)
    assert result.stats.stop_reason == "cancelled" and len(got) == 2 and got[-1] is None


@pytest.fixture
def display() -> Iterator[str]:
    xvfb = shutil.which("Xvfb")
    if xvfb is None:
        pytest.skip("Xvfb is not installed (apt-get install xvfb); the non-UI part is tested above")
    num = f":{100 + os.getpid() % 400}"
    proc = subprocess.Popen(
        [xvfb, num, "-screen", "0", "800x600x24", "-nolisten", "tcp"], stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(1.0)
        assert proc.poll() is None, "Xvfb did not start"
        yield num
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.slow
def test_window_streams_the_answer_headless(display: str) -> None:
    import edge

    prompt = "What is the capital of France?"
    with edge.load("smollm2-135m") as m:
        expected = m.generate(prompt, max_tokens=16, temperature=0.0).text
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--prompt",
            prompt,
            "--max-tokens",
            "16",
            "--temperature",
            "0",
            "--exit-when-done",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "DISPLAY": display},
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip("\n") == expected
