"""One import root: an installed edge puts nothing generic (models, devices, apps, ...) at the top of
site-packages, so an app with its own `models` package and `devices.py` module imports edge and runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.tiny_models import TinySpec, write_tiny_model

ROOT = Path(__file__).resolve().parents[1]

APP = """
import devices
import models
from models.user import User

import edge
import edge.models

assert models.__file__.startswith({app!r}), models.__file__
assert devices.KIND == "the app's own"
assert edge.__file__.startswith({site!r}), edge.__file__
assert edge.models.__name__ == "edge.models" and edge.models.__file__.startswith({site!r})
with edge.load({model!r}, backend="ort") as m:
    out = m.generate("hello", max_tokens=4, temperature=0)
assert len(out.token_ids) == 4, out
print("ok", User().name, out.token_ids)
"""


@pytest.mark.slow
def test_an_app_with_its_own_models_package_runs_edge(tmp_path: Path) -> None:
    site = (
        tmp_path / "site"
    )  # a regular (non-editable) install of edge alone; its dependencies are this venv's
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    proc = subprocess.run([*pip, "--target", str(site), str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    top = sorted(p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".egg-info")))
    assert top == ["bin", "edge"] or top == ["edge"], top  # nothing else at the top level
    assert (site / "edge" / "models" / "gguf_file.py").is_file()

    app = tmp_path / "app"
    (app / "models").mkdir(parents=True)
    (app / "models" / "__init__.py").write_text("")
    (app / "models" / "user.py").write_text("class User:\n    name = 'ada'\n")
    (app / "devices.py").write_text('KIND = "the app\'s own"\n')
    model = write_tiny_model(tmp_path / "tiny.gguf", TinySpec())
    script = APP.format(app=str(app), site=str(site), model=str(model))
    (app / "main.py").write_text(textwrap.dedent(script))
    env = {**os.environ, "PYTHONPATH": str(site), "EDGE_CACHE_DIR": str(tmp_path / "cache")}
    run = subprocess.run(
        [sys.executable, "main.py"], cwd=app, capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("ok ada"), run.stdout


def test_every_package_is_installed() -> None:
    """pyproject lists the packages (the folders map to edge.<folder>): a new one must be listed too."""
    text = (ROOT / "pyproject.toml").read_text()
    listed = set(
        re.findall(r'^\s*"(edge(?:\.[a-z_]+)*)",$', text.split("packages = [")[1].split("]")[0], re.M)
    )
    folders = {"edge": "edge", "apps": "edge.apps", "devices": "edge.devices", "graph_opt": "edge.graph_opt"}
    folders |= {"kvcache": "edge.kvcache", "models": "edge.models"}
    found = set()
    for folder, name in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join([name, *rel]))
    assert found == listed, (sorted(found - listed), sorted(listed - found))
