"""What this machine can run on right now: the CPU's ISA, memory, and each backend's usable devices.

Every backend SDK is imported inside its own probe, so a missing one is reported, never fatal.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    arch: str
    physical_cores: int
    logical_cores: int
    isa: dict[str, bool]


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


@dataclass(frozen=True)
class Inventory:
    os: str
    cpu: CpuInfo
    memory_total_mb: int
    memory_available_mb: int
    backends: tuple[BackendStatus, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def backend(self, name: str) -> BackendStatus | None:
        return next((b for b in self.backends if b.name == name), None)


def _linux_cpu() -> tuple[str, set[str]]:
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model, flags


def _mac_cpu() -> tuple[str, set[str]]:
    def sysctl(name: str) -> str:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, check=False)
        return out.stdout.strip()

    flags = {f.lower().replace(".", "_") for f in sysctl("machdep.cpu.features").split()}
    flags |= {f.lower() for f in sysctl("machdep.cpu.leaf7_features").split()}
    return sysctl("machdep.cpu.brand_string"), flags


def probe_cpu() -> CpuInfo:
    model, flags = _mac_cpu() if sys.platform == "darwin" else _linux_cpu()
    isa = {
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "avx512_vnni": "avx512_vnni" in flags or "avx512vnni" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "amx": any(f.startswith("amx") for f in flags),
    }
    return CpuInfo(
        model=model or platform.processor() or "unknown",
        arch=platform.machine(),
        physical_cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        logical_cores=psutil.cpu_count(logical=True) or os.cpu_count() or 1,
        isa=isa,
    )


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


def discover(backends: tuple[str, ...] | None = None) -> Inventory:
    """This machine and the named backends (default: every registered one)."""
    # NOTE: imported here: the registry imports the probes above, one entry per backend
    from edge.devices.registry import BACKENDS

    statuses = []
    for name in tuple(BACKENDS) if backends is None else backends:
        entry = BACKENDS.get(name)
        if entry is None:  # unknown names are the caller's to report (placement lists the known ones)
            continue
        try:
            statuses.append(entry.probe())
        except Exception as exc:  # a broken SDK install must not take discovery down
            statuses.append(BackendStatus(name, False, reason=f"probe failed: {type(exc).__name__}: {exc}"))
    mem = psutil.virtual_memory()
    return Inventory(
        os=f"{platform.system()} {platform.release()}",
        cpu=probe_cpu(),
        memory_total_mb=mem.total // 2**20,
        memory_available_mb=mem.available // 2**20,
        backends=tuple(statuses),
    )
