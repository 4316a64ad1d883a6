"""The Textual chat app (`edge chat`)."""

from __future__ import annotations

from typing import Any

from edge.apps.tui.app import ChatApp, run_chat
from edge.apps.tui.settings import ChatSettings
from edge.apps.tui.storage import Conversation, ConversationStore, Message

__all__ = ["ChatApp", "ChatSettings", "Conversation", "ConversationStore", "Message", "main", "run_chat"]


def main(**options: Any) -> int:
    """Entry point of `edge chat` (registered as the `edge.apps` entry point `chat`): options are
    `ChatSettings` fields."""
    return run_chat(ChatSettings(**options))
