"""docs/architecture.md's "Every module" names each package's modules, no more and no fewer (issue 47: the
map a newcomer finds their way in by stays true to the tree)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the packages' folders in the repository (pyproject's package-dir maps them under the import root `edge`)
TOPS = ("edge", "apps", "devices", "models", "graph_opt", "kvcache")


def _tree() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for top in TOPS:
        for init in (ROOT / top).rglob("__init__.py"):
            folder = init.parent
            if "data" in folder.relative_to(ROOT).parts:
                continue
            found[folder.relative_to(ROOT).as_posix()] = {p.name for p in folder.glob("*.py")}
    return found


def _map() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## Every module\n", 1)[1].split("\n## ", 1)[0]
    listed: dict[str, set[str]] = {}
    folder = None
    for line in section.splitlines():
        if m := re.fullmatch(r"\*\*`([\w/]+)/`\*\*", line.strip()):
            folder = m.group(1)
            listed[folder] = set()
        elif (m := re.match(r"- `([\w.]+\.py)`: \S", line)) and folder is not None:
            listed[folder].add(m.group(1))
    return listed


def test_every_package_and_module_is_on_the_map() -> None:
    tree, listed = _tree(), _map()
    assert set(listed) == set(tree), (
        f"packages: missing {set(tree) - set(listed)}, gone {set(listed) - set(tree)}"
    )
    for folder, modules in tree.items():
        assert listed[folder] == modules, (
            f"{folder}/: not on the map {sorted(modules - listed[folder])}, "
            f"on the map but gone {sorted(listed[folder] - modules)}"
        )
