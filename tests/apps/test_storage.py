"""Saved conversations: round trip, corrupt files set aside, and SIGKILL during saves loses at most the
message in flight."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge.apps.tui.storage import Conversation, ConversationStore, Message, default_root


def test_round_trip_and_listing(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    a = Conversation.new("smollm2-135m", system="Be brief.").with_message(Message("user", "Hello\nthere"))
    a = a.with_message(Message("assistant", "Hi! ", stopped=True))
    store.save(a)
    b = Conversation.new("m").with_message(Message("user", "second"))
    store.save(b)
    assert store.load(a.id) == a
    assert a.title == "Hello" and a.messages[1].stopped
    assert [c.id for c in store.conversations()] == [b.id, a.id]  # newest first
    assert a.chat_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello\nthere"},
        {"role": "assistant", "content": "Hi! "},
    ]
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"\xff\xfe garbage",
        b"[]",
        json.dumps({"format": 1, "id": "x", "messages": [{"role": "robot", "content": "hi"}]}).encode(),
        json.dumps({"format": 1, "id": "x", "messages": "nope"}).encode(),
        json.dumps({"format": 1, "id": "", "messages": []}).encode(),
        json.dumps({"format": 1, "id": "x", "created": "yesterday", "messages": []}).encode(),
        json.dumps({"format": 99, "id": "x", "messages": []}).encode(),
    ],
)
def test_corrupt_file_is_set_aside_with_a_notice(tmp_path: Path, content: bytes) -> None:
    store = ConversationStore(tmp_path)
    good = Conversation.new().with_message(Message("user", "kept"))
    store.save(good)
    (tmp_path / "broken.json").write_bytes(content)
    assert [c.id for c in store.conversations()] == [good.id]
    assert len(store.notices) == 1 and "broken.json" in store.notices[0]
    assert not (tmp_path / "broken.json").exists()
    assert len(list(tmp_path.glob("broken.json.corrupt-*"))) == 1
    assert store.load("broken") is None


def test_bad_ids_and_default_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ConversationStore(tmp_path)
    for bad in ("../x", "", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            store.load(bad)
    monkeypatch.setenv("EDGE_DATA_DIR", str(tmp_path / "data"))
    assert default_root() == tmp_path / "data" / "conversations"
    monkeypatch.delenv("EDGE_DATA_DIR")
    assert default_root().name == "conversations" and "edge" in str(default_root())


def test_stale_temp_files_are_swept(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path)
    store.save(Conversation.new())
    stale = tmp_path / ".tmp-abc"
    stale.write_bytes(b"half a save")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    store.conversations()
    assert not stale.exists()


SAVER = """
import sys
from pathlib import Path
from edge.apps.tui.storage import Conversation, ConversationStore, Message
store = ConversationStore(Path(sys.argv[1]))
conv = Conversation(id="victim")
for i in range(100000):
    # a long message makes each save take a while, so kills land inside writes
    conv = conv.with_message(Message("user" if i % 2 == 0 else "assistant", f"message {i} " + "x" * 20000))
    store.save(conv)
    print(i, flush=True)
"""


def test_sigkill_during_saves_loses_at_most_the_message_in_flight(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    for attempt in range(6):
        folder = tmp_path / f"run{attempt}"
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(folder)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        assert proc.stdout is not None
        saved = -1
        target = 5 + 7 * attempt  # kill at different points of the file's growth
        for line in proc.stdout:
            saved = int(line.split()[0])
            if saved >= target:
                break
        time.sleep(0.003 * attempt)  # and at different points inside the next save
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        store = ConversationStore(folder)
        conv = store.load("victim")
        assert store.notices == [], store.notices
        assert conv is not None
        n = len(conv.messages)
        # every save reported done is on disk (the writer may have finished more before the kill landed);
        # the message in flight is either whole or absent
        assert n >= saved + 1, (saved, n)
        assert [m.content.split()[1] for m in conv.messages] == [str(i) for i in range(n)]
