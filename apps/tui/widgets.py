"""The chat app's widgets: messages rendered as Markdown, the prompt input, the stats bar."""

from __future__ import annotations

from textual import events
from textual.message import Message
from textual.widgets import Markdown, Static, TextArea


class ChatMessage(Markdown):
    """One message; the role is a CSS class (user, assistant, system, notice)."""

    def __init__(self, text: str, role: str, *, stopped: bool = False) -> None:
        super().__init__(text, classes=role)
        self.role = role
        self.border_title = {"user": "you", "assistant": "edge", "system": "system"}.get(role, "")
        if stopped:
            self.mark_stopped()

    def mark_stopped(self) -> None:
        self.border_subtitle = "stopped"
        self.add_class("stopped")


class PromptInput(TextArea):
    """Multiline input: Enter sends, Ctrl+J / Shift+Enter / Alt+Enter insert a newline."""

    NEWLINE_KEYS = frozenset({"ctrl+j", "shift+enter", "alt+enter"})

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus")
        self.border_title = "message (Enter sends, Ctrl+J newline)"

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text
            if text.strip():
                self.post_message(self.Submitted(text))
            return
        if event.key in self.NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        await super()._on_key(event)


class StatsBar(Static):
    """The live stats line (see apps.tui.stats.stats_text)."""
