"""Backends are registered once (devices/registry.py): one entry makes a backend discovered, placeable, offered
as a fallback, listed by `edge devices` and loadable through `edge.load`; every name used elsewhere is one of
the registry's; each backend sizes a model in its own KV form."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import edge
from edge.cli import main
from edge.devices.discovery import discover
from edge.devices.memory import graph_memory, llamacpp_memory
from edge.devices.placement import Placement, place
from edge.devices.planner import PREFERRED_BACKENDS
from edge.devices.registry import BACKENDS, Backend, DecoderOptions, estimate_memory, runnable_backends
from edge.errors import InsufficientMemoryError
from edge.model import _takeover_candidates
from edge.models.gguf_file import open_gguf
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("registry") / "tiny.gguf", TinySpec(seed=5))


@pytest.fixture
def extra(monkeypatch: pytest.MonkeyPatch) -> Backend:
    """A second name for llama.cpp, added as one registry entry and nothing else."""
    base = BACKENDS["llamacpp"]
    entry = Backend(
        "llamacpp-again", lambda: replace(base.probe(), name="llamacpp-again"), base.open, base.memory
    )
    monkeypatch.setitem(BACKENDS, entry.name, entry)
    return entry


def test_one_entry_adds_a_backend_everywhere(
    extra: Backend, model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert extra.name in runnable_backends()
    inventory = discover()
    status = inventory.backend(extra.name)
    assert status is not None and status.available
    assert place(inventory, backend=extra.name, device="cpu") == Placement(extra.name, "cpu")
    assert (extra.name, "cpu") in _takeover_candidates("ort", "cpu")
    assert main(["devices", "--json"]) == 0
    listed = {b["name"]: b["runs_models"] for b in json.loads(capsys.readouterr().out)["backends"]}
    assert listed[extra.name] is True and listed["coreml"] is False
    with edge.load(str(model_file), backend=extra.name, n_ctx=128, n_threads=1) as m:
        result = m.generate("w1 w2", raw=True, max_tokens=3)
    assert (m.backend, result.backend) == (extra.name, extra.name) and result.stats.n_tokens >= 1


def test_names_used_elsewhere_are_registered() -> None:
    assert all(name == b.name for name, b in BACKENDS.items())
    assert {b.name for b in discover().backends} == set(BACKENDS)
    for kind, names in PREFERRED_BACKENDS.items():
        assert set(names) <= set(runnable_backends()), kind
    for b in BACKENDS.values():  # a backend that opens a model says what that takes
        assert (b.memory is not None) == b.runnable, b.name


def test_each_backend_sizes_its_own_kv(model_file: Path) -> None:
    g = open_gguf(model_file)
    spec = TinySpec()
    per_token = spec.n_layer * spec.n_head_kv * 2 * spec.head_dim  # K and V values per token
    # llama.cpp: f16, the context padded to 256; the graphs: an f32 ring of exactly n_ctx slots
    assert llamacpp_memory(g, 100).kv_cache == 2 * 256 * per_token
    assert graph_memory(g, 100).kv_cache == 4 * 100 * per_token
    assert estimate_memory("ort", model_file, 100) == graph_memory(g, 100)
    assert estimate_memory("llamacpp", model_file, 100) == llamacpp_memory(g, 100)


@pytest.mark.parametrize("backend", ["llamacpp", "ort"])
def test_too_big_is_refused_by_the_chosen_backend(backend: str, model_file: Path) -> None:
    # the KV type named: auto would keep an f32 ring that does not fit in f16 (tests/devices/test_kv_dtype.py)
    kv = "f16" if backend == "llamacpp" else "f32"
    need = estimate_memory(backend, model_file, 4096, DecoderOptions(kv_dtype=kv))
    assert need is not None
    with pytest.raises(
        InsufficientMemoryError, match=f"needs about [0-9]+ MiB of memory on {backend} "
    ) as err:
        edge.load(str(model_file), backend=backend, n_ctx=4096, available_memory=need.total - 1, kv_dtype=kv)
    assert err.value.needed == need.total
