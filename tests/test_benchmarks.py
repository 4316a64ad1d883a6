"""benchmarks/ stays a set of tools a maintainer can run again (benchmarks/README.md): every script imports as
`benchmarks.NAME` without path tricks and answers `--help`, each is listed in the README, and the folder keeps
to the tools (one-off investigations are recorded in results/ and removed, not kept beside them)."""

from __future__ import annotations

import importlib
import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if p.stem != "__init__")
MAX_SCRIPTS = 22  # issue 31: at most half of the 44 there were


def test_the_folder_keeps_to_the_tools() -> None:
    assert len(SCRIPTS) <= MAX_SCRIPTS, f"{len(SCRIPTS)} scripts: record one-off findings in results/ instead"


def test_every_script_is_listed_in_the_readme() -> None:
    readme = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    section = readme.split("## The scripts", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)\.py` \|", section, flags=re.M))
    assert listed == set(SCRIPTS), (sorted(set(SCRIPTS) - listed), sorted(listed - set(SCRIPTS)))


def test_no_script_edits_the_import_path() -> None:
    edits = [s for s in SCRIPTS if "sys.path" in (BENCHMARKS / f"{s}.py").read_text(encoding="utf-8")]
    assert not edits, f"run them as `python -m benchmarks.NAME` instead: {edits}"


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_answers_help(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`python -m benchmarks.NAME --help`, in this process (helpers without a main just import)."""
    module = f"benchmarks.{name}"
    if 'if __name__ == "__main__"' not in (BENCHMARKS / f"{name}.py").read_text(encoding="utf-8"):
        importlib.import_module(module)
        return
    monkeypatch.delitem(sys.modules, module, raising=False)  # another script may have imported it already
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert exit_.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out
