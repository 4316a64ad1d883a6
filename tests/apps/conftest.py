"""Snapshot tests need pytest-textual-snapshot (the dev extra); without it they skip instead of erroring."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("pytest_textual_snapshot") is None:

    @pytest.fixture
    def snap_compare() -> None:
        pytest.skip("pytest-textual-snapshot is not installed (pip install -e '.[dev]')")
