"""edge without llama-cpp-python (an extra since `--backend auto`): the default path runs on the own graphs,
and whatever needs llama.cpp stops with one line saying how to install it.

Each command runs in a subprocess where `import llama_cpp` raises ModuleNotFoundError, as Python does when the
package is not installed (the test venv has it: the dev extra keeps it for the reference comparisons).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gguf import GGUFValueType

from edge.models.catalog import DEFAULT_MODEL
from tests.reliability.ggufs import rewrite_gguf
from tests.shared_cache import private_cache, pull_named_models
from tests.tiny_models import TinySpec, write_tiny_model

INSTALL = 'pip install "edge-llm[llamacpp]"'
# A meta path finder ahead of every other: llama_cpp is "not installed" for this process.
PRELUDE = """
import sys

class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == "llama_cpp" or name.startswith("llama_cpp."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
from edge.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private cache: no measurement of the user's decides here, graphs stay out of the user's cache."""
    with private_cache(tmp_path_factory) as path:
        yield path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", TinySpec(arch="llama"))


def edge_without_llamacpp(cache: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_DEBUG"}
    env["EDGE_CACHE_DIR"] = str(cache)
    cmd = [sys.executable, "-c", PRELUDE, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def assert_install_hint(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edge: error:"), proc.stderr
    assert INSTALL in lines[0] and "Traceback" not in proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_the_prelude_really_hides_llama_cpp(cache: Path) -> None:
    proc = edge_without_llamacpp(cache, "devices", "--json")
    assert proc.returncode == 0, proc.stderr
    backends = {b["name"]: b for b in json.loads(proc.stdout)["backends"]}
    assert not backends["llamacpp"]["available"]
    assert "No module named 'llama_cpp'" in backends["llamacpp"]["reason"]
    assert backends["llamacpp"]["hint"] == INSTALL
    assert backends["ort"]["available"] and backends["openvino"]["available"]


def test_devices_prints_the_install_hint_as_written(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table's hint is text, not rich markup: `[llamacpp]` is printed, not swallowed as a style tag."""
    monkeypatch.setenv("COLUMNS", "400")  # one line a row
    proc = edge_without_llamacpp(cache, "devices")
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.lstrip("│ ").startswith("llamacpp"))
    assert f"({INSTALL})" in row and "No module named 'llama_cpp'" in row, proc.stdout


def test_auto_runs_on_an_own_graph(cache: Path, tiny: Path) -> None:
    proc = edge_without_llamacpp(cache, "run", str(tiny), "w1 w2", "--raw", "--max-tokens", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["backend"] in ("ort", "openvino") and out["n_tokens"] == len(out["token_ids"]) > 0
    assert out["backend_auto"]["source"] in ("prior", "default", "measured")


def test_what_needs_llama_cpp_says_how_to_install_it(cache: Path, tiny: Path, tmp_path: Path) -> None:
    assert_install_hint(
        edge_without_llamacpp(cache, "run", str(tiny), "w1", "--backend", "llamacpp", "--max-tokens", "2"),
        "llamacpp",
    )
    # the own graphs refuse YaRN RoPE scaling: only llama.cpp would run this file
    yarn = {"llama.rope.scaling.type": ("yarn", GGUFValueType.STRING)}
    refused = rewrite_gguf(tiny, tmp_path / "yarn.gguf", yarn)
    assert_install_hint(
        edge_without_llamacpp(cache, "run", str(refused), "w1", "--max-tokens", "2"),
        "'yarn'",
        "only llama.cpp runs this file",
    )
    # reference comparisons: eval's default reference is llama.cpp, bench can name it
    assert_install_hint(edge_without_llamacpp(cache, "eval", str(tiny), "--backend", "ort", "--tokens", "8"))
    assert_install_hint(
        edge_without_llamacpp(
            cache, "bench", str(tiny), "--backends", "ort,llamacpp", "--repeat", "1", "--gen-tokens", "2"
        )
    )


@pytest.mark.slow
def test_the_readme_first_command_without_llama_cpp(cache: Path) -> None:
    """`edge run "Why is the sky blue?"` as the README has it, on the default model: a sensible answer."""
    pull_named_models([DEFAULT_MODEL])
    proc = edge_without_llamacpp(
        cache, "run", "Why is the sky blue?", "--json", "--temperature", "0", "--max-tokens", "96"
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["model"] == DEFAULT_MODEL and out["backend"] in ("ort", "openvino")
    text = out["text"].lower()
    assert "scatter" in text or "wavelength" in text or "rayleigh" in text, out["text"]
