"""The command line's edges: a closed or empty stdin, an empty prompt, a misspelt model name. Each is one clear
error line before any model is loaded (so none of these tests needs a model)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from edge.models.catalog import DEFAULT_MODEL
from tests.edge.test_cli import EDGE, assert_one_line_error
from tests.shared_cache import pull_named_models


def _run(*args: str, stdin: int | str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    text = stdin if isinstance(stdin, str) else None
    handle = stdin if isinstance(stdin, int) else (None if text is not None else subprocess.DEVNULL)
    return subprocess.run(
        [*EDGE, *args],
        input=text,
        stdin=handle,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def _closed_stdin(*args: str) -> subprocess.CompletedProcess[str]:
    """The command with file descriptor 0 closed, as the shell's `<&-` leaves it."""
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    return subprocess.run(
        ["sh", "-c", 'exec "$@" <&-', "sh", *EDGE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_closed_stdin_is_a_clear_error() -> None:
    assert_one_line_error(_closed_stdin("run"), "standard input is closed")
    assert_one_line_error(_closed_stdin("run", "smollm2-135m"), "standard input is closed")
    assert_one_line_error(_closed_stdin("tokenize", "smollm2-135m"), "standard input is closed")


@pytest.mark.parametrize("stdin", ["", "  \n\t\n"], ids=["empty", "blank"])
def test_empty_stdin_is_not_a_prompt(stdin: str) -> None:
    assert_one_line_error(_run("run", stdin=stdin), "the prompt is empty")
    assert_one_line_error(_run("run", "smollm2-135m", stdin=stdin), "the prompt is empty")


def test_empty_prompt_argument() -> None:
    assert_one_line_error(_run("run", "smollm2-135m", "", stdin=None), "the prompt is empty")


@pytest.mark.parametrize(
    ("arg", "meant"),
    [
        ("qwen2.5-coder-1.5", "qwen2.5-coder-1.5b"),
        ("smollm2", "smollm2-135m"),
        ("smolm2-135m", "smollm2-135m"),
        ("Gemma3-270M", "gemma3-270m"),
    ],
)
def test_misspelt_model_name_says_did_you_mean(arg: str, meant: str) -> None:
    proc = _run("run", arg, stdin=None)
    assert_one_line_error(proc, f"no model named {arg!r}", "did you mean", meant)


def test_misspelt_model_name_before_a_prompt_says_did_you_mean() -> None:
    proc = _run("run", "qwen2.5-coder-1.5", "hi", stdin=None)
    assert_one_line_error(proc, "'qwen2.5-coder-1.5'", "did you mean", "qwen2.5-coder-1.5b")


def test_missing_gguf_path_is_not_a_prompt() -> None:
    proc = _run("run", "models/nowhere.gguf", stdin="hi")
    assert_one_line_error(proc, "nowhere.gguf")


@pytest.mark.slow
def test_a_one_word_prompt_is_still_a_prompt() -> None:
    """A word that is no near miss of a catalog name goes to the default model as the prompt."""
    pull_named_models([DEFAULT_MODEL])
    args = ("--max-tokens", "2", "--json", "--draft", "none", "--backend", "llamacpp")  # no graph build
    proc = _run("run", "hello", *args, stdin=None)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"] == DEFAULT_MODEL and out["n_tokens"] >= 1
    assert out["kv_dtype"] == "f16"  # llama.cpp's own cache type, what --kv-dtype auto keeps there
