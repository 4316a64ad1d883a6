"""`pip install .` works where a backend has no wheel: OpenVINO (none for Windows on ARM) is a dependency only
where it publishes wheels, and an extra elsewhere; edge imports every backend SDK lazily (tests/test_layers.py),
so its absence is a discovery line, never an import error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _project() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]


def _wanted(name: str, machine: str, platform: str) -> bool:
    env = default_environment() | {"platform_machine": machine, "sys_platform": platform}
    reqs = [Requirement(r) for r in _project()["dependencies"]]
    return any(r.name == name and (r.marker is None or r.marker.evaluate(env)) for r in reqs)


@pytest.mark.parametrize(
    ("machine", "platform", "wanted"),
    [
        ("x86_64", "linux", True),
        ("aarch64", "linux", True),
        ("AMD64", "win32", True),
        ("arm64", "darwin", True),
        ("ARM64", "win32", False),  # no OpenVINO wheel for Windows on ARM
    ],
)
def test_openvino_is_a_dependency_only_where_it_has_wheels(machine: str, platform: str, wanted: bool) -> None:
    assert _wanted("openvino", machine, platform) is wanted
    assert _wanted("onnxruntime", machine, platform)  # ORT has wheels on all of these


def test_openvino_is_an_extra_too() -> None:
    extra = [Requirement(r) for r in _project()["optional-dependencies"]["openvino"]]
    assert [r.name for r in extra] == ["openvino"]
