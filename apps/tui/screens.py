"""Modal screens of the chat app: help, saved conversations, settings (model, device, system prompt, temperature)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Markdown, OptionList, Select
from textual.widgets.option_list import Option

from edge.apps.tui.settings import ChatSettings
from edge.apps.tui.storage import Conversation, titles

KEYS = """\
# edge chat: keys

| key | what it does |
|---|---|
| **Enter** | send the message |
| **Ctrl+J** / Shift+Enter / Alt+Enter | new line in the message |
| **Esc** / **Ctrl+C** | stop the answer being generated (the model stays ready) |
| **Ctrl+N** | new conversation |
| **Ctrl+O** | saved conversations: open one |
| **F2** | settings: model, device, system prompt, temperature |
| **F1** | this help |
| **Ctrl+Q** | quit |

Conversations are saved automatically after every message. Each turn reuses the KV cache of the
earlier ones, so only the new text is prefilled. The bar at the bottom shows the time to the first
token (TTFT), decode speed, tokens, how much of the prompt was reused, the KV cache fill, where the
model runs and any device fallback.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,f1,q", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            yield Markdown(KEYS)
            yield Button("Close (Esc)", id="close")

    @on(Button.Pressed, "#close")
    def close(self) -> None:
        self.dismiss(None)


class ConversationsScreen(ModalScreen["str | None"]):
    """Saved conversations, newest first; Enter opens one."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Close")]

    def __init__(self, conversations: Sequence[Conversation]) -> None:
        super().__init__()
        self.conversations = list(conversations)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog"):
            yield Label("[b]Saved conversations[/] (Enter opens, Esc closes)")
            if self.conversations:
                options = [
                    Option(t, id=c.id)
                    for t, c in zip(titles(self.conversations), self.conversations, strict=True)
                ]
                yield OptionList(*options, id="conversations")
            else:
                yield Label("No saved conversations yet.", id="empty")

    def on_mount(self) -> None:
        for found in self.query(OptionList):
            found.focus()

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)


class SettingsScreen(ModalScreen["ChatSettings | None"]):
    """Model and device pickers, system prompt and temperature; Apply returns new settings."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(
        self,
        settings: ChatSettings,
        models: Sequence[tuple[str, str]],
        devices: Sequence[str],
        system_default: str = "",
    ) -> None:
        """`models`: (label, value) pairs; `devices`: "backend:device" values; `system_default`: what an empty
        system prompt means for the loaded model (the placeholder)."""
        super().__init__()
        self.settings = settings
        self.models = list(models)
        self.devices = list(devices)
        self.system_default = system_default

    def compose(self) -> ComposeResult:
        s = self.settings
        model_values = [v for _, v in self.models]
        models = self.models + ([(s.model, s.model)] if s.model and s.model not in model_values else [])
        current_dev = f"{s.backend or 'auto'}:{s.device}"
        devices = self.devices + ([current_dev] if current_dev not in self.devices else [])
        with VerticalScroll(id="dialog"):
            yield Label("[b]Settings[/]")
            yield Label("Model")
            yield Select(models, value=s.model or models[0][1], allow_blank=False, id="model")
            yield Label("Backend and device")
            yield Select([(d, d) for d in devices], value=current_dev, allow_blank=False, id="device")
            yield Label("System prompt (empty: the template's default, shown greyed)")
            yield Input(s.system, placeholder=self.system_default, id="system")
            yield Label("Temperature (0 = greedy)")
            yield Input(f"{s.temperature:g}", type="number", id="temperature")
            with Horizontal(id="buttons"):
                yield Button("Apply", variant="primary", id="apply")
                yield Button("Cancel", id="cancel")

    def on_mount(self) -> None:
        self.query_one("#model", Select).focus()

    @on(Button.Pressed, "#apply")
    def apply(self) -> None:
        try:
            temperature = float(self.query_one("#temperature", Input).value or "0")
            backend, _, device = str(self.query_one("#device", Select).value).partition(":")
            settings = replace(
                self.settings,
                model=str(self.query_one("#model", Select).value),
                backend=backend,
                device=device,
                system=self.query_one("#system", Input).value,
                temperature=temperature,
            )
        except ValueError as exc:
            self.notify(f"invalid setting: {exc}", severity="error")
            return
        self.dismiss(settings)

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)
