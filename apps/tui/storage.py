"""Saved conversations: one JSON file each under the user data dir, written atomically.

A save writes a temp file in the same folder, fsyncs it, renames it over the old file and fsyncs the folder, so
a crash or SIGKILL at any moment leaves either the previous version or the new one, never a torn file. A file
that does not parse is set aside (renamed `*.corrupt-<time>`) with a notice, never a crash.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = [
    "Conversation",
    "ConversationStore",
    "Message",
    "StoreError",
    "atomic_write",
    "default_root",
    "titles",
]

FORMAT = 1
ROLES = ("system", "user", "assistant")
_TMP_PREFIX = ".tmp-"


class StoreError(ValueError):
    """A conversation file that cannot be read back."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    stopped: bool = False  # an answer cut short by the user (kept: it is what they saw)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.stopped:
            d["stopped"] = True
        return d

    def chat(self) -> dict[str, str]:
        """The message as a chat template sees it."""
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Conversation:
    id: str
    title: str = ""
    model: str = ""
    system: str = ""
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    messages: tuple[Message, ...] = ()

    @staticmethod
    def new(model: str = "", system: str = "") -> Conversation:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return Conversation(id=f"{stamp}-{secrets.token_hex(3)}", model=model, system=system)

    def with_message(self, message: Message) -> Conversation:
        title = self.title or (message.content.strip().splitlines() or [""])[0][:60]
        return replace(self, title=title, messages=(*self.messages, message), updated=time.time())

    def replace_last(self, message: Message) -> Conversation:
        return replace(self, messages=(*self.messages[:-1], message), updated=time.time())

    def chat_messages(self) -> list[dict[str, str]]:
        """System prompt (if any) and the messages, for `Model.chat`."""
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + [m.chat() for m in self.messages]

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "id": self.id,
            "title": self.title,
            "model": self.model,
            "system": self.system,
            "created": self.created,
            "updated": self.updated,
            "messages": [m.to_dict() for m in self.messages],
        }

    @staticmethod
    def from_dict(d: Any) -> Conversation:
        """Parse and check a saved conversation; anything unexpected raises StoreError."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise StoreError("not an edge conversation (format 1)")
        msgs = d.get("messages")
        if not isinstance(msgs, list):
            raise StoreError("messages is not a list")
        out = []
        for i, m in enumerate(msgs):
            if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
                raise StoreError(f"message {i} is not a {{role, content}} object")
            out.append(Message(m["role"], m["content"], bool(m.get("stopped", False))))
        strs = {k: d.get(k, "") for k in ("id", "title", "model", "system")}
        nums = {k: d.get(k, 0.0) for k in ("created", "updated")}
        if not all(isinstance(v, str) for v in strs.values()) or not strs["id"]:
            raise StoreError("id, title, model or system is not a string")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in nums.values()):
            raise StoreError("created or updated is not a number")
        return Conversation(
            id=strs["id"],
            title=strs["title"],
            model=strs["model"],
            system=strs["system"],
            created=float(nums["created"]),
            updated=float(nums["updated"]),
            messages=tuple(out),
        )


def default_root() -> Path:
    """`$EDGE_DATA_DIR/conversations`, else the platform's user data dir (~/.local/share/edge on Linux)."""
    base = os.environ.get("EDGE_DATA_DIR")
    if not base:
        import platformdirs

        base = platformdirs.user_data_dir("edge", appauthor=False)
    return Path(base) / "conversations"


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` by `data` so that a crash at any point leaves the old or the new content whole."""
    fd, tmp = tempfile.mkstemp(prefix=_TMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if os.name == "posix":  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


class ConversationStore:
    """The conversations folder. `notices` collects what was set aside, for the app to show."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_root()
        self.notices: list[str] = []

    def _path(self, conv_id: str) -> Path:
        if not conv_id or "/" in conv_id or "\\" in conv_id or conv_id.startswith("."):
            raise StoreError(f"bad conversation id {conv_id!r}")
        return self.root / f"{conv_id}.json"

    def save(self, conv: Conversation) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(conv.id)
        data = json.dumps(conv.to_dict(), ensure_ascii=False, indent=1).encode("utf-8")
        atomic_write(path, data)
        return path

    def load(self, conv_id: str) -> Conversation | None:
        """The conversation, or None when its file is missing or was corrupt (then set aside, see notices)."""
        path = self._path(conv_id)
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return Conversation.from_dict(json.loads(raw.decode("utf-8")))
        except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError and StoreError are ValueErrors
            self._set_aside(path, str(exc))
            return None

    def conversations(self) -> list[Conversation]:
        """Every readable conversation, newest first; unreadable ones are set aside with a notice."""
        if not self.root.is_dir():
            return []
        self._sweep_temp()
        out = []
        for path in sorted(self.root.glob("*.json")):
            conv = self.load(path.stem)
            if conv is not None:
                out.append(conv)
        return sorted(out, key=lambda c: c.updated, reverse=True)

    def delete(self, conv_id: str) -> None:
        self._path(conv_id).unlink(missing_ok=True)

    def _set_aside(self, path: Path, why: str) -> None:
        target = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(path, target)
            where = f"moved to {target.name}"
        except OSError as exc:
            where = f"could not be moved ({exc})"
        self.notices.append(f"conversation file {path.name} is unreadable ({why}); {where}")

    def _sweep_temp(self, older_than_s: float = 60.0) -> None:
        """Temp files left by a save that was killed (the saved file itself is intact)."""
        now = time.time()
        for tmp in self.root.glob(_TMP_PREFIX + "*"):
            try:
                if now - tmp.stat().st_mtime > older_than_s:
                    tmp.unlink()
            except OSError:
                pass


def titles(convs: Sequence[Conversation]) -> list[str]:
    """One line per conversation for a picker: date, message count, title."""
    return [
        f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(c.updated))}  "
        f"{len(c.messages):>3} msg{'' if len(c.messages) == 1 else 's'}  {c.title or '(empty)'}"
        for c in convs
    ]
