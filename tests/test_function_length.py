"""No function in the packages is longer than 80 lines (issue 31): a long function hides its steps, so split it
into named ones. The allow-list holds what cannot be split yet, each entry with its reason."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edge", "devices", "graph_opt", "kvcache", "models", "apps")
MAX_LINES = 80

# "path::qualified.name": why it stays long for now (one line)
ALLOWED: dict[str, str] = {}


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function, nested ones and methods too."""
    out: list[tuple[str, int]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            out.append((name, (node.end_lineno or node.lineno) - node.lineno + 1))
            out += _functions(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            out += _functions(node, prefix + node.name + ".")
        else:
            out += _functions(node, prefix)
    return out


def long_functions() -> dict[str, int]:
    found: dict[str, int] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            rel = path.relative_to(ROOT).as_posix()
            found |= {f"{rel}::{name}": n for name, n in _functions(tree) if n > MAX_LINES}
    return found


def test_no_function_over_80_lines() -> None:
    over = {name: n for name, n in long_functions().items() if name not in ALLOWED}
    assert not over, f"split these into named steps (or allow-list one with its reason): {over}"


def test_allow_list_is_current() -> None:
    """An entry whose function got short (or was renamed) leaves the list, so the list stays true."""
    stale = sorted(set(ALLOWED) - set(long_functions()))
    assert not stale, f"no longer over {MAX_LINES} lines, remove from ALLOWED: {stale}"
    assert all(reason.strip() for reason in ALLOWED.values())
