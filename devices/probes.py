"""Each backend's probe: its version and usable devices, or why it is unavailable and how to fix that. Every
backend SDK is imported inside its own probe, so a missing one is reported, never fatal."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from edge.devices.runtime_devices import ORT_RUNNER_PROVIDERS, BackendDevice, openvino_devices

__all__ = [
    "ORT_EP_LIBRARIES_ENV",
    "ORT_RUNNER_PROVIDERS",
    "BackendDevice",
    "BackendStatus",
    "openvino_devices",
    "probe_coreml",
    "probe_llamacpp",
    "probe_openvino",
    "probe_ort",
]


@dataclass(frozen=True)
class BackendStatus:
    name: str  # "llamacpp" | "openvino" | "ort" | "coreml"
    available: bool
    version: str = ""
    devices: tuple[BackendDevice, ...] = ()
    reason: str = ""  # why it is unavailable
    hint: str = ""  # how to make it available
    note: str = ""  # how it runs here when not as built (llama.cpp: the configuration its check chose)


def probe_llamacpp() -> BackendStatus:
    try:
        import llama_cpp
    except Exception as exc:
        return BackendStatus(
            "llamacpp",
            False,
            reason=f"llama_cpp does not import: {exc}",
            hint='pip install "edge-llm[llamacpp]"',  # an extra: it builds llama.cpp from source
        )
    from edge.devices.native_check import REFUSED_HINT, llamacpp_verdict

    # its known-answer check (a child process, cached per build and CPU): a build that crashes or miscomputes
    # here runs in the configuration that passed, or is unavailable
    verdict = llamacpp_verdict()
    if verdict.config is None:
        return BackendStatus(
            "llamacpp", False, llama_cpp.__version__, reason=f"llama.cpp {verdict.note()}", hint=REFUSED_HINT
        )
    devices = [BackendDevice("cpu", "cpu", "llama.cpp CPU")]
    if llama_cpp.llama_supports_gpu_offload():
        devices.append(BackendDevice("gpu", "gpu", "llama.cpp layer offload"))
    return BackendStatus("llamacpp", True, llama_cpp.__version__, tuple(devices), note=verdict.describe())


def probe_openvino() -> BackendStatus:
    try:
        import openvino as ov
    except Exception as exc:
        return BackendStatus(
            "openvino", False, reason=f"openvino does not import: {exc}", hint="pip install openvino"
        )
    return BackendStatus("openvino", True, ov.get_version(), openvino_devices(ov.Core()))


# Local providers ORT may report that the runner does not open: their kind and why not. Others (e.g. Azure: a
# remote endpoint) are not devices and are not listed.
ORT_LISTED_PROVIDERS: dict[str, tuple[str, str]] = {
    "TensorrtExecutionProvider": (
        "gpu",
        "TensorRT builds an engine per input shape; CUDA runs edge's graphs",
    ),
    "ROCMExecutionProvider": ("gpu", "not wired in edge's ORT runner"),
    "MIGraphXExecutionProvider": ("gpu", "not wired in edge's ORT runner"),
    "CoreMLExecutionProvider": ("gpu", "Core ML runs through --backend coreml's own export"),
    "OpenVINOExecutionProvider": ("cpu", "OpenVINO runs edge's graphs directly: use --backend openvino"),
    "QNNExecutionProvider": ("npu", "QNN takes QDQ int8 graphs; edge's graphs are MatMulNBits"),
    "VitisAIExecutionProvider": ("npu", "Vitis AI takes QDQ int8 graphs; edge's graphs are MatMulNBits"),
}
# Plugin execution-provider libraries (ORT >= 1.22) to register before discovery: NAME=PATH entries separated
# by os.pathsep, e.g. "webgpu=/opt/ort/libonnxruntime_providers_webgpu.so"
ORT_EP_LIBRARIES_ENV = "EDGE_ORT_EP_LIBRARIES"
ORT_EP_DEVICES_SINCE = (1, 22)  # get_ep_devices and register_execution_provider_library
_REGISTERED: dict[str, str] = {}  # registration name -> library path, once per process (ORT refuses twice)


def _ort_libraries() -> list[tuple[str, str]]:
    """The plugin libraries EDGE_ORT_EP_LIBRARIES names; a malformed entry is an error saying the form."""
    from edge.errors import DeviceError

    out = []
    for entry in filter(None, os.environ.get(ORT_EP_LIBRARIES_ENV, "").split(os.pathsep)):
        name, eq, path = entry.partition("=")
        if not eq or not name.strip() or not path.strip():
            raise DeviceError(
                f"{ORT_EP_LIBRARIES_ENV} entry {entry!r} is not NAME=PATH",
                hint=f"e.g. {ORT_EP_LIBRARIES_ENV}=webgpu=/path/to/libonnxruntime_providers_webgpu.so",
            )
        out.append((name.strip(), path.strip()))
    return out


def _register_plugins(ort: Any) -> list[str]:
    """Register the plugin EP libraries named in EDGE_ORT_EP_LIBRARIES; what failed, said per library."""
    failed = []
    for name, path in _ort_libraries():
        if _REGISTERED.get(name) == path:
            continue
        if not _has_ep_devices(ort):
            failed.append(f"{name}: onnxruntime {ort.__version__} has no plugin EPs (1.22 or later has)")
            continue
        try:
            ort.register_execution_provider_library(name, path)
        except Exception as exc:
            failed.append(f"{name} ({path}): {exc}")
            continue
        _REGISTERED[name] = path
    return failed


def _has_ep_devices(ort: Any) -> bool:
    """Whether this ORT reports EP devices and takes plugin EP libraries (by its version, as ORT declares)."""
    numbers = [int(part) for part in ort.__version__.split(".")[:2] if part.isdigit()]
    return tuple(numbers) >= ORT_EP_DEVICES_SINCE


def _ort_own_memory(metadata: dict[str, Any]) -> int | None:
    """A discrete GPU's own memory as ORT's device discovery reports it (Windows: DXGI's dedicated video memory,
    "DxgiVideoMemory": "8192 MB", with "Discrete": "1"); None where it is not reported or the GPU is integrated
    (its dedicated memory is a small carve-out: it runs in the system's)."""
    size = str(metadata.get("DxgiVideoMemory", "")).removesuffix(" MB")
    return int(size) << 20 if str(metadata.get("Discrete", "")) == "1" and size.isdigit() else None


def _ep_device(ep: Any, builtin: set[str]) -> BackendDevice | None:
    """One of ORT's `OrtEpDevice`s (an execution provider on one hardware device) as edge lists it."""
    provider = str(ep.ep_name)
    hw = ep.device
    kind = str(getattr(hw.type, "name", hw.type)).rsplit(".", 1)[-1].lower()  # OrtHardwareDeviceType.GPU
    if kind not in ("cpu", "gpu", "npu"):
        return None
    full = f"{ep.ep_vendor} {provider} on {hw.vendor} {kind.upper()} (device id {hw.device_id})"
    props = {"ep_vendor": str(ep.ep_vendor), "vendor": str(hw.vendor), "device_id": int(hw.device_id)}
    props |= {f"metadata.{k}": str(v) for k, v in dict(hw.metadata).items()}
    if provider not in builtin:  # not one of this ORT build's own providers: a plugin library brought it
        why = "a plugin EP: edge's ORT runner opens the CPU, CUDA and DirectML providers only"
        return BackendDevice(provider, kind, full, props | {"plugin": True}, runnable=False, why_not=why)
    if provider in ORT_RUNNER_PROVIDERS:
        return BackendDevice(provider, kind, full, props, memory_bytes=_ort_own_memory(dict(hw.metadata)))
    why = ORT_LISTED_PROVIDERS.get(provider, (kind, "not wired in edge's ORT runner"))[1]
    return BackendDevice(provider, kind, full, props, runnable=False, why_not=why)


def ort_devices(ort: Any) -> tuple[BackendDevice, ...]:
    """ORT's execution providers as it reports them: its EP devices (`get_ep_devices`, ORT >= 1.22: built-in and
    plugin providers, each on the hardware it found), else its available providers by name."""
    if _has_ep_devices(ort):
        builtin = set(ort.get_all_providers())
        devices = (_ep_device(ep, builtin) for ep in ort.get_ep_devices())
        return tuple(d for d in devices if d is not None)
    out = []
    for p in ort.get_available_providers():
        if p in ORT_RUNNER_PROVIDERS:
            out.append(BackendDevice(p, ORT_RUNNER_PROVIDERS[p], p))
        elif p in ORT_LISTED_PROVIDERS:
            kind, why = ORT_LISTED_PROVIDERS[p]
            out.append(BackendDevice(p, kind, p, runnable=False, why_not=why))
    return tuple(out)


def probe_ort() -> BackendStatus:
    try:
        import onnxruntime as ort
    except Exception as exc:
        return BackendStatus(
            "ort", False, reason=f"onnxruntime does not import: {exc}", hint="pip install onnxruntime"
        )
    failed = _register_plugins(ort)
    note = "; ".join(f"plugin EP not registered: {f}" for f in failed)
    return BackendStatus("ort", True, ort.__version__, ort_devices(ort), note=note)


def probe_coreml() -> BackendStatus:
    if sys.platform != "darwin":
        return BackendStatus("coreml", False, reason="Core ML runs only on macOS")
    try:
        import coremltools as ct
    except Exception as exc:
        return BackendStatus(
            "coreml", False, reason=f"coremltools does not import: {exc}", hint="pip install coremltools"
        )
    devices = (
        BackendDevice("cpu", "cpu"),
        BackendDevice("gpu", "gpu"),
        BackendDevice("ane", "npu", "Neural Engine"),
    )
    return BackendStatus("coreml", True, ct.__version__, devices)
