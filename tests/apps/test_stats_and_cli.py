"""The stats bar's text, and how `edge chat` / `edge run` without a prompt reach the app."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

from apps.tui.stats import Live, ModelInfo, kv_text, stats_text
from edge.session import KVState


def test_kv_text_linear_and_ring() -> None:
    assert kv_text(KVState(100, 4096, 100, ring=False)) == "KV 100/4096 (2%)"
    ring = KVState(position=5000, capacity=4096, fill=4096, ring=True, sink=4)
    assert ring.wrapped and "wrapped: older turns left the window (4 sink tokens kept)" in kv_text(ring)
    assert not KVState(4000, 4096, 4000, ring=True).wrapped


def test_stats_text_live_and_notes() -> None:
    info = ModelInfo("m", "ort", "cpu", "npu -> cpu", None, chat_template=False)
    text = stats_text(info, live=Live(pieces=11, ttft_ms=80.0, decode_s=0.5))
    assert "TTFT 80 ms · 20.0 tok/s · 11 tok" in text and "generating" in text
    assert "fallback npu -> cpu" in text and "completion mode" in text
    assert stats_text(None, status="loading m…") == "loading m…"


def test_chat_is_registered_as_an_edge_app() -> None:
    (ep,) = entry_points(group="edge.apps", name="chat")
    assert ep.value == "apps.tui:main"


def test_edge_chat_without_a_terminal_is_one_clear_line() -> None:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    proc = subprocess.run(
        [sys.executable, "-m", "edge.cli", "chat", "smollm2-135m"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        'edge: error: the chat app needs a terminal (pass a prompt: edge run "Why is the sky blue?")'
    )
