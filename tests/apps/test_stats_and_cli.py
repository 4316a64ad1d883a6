"""The stats bar's text, and how `edge chat` / `edge run` without a prompt reach the app."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

from edge.apps.tui.stats import Live, ModelInfo, kv_text, stats_text
from edge.session import KVState


def test_kv_text_linear_and_ring() -> None:
    assert kv_text(KVState(100, 4096, 100, ring=False)) == "KV 100/4096 (2%)"
    # as KVSession.state() reports a wrapped ring: what it evicted, and its sinks kept
    ring = KVState(position=5000, capacity=4096, fill=4096, ring=True, sink=4, dropped=904, kept=4)
    note = "older turns left the window (904 tokens dropped, system prompt's 4 kept)"
    assert ring.wrapped and note in kv_text(ring)
    assert not KVState(4000, 4096, 4000, ring=True).wrapped
    # llama.cpp's linear cache: the session cut the conversation and kept its 30-token system prompt
    cut = KVState(200, 256, 200, ring=False, dropped=350, kept=30)
    assert cut.left_window and not cut.wrapped
    assert "older turns left the window (350 tokens dropped, system prompt's 30 kept)" in kv_text(cut)
    assert "left the window" not in kv_text(KVState(200, 256, 200, ring=False))


def test_stats_text_says_when_older_turns_left_the_window() -> None:
    from edge.generate import GenerationStats
    from edge.model import Result

    stats = GenerationStats(
        n_prompt_tokens=200, n_tokens=8, stop_reason="eos", n_dropped_tokens=350, n_kept_tokens=30
    )
    result = Result("ok", [5] * 8, [1] * 200, stats, "llamacpp", "cpu", "ort:cpu failed -> llamacpp:cpu")
    info = ModelInfo("m", "llamacpp", "cpu", result.fallback, None, chat_template=True)
    text = stats_text(info, result=result)
    assert "older turns left the window (350 tokens dropped, system prompt's 30 kept)" in text
    assert "fallback ort:cpu failed -> llamacpp:cpu" in text
    assert "left the window" not in stats_text(
        info, result=Result("ok", [], [], GenerationStats(), "x", "cpu", None)
    )


def test_stats_text_live_and_notes() -> None:
    info = ModelInfo("m", "ort", "cpu", "npu -> cpu", None, chat_template=False)
    text = stats_text(info, live=Live(pieces=11, ttft_ms=80.0, decode_s=0.5))
    assert "TTFT 80 ms · 20.0 tok/s · 11 tok" in text and "generating" in text
    assert "fallback npu -> cpu" in text and "completion mode" in text
    assert stats_text(None, status="loading m…") == "loading m…"


def test_stats_text_says_what_the_draft_gave() -> None:
    from edge.generate import GenerationStats
    from edge.model import Result
    from edge.speculative import DraftStats

    draft = DraftStats(
        "ngram+qwen2.5-coder-0.5b", drafted=40, accepted=30, rounds=8, plain_steps=2, tokens=40
    )
    stats = GenerationStats(n_prompt_tokens=20, n_tokens=41, stop_reason="eos", draft=draft)
    result = Result("ok", [5] * 41, [1] * 20, stats, "ort", "cpu", None)
    info = ModelInfo("m", "ort", "cpu", None, draft.method, chat_template=True)
    assert "draft ngram+qwen2.5-coder-0.5b: 75% accepted, 4.0 tok/forward" in stats_text(info, result=result)


def test_stats_text_of_a_reply_that_drafted_nothing() -> None:
    from edge.generate import GenerationStats
    from edge.model import Result
    from edge.speculative import DraftStats

    stats = GenerationStats(n_prompt_tokens=20, n_tokens=9, stop_reason="eos", draft=DraftStats("ngram"))
    info = ModelInfo("m", "ort", "cpu", None, "ngram", chat_template=True)
    text = stats_text(info, result=Result("ok", [5] * 9, [1] * 20, stats, "ort", "cpu", None))
    assert "draft ngram: nothing drafted" in text and "0% accepted" not in text


def test_chat_is_registered_as_an_edge_app() -> None:
    (ep,) = entry_points(group="edge.apps", name="chat")
    assert ep.value == "edge.apps.tui:main"


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
