"""No class of the chat app overrides a Textual name without meaning to.

`ChatApp._flush(pending, stream)` once replaced Textual's `App._flush(stderr=...)`: a model pull writing to
stderr then broke the app. Every class in apps.tui that subclasses a Textual class is checked: the names it
defines (class attributes, methods, and `self.x = ...` in its methods) must not be names a Textual base
defines (in its class or as `self.x = ...` in its own methods), except the framework's documented hooks and
the few overrides listed below with their reason.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
import textwrap
from functools import cache

import edge.apps.tui

# Hooks Textual documents for subclasses to define.
HOOK = re.compile(r"^(compose|render|on_.+|action_.+|watch_.+|validate_.+|compute_.+|__\w+__)$")
# Class-level configuration Textual reads from subclasses.
CONFIG = {"CSS", "DEFAULT_CSS", "BINDINGS", "TITLE", "SUB_TITLE", "CSS_PATH", "COMMANDS", "AUTO_FOCUS"}
# Public attributes Textual documents as set-by-the-app (reactives).
SETTABLE = {"title", "sub_title", "border_title", "border_subtitle"}
# (class, name): a deliberate override, and why.
ALLOWED = {
    ("PromptInput", "_on_key"): "Enter sends instead of inserting a newline; it calls TextArea._on_key",
}


def _textual(cls: type) -> bool:
    return cls.__module__.split(".")[0] == "textual"


def _self_assigned(cls: type) -> set[str]:
    """Names a class's own methods assign as `self.NAME = ...` (nested classes are theirs, not its)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return set()
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    names = set()
    for method in node.body:
        if not isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for stmt in ast.walk(method):
            if isinstance(stmt, ast.Assign):
                targets = stmt.targets
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
                targets = [stmt.target]
            else:
                continue
            for sub in (n for t in targets for n in ast.walk(t)):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id == "self"
                ):
                    names.add(sub.attr)
    return names


@cache
def _framework_names(cls: type) -> frozenset[str]:
    """Every name the Textual classes in `cls`'s MRO define."""
    names: set[str] = set()
    for base in cls.__mro__:
        if _textual(base):
            names |= set(vars(base)) | _self_assigned(base)
    return frozenset(names)


def _app_classes() -> list[type]:
    found = []
    for info in pkgutil.walk_packages(edge.apps.tui.__path__, "edge.apps.tui."):
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and any(_textual(b) for b in cls.__mro__[1:]):
                found.append(cls)
    return found


@cache
def _set_by_textual(base: type) -> frozenset[str]:
    """Names Textual itself puts on every subclass of `base` (e.g. `_reactives`, `_merged_bindings`)."""
    return frozenset(vars(type("Bare", (base,), {"__module__": __name__})))


def clashes(cls: type) -> list[str]:
    framework = _framework_names(cls)
    textual_base = next(b for b in cls.__mro__ if _textual(b))
    own = {n for n in vars(cls) if not HOOK.match(n) and n not in CONFIG} - _set_by_textual(textual_base)
    assigned = _self_assigned(cls) - SETTABLE
    return sorted(
        f"{cls.__module__}.{cls.__qualname__}.{n}"
        for n in (own | assigned) & framework
        if (cls.__name__, n) not in ALLOWED
    )


def test_the_check_finds_textual_classes_and_catches_a_shadowing_method() -> None:
    from textual.app import App

    names = {c.__name__ for c in _app_classes()}
    assert {"ChatApp", "PromptInput", "ChatMessage", "StatsBar", "PullBar", "SettingsScreen"} <= names

    class Shadowing(App[None]):
        async def _flush(self, pending: object, stream: object) -> None: ...

        def mine(self) -> None:
            self._exit_renderables = []  # a Textual instance attribute, assigned in App.__init__

    assert clashes(Shadowing) == [
        f"{__name__}.{Shadowing.__qualname__}._exit_renderables",
        f"{__name__}.{Shadowing.__qualname__}._flush",
    ]


def test_no_app_class_overrides_a_framework_name() -> None:
    found = [c for cls in _app_classes() for c in clashes(cls)]
    assert not found, (
        "these override a Textual name (rename, or add to ALLOWED with the reason):\n" + "\n".join(found)
    )
