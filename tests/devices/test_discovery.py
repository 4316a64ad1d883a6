"""Device discovery is truthful on this machine, and placement never falls back silently."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from edge.devices.discovery import BackendDevice, BackendStatus, CpuInfo, Inventory, discover
from edge.devices.placement import place
from edge.errors import BackendUnavailableError, DeviceError


def _cpuinfo_flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("flags"))
    return set(line.split(":", 1)[1].split())


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="needs Linux /proc/cpuinfo")
def test_devices_json_matches_the_machine() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "edge.cli", "devices", "--json"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    inv = json.loads(out.stdout)
    flags = _cpuinfo_flags()
    isa = inv["cpu"]["isa"]
    assert isa["avx2"] == ("avx2" in flags)
    assert isa["avx512f"] == ("avx512f" in flags)
    assert isa["avx512_vnni"] == ("avx512_vnni" in flags)
    assert isa["avx512_bf16"] == ("avx512_bf16" in flags)
    assert isa["amx"] == any(f.startswith("amx") for f in flags)
    assert inv["memory_total_mb"] > 0 and 0 < inv["memory_available_mb"] <= inv["memory_total_mb"]
    backends = {b["name"]: b for b in inv["backends"]}
    assert set(backends) == {"llamacpp", "openvino", "ort", "coreml"}
    llama = backends["llamacpp"]
    assert llama["available"] and llama["version"]
    assert llama["devices"][0]["kind"] == "cpu"
    for b in backends.values():  # an unavailable backend always says why
        assert b["available"] or b["reason"]
    if sys.platform != "darwin":
        assert not backends["coreml"]["available"]


def _inventory(*backends: BackendStatus) -> Inventory:
    cpu = CpuInfo("test cpu", "x86_64", 4, 8, {"avx2": True})
    return Inventory("Linux", cpu, 16000, 8000, backends)


CPU_ONLY = _inventory(BackendStatus("llamacpp", True, "0", (BackendDevice("cpu", "cpu"),)))
WITH_GPU = _inventory(
    BackendStatus("llamacpp", True, "0", (BackendDevice("cpu", "cpu"), BackendDevice("gpu", "gpu")))
)


def test_absent_device_lists_what_exists() -> None:
    with pytest.raises(DeviceError, match=r"no npu .*found: llamacpp:cpu.*--fallback"):
        place(CPU_ONLY, backend=None, device="npu")


def test_absent_npu_offers_emulate_and_names_only_a_chosen_backend() -> None:
    ov_cpu = _inventory(
        BackendStatus("llamacpp", True, "0", (BackendDevice("cpu", "cpu"),)),
        BackendStatus("openvino", True, "0", (BackendDevice("CPU", "cpu"),)),
    )
    # `--device npu` alone: openvino is edge's choice, not the user's, so the message does not name it
    with pytest.raises(DeviceError) as err:
        place(ov_cpu, backend="openvino", device="npu", backend_named=False)
    msg = err.value.message
    assert msg.startswith("no npu is usable on this machine (found: ") and "by openvino" not in msg
    assert "--device npu --emulate" in (err.value.hint or "") and "--fallback cpu" in (err.value.hint or "")
    # `--backend openvino --device npu`: the user chose it, so it is named
    with pytest.raises(DeviceError, match="no npu is usable by openvino on this machine"):
        place(ov_cpu, backend="openvino", device="npu")
    # a GPU cannot be emulated: only the CPU and the fallback are offered
    with pytest.raises(DeviceError) as err:
        place(ov_cpu, backend=None, device="gpu")
    assert "--emulate" not in (err.value.hint or "") and "--fallback cpu" in (err.value.hint or "")


def test_absent_npu_on_a_backend_edge_chose_that_is_not_installed() -> None:
    no_ov = _inventory(
        BackendStatus("llamacpp", True, "0", (BackendDevice("cpu", "cpu"),)),
        BackendStatus("openvino", False, "", (), reason="openvino is not installed"),
    )
    with pytest.raises(DeviceError) as err:
        place(no_ov, backend="openvino", device="npu", backend_named=False)
    assert not isinstance(err.value, BackendUnavailableError)
    assert "no npu is usable on this machine" in err.value.message and "--emulate" in (err.value.hint or "")
    p = place(no_ov, backend="openvino", device="npu", fallback=True, backend_named=False)
    assert (p.backend, p.device, p.fallback) == ("llamacpp", "cpu", "npu -> cpu")
    with pytest.raises(BackendUnavailableError, match="openvino"):  # asked for by name: say it is missing
        place(no_ov, backend="openvino", device="npu")


def test_fallback_is_announced() -> None:
    p = place(CPU_ONLY, backend=None, device="npu", fallback=True)
    assert (p.backend, p.device, p.fallback) == ("llamacpp", "cpu", "npu -> cpu")
    assert place(CPU_ONLY, backend=None, device="cpu").fallback is None


def test_auto_prefers_gpu_when_present() -> None:
    assert place(WITH_GPU, backend=None, device="auto").device == "gpu"
    assert place(CPU_ONLY, backend=None, device="auto").device == "cpu"


def test_unknown_device_and_backend() -> None:
    with pytest.raises(DeviceError, match="unknown device"):
        place(CPU_ONLY, backend=None, device="tpu")
    with pytest.raises(DeviceError, match="unknown backend"):
        place(CPU_ONLY, backend="tensorrt", device="cpu")


def test_unavailable_backend_says_why() -> None:
    inv = _inventory(BackendStatus("openvino", False, reason="not installed", hint="pip install openvino"))
    with pytest.raises(BackendUnavailableError, match=r"not installed.*pip install openvino"):
        place(inv, backend="openvino", device="cpu")


def test_real_discovery_runs_without_optional_sdks() -> None:
    inv = discover()
    assert inv.backend("llamacpp") is not None and inv.cpu.physical_cores >= 1
