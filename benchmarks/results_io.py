"""How benchmarks write their results: stem.json (all figures) and stem.md (the table), under any stem."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_results(stem: Path, data: Any, lines: Sequence[str]) -> None:
    """stem.json and stem.md, the table printed too. Names are appended, not Path.with_suffix: a stem may hold
    dots (a model's "qwen2.5-coder-0.5b", a tag), which with_suffix would take for a suffix."""
    stem.parent.joinpath(stem.name + ".json").write_text(json.dumps(data, indent=1) + "\n")
    stem.parent.joinpath(stem.name + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
