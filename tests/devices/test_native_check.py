"""llama.cpp's known-answer check (devices/native_check.py): each configuration runs in a child process on the
check's tiny files and its logits are compared with edge's exact graph; the first that passes is what edge
loads, none passing refuses the backend.

A crash and a miscompute are injected as configurations of the check (its fault seam): the child really dies
by SIGSEGV, or llama.cpp really computes on a file whose embedding rows are rotated. So the fallback, its
reports (`edge devices`, `edge run --explain`, `--json`) and the refusal are proven on any CPU, not only on the
AMX Xeon where llama-cpp-python 0.3.36 crashes (issue #29).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from gguf import GGUFValueType

from edge.devices import native_check
from edge.devices.native_check import (
    CONFIGS,
    FAULT_ENV,
    TOLERANCE,
    configurations,
    llamacpp_config,
    llamacpp_verdict,
)
from edge.errors import BackendUnavailableError
from tests.reliability.ggufs import rewrite_gguf
from tests.shared_cache import SHARED_CACHE, share_models
from tests.tiny_models import TinySpec, write_tiny_model

DEFAULT, SAFE = CONFIGS
CRASH = "default=sigsegv"
MISCOMPUTE = "default=miscompute"
BOTH = "default=sigsegv,no-extra-bufts=miscompute"
EDGE = [sys.executable, "-m", "edge.cli"]

pytest.importorskip("llama_cpp")


def _private(path: Path) -> Path:
    """A cache whose verdicts are this module's own (faulted ones stay out of the shared cache); models are
    shared."""
    path.mkdir(parents=True, exist_ok=True)
    (SHARED_CACHE / "models").mkdir(parents=True, exist_ok=True)
    os.symlink(SHARED_CACHE / "models", path / "models", target_is_directory=True)
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = _private(tmp_path_factory.mktemp("native_cache"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE_CACHE_DIR", str(path))
        mp.delenv(FAULT_ENV, raising=False)
        yield path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "llama.gguf", TinySpec(arch="llama"))


def edge(cache: Path, fault: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EDGE_DEBUG", FAULT_ENV)}
    env.update(EDGE_CACHE_DIR=str(cache), COLUMNS="400")  # wide: rich wraps no status line
    if fault is not None:
        env[FAULT_ENV] = fault
    return subprocess.run([*EDGE, *args], capture_output=True, text=True, timeout=300, env=env)


def run_json(cache: Path, fault: str | None, tiny: Path, *extra: str) -> tuple[dict, str]:
    proc = edge(cache, fault, "run", str(tiny), "w1 w2", "--raw", "--max-tokens", "2", "--json", *extra)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def devices_llamacpp(cache: Path, fault: str | None) -> dict:
    proc = edge(cache, fault, "devices", "--json")
    assert proc.returncode == 0, proc.stderr
    return next(b for b in json.loads(proc.stdout)["backends"] if b["name"] == "llamacpp")


# -- the check itself ----------------------------------------------------------------------------------------
def test_a_healthy_build_passes_on_its_default_and_is_recalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This machine's real llama.cpp, a fresh cache: one child, the default passes within the bound; asked
    again, the verdict comes from the cache and no child runs."""
    monkeypatch.setenv("EDGE_CACHE_DIR", str(_private(tmp_path / "cache")))
    verdict = llamacpp_verdict(CONFIGS)
    assert verdict.ran and verdict.config == DEFAULT and verdict.note() == ""
    (outcome,) = verdict.outcomes
    assert outcome.passed and outcome.worst is not None and 0 < outcome.worst < TOLERANCE
    print(
        f"\n[native check] default: worst row {outcome.worst:.4f} (bound {TOLERANCE}), child {outcome.seconds} s"
    )

    def no_child(*args: object, **kwargs: object) -> None:
        raise AssertionError("the check ran a child again")

    monkeypatch.setattr(native_check.subprocess, "run", no_child)
    again = llamacpp_verdict(CONFIGS)
    assert not again.ran and again.config == DEFAULT and again.outcomes == verdict.outcomes
    assert llamacpp_config() == DEFAULT  # what the llamacpp factory loads with


def test_a_crashing_default_falls_back_to_extra_buffer_types_off(cache: Path) -> None:
    verdict = llamacpp_verdict((replace(DEFAULT, fault="sigsegv"), SAFE))
    crash, safe = verdict.outcomes
    assert crash.failure == "SIGSEGV" and not crash.passed  # the child's process died by the signal
    assert safe.passed and safe.worst is not None and safe.worst < TOLERANCE
    assert verdict.config == SAFE and not verdict.config.extra_bufts
    assert verdict.note() == "extra buffer types off: the default failed its known-answer check: SIGSEGV"


def test_a_miscomputing_default_is_found_by_its_logits(cache: Path) -> None:
    verdict = llamacpp_verdict((replace(DEFAULT, fault="miscompute"), SAFE))
    wrong, safe = verdict.outcomes
    assert not wrong.passed and wrong.failure.startswith("logits off on ")
    assert wrong.worst is not None and wrong.worst > 4 * TOLERANCE  # garbage is far from the bound
    assert verdict.config == SAFE and safe.passed


def test_a_hanging_configuration_times_out_and_is_checked_again(cache: Path) -> None:
    # the SIGSEGV child gets the normal timeout: importing llama.cpp alone may take seconds on a busy CI
    hang = llamacpp_verdict((replace(DEFAULT, fault="hang"),), timeout=3)
    assert hang.config is None and [o.failure for o in hang.outcomes] == ["timeout after 3 s"]
    assert "every configuration" in hang.note() and "timeout after 3 s" in hang.note()
    again = llamacpp_verdict((replace(DEFAULT, fault="hang"),), timeout=3)
    assert again.ran  # a timeout may be the moment's (a loaded machine): never remembered
    crash = llamacpp_verdict((replace(SAFE, fault="sigsegv"),))
    assert [o.failure for o in crash.outcomes] == ["SIGSEGV"]
    assert not llamacpp_verdict((replace(SAFE, fault="sigsegv"),)).ran  # a crash repeats: remembered


def test_the_fault_seam_is_parsed_strictly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, BOTH)
    assert [c.fault for c in configurations()] == ["sigsegv", "miscompute"]
    monkeypatch.setenv(FAULT_ENV, "default=explode")
    with pytest.raises(BackendUnavailableError, match=FAULT_ENV):
        configurations()
    monkeypatch.delenv(FAULT_ENV)
    assert configurations() == CONFIGS


def test_the_verdict_is_keyed_by_build_cpu_and_configuration() -> None:
    library = native_check._library()
    assert library["version"] and library["libraries"]  # llama-cpp-python's own shared libraries
    key = native_check._key(DEFAULT, library)
    assert key == native_check._key(DEFAULT, native_check._library())
    rebuilt = {**library, "libraries": [[p, size + 1, t] for p, size, t in library["libraries"]]}
    assert len({key, native_check._key(DEFAULT, rebuilt), native_check._key(SAFE, library)}) == 3
    assert native_check._key(replace(DEFAULT, fault="sigsegv"), library) != key


def test_the_safe_configuration_really_loads_without_extra_buffer_types(tiny: Path) -> None:
    from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions

    for extra in (True, False):
        with LlamaCppDecoder(tiny, LlamaCppOptions(n_ctx=64, extra_bufts=extra)) as dec:
            assert dec._llama.model_params.use_extra_bufts is extra  # what llama_model_load_from_file got


# -- what the user sees --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fault", [CRASH, MISCOMPUTE])
def test_a_failed_default_runs_the_safe_configuration_and_says_so(
    cache: Path, tiny: Path, fault: str
) -> None:
    why = "SIGSEGV" if fault == CRASH else "logits off"
    status = devices_llamacpp(cache, fault)
    assert status["available"] and status["runs_models"]
    assert status["note"].startswith("extra buffer types off: the default failed") and why in status["note"]
    check = status["native_check"]
    assert check["config"] == "no-extra-bufts" and [o["passed"] for o in check["outcomes"]] == [False, True]

    table = edge(cache, fault, "devices")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if "llamacpp" in line)
    assert "ready (extra buffer types off: the default failed its known-answer check: " in row and why in row

    out, stderr = run_json(cache, fault, tiny, "--backend", "llamacpp", "--explain")
    assert out["backend"] == "llamacpp" and out["n_tokens"] > 0
    assert out["backend_config"]["name"] == "no-extra-bufts" and why in out["backend_config"]["note"]
    assert "llama.cpp: extra buffer types off: the default failed its known-answer check" in stderr
    assert "edge: note: llama.cpp runs with extra buffer types off: the default failed" in stderr


def test_the_configuration_that_runs_is_said_whatever_it_is(
    tmp_path: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No fault: the row and the run say which configuration runs (on this Zen 4, the default)."""
    shared = share_models(tmp_path / "cache")  # the run's verdicts: checked once for every test
    monkeypatch.setenv("EDGE_CACHE_DIR", str(shared))
    verdict = llamacpp_verdict()
    assert verdict.config is not None, verdict.note()
    said = verdict.describe()
    if verdict.config == DEFAULT:
        assert said == "default, extra buffer types on: passed its known-answer check"
    status = devices_llamacpp(shared, None)
    assert status["available"] and status["note"] == said
    assert status["native_check"] == verdict.to_dict()
    out, stderr = run_json(shared, None, tiny, "--backend", "llamacpp", "--explain")
    assert out["backend_config"] == {"name": verdict.config.name, "why": said, "note": verdict.note() or None}
    assert f"  llama.cpp: {said}" in stderr
    from edge.bench import machine_info  # what edge bench records with its figures

    assert machine_info(None)["backend_notes"]["llamacpp"] == said


def test_every_configuration_failing_refuses_llamacpp(cache: Path, tiny: Path, tmp_path: Path) -> None:
    status = devices_llamacpp(cache, BOTH)
    assert not status["available"] and "known-answer check in every configuration" in status["reason"]
    assert status["native_check"]["config"] is None

    named = edge(cache, BOTH, "run", str(tiny), "w1", "--backend", "llamacpp", "--max-tokens", "2")
    lines = named.stderr.strip().splitlines()
    assert named.returncode == 1 and len(lines) == 1 and "Traceback" not in named.stderr, named.stderr
    assert lines[0].startswith("edge: error: backend 'llamacpp' is unavailable: llama.cpp failed its")
    assert "default: SIGSEGV; no-extra-bufts: logits off" in lines[0] and "--backend ort" in lines[0]

    out, stderr = run_json(cache, BOTH, tiny, "--explain")  # auto: never the refused llama.cpp
    assert out["backend"] in ("ort", "openvino") and out["backend_config"] is None
    assert "edge: note: llamacpp is not a candidate: llama.cpp failed its known-answer check" in stderr

    # a file only llama.cpp would run (the own graphs refuse YaRN): a clear refusal, not an install hint
    yarn = rewrite_gguf(
        tiny, tmp_path / "yarn.gguf", {"llama.rope.scaling.type": ("yarn", GGUFValueType.STRING)}
    )
    refused = edge(cache, BOTH, "run", str(yarn), "w1", "--max-tokens", "2")
    assert refused.returncode == 1 and "only llama.cpp runs this file, and llama.cpp failed" in refused.stderr


def test_every_configuration_failing_stops_a_direct_open(
    cache: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench, eval and the drafters open llama.cpp through the registry: the same refusal, typed."""
    from edge.devices.registry import open_decoder

    monkeypatch.setenv(FAULT_ENV, BOTH)
    with pytest.raises(BackendUnavailableError, match="known-answer check in every configuration") as err:
        open_decoder("llamacpp", tiny)
    assert err.value.hint is not None and "--backend ort" in err.value.hint
