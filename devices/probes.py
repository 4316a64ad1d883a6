"""Each backend's probe: its version and usable devices, or why it is unavailable and how to fix that. Every
backend SDK is imported inside its own probe, so a missing one is reported, never fatal."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BackendDevice", "BackendStatus", "probe_coreml", "probe_llamacpp", "probe_openvino", "probe_ort"]


@dataclass(frozen=True)
class BackendDevice:
    name: str  # as the backend names it: "CPU", "GPU.0", "NPU", "cpu", "CUDAExecutionProvider"
    kind: str  # "cpu" | "gpu" | "npu"
    full_name: str = ""
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendStatus:
    name: str  # "llamacpp" | "openvino" | "ort" | "coreml"
    available: bool
    version: str = ""
    devices: tuple[BackendDevice, ...] = ()
    reason: str = ""  # why it is unavailable
    hint: str = ""  # how to make it available
    note: str = ""  # how it runs here when not as built (llama.cpp: the configuration its check chose)


def _kind(name: str) -> str:
    upper = name.upper()
    return "npu" if "NPU" in upper else "gpu" if "GPU" in upper else "cpu"


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
    core = ov.Core()
    devices = []
    for name in core.available_devices:
        props: dict[str, Any] = {}
        for prop in ("OPTIMIZATION_CAPABILITIES", "DEVICE_TYPE", "GPU_DEVICE_TOTAL_MEM_SIZE"):
            try:
                value = core.get_property(name, prop)
                props[prop] = [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value)
            except Exception:  # not every device exposes every property
                continue
        try:
            full = str(core.get_property(name, "FULL_DEVICE_NAME"))
        except Exception:
            full = name
        devices.append(BackendDevice(name, _kind(name), full, props))
    return BackendStatus("openvino", True, ov.get_version(), tuple(devices))


def probe_ort() -> BackendStatus:
    try:
        import onnxruntime as ort
    except Exception as exc:
        return BackendStatus(
            "ort", False, reason=f"onnxruntime does not import: {exc}", hint="pip install onnxruntime"
        )
    # Execution providers that are local devices; others (e.g. Azure: a remote endpoint) are not listed.
    kinds = {
        "CPUExecutionProvider": "cpu",
        "CUDAExecutionProvider": "gpu",
        "TensorrtExecutionProvider": "gpu",
        "ROCMExecutionProvider": "gpu",
        "MIGraphXExecutionProvider": "gpu",
        "DmlExecutionProvider": "gpu",
        "CoreMLExecutionProvider": "gpu",
        "OpenVINOExecutionProvider": "cpu",
        "VitisAIExecutionProvider": "npu",
        "QNNExecutionProvider": "npu",
    }
    devices = tuple(BackendDevice(p, kinds[p], p) for p in ort.get_available_providers() if p in kinds)
    return BackendStatus("ort", True, ort.__version__, devices)


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
