"""Devices as the runtimes report them (`BackendDevice`: OpenVINO's `GPU.1`, ORT's execution providers, each
with what edge needs declared) and as edge names them.

A device as edge names it: a kind (`cpu`, `gpu`, `npu`) and, where the runtime numbers several of a kind, the
runtime's own number: OpenVINO's `GPU.0` / `GPU.1` (an iGPU beside a dGPU) are `gpu.0` / `gpu.1`.

The runtime's spelling is accepted as is (`GPU.1`): names are case-insensitive, and a backend goes before a
colon as everywhere else in `--device` (`openvino:gpu.1`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from edge.errors import DeviceError

__all__ = [
    "DEVICE_KINDS",
    "ORT_RUNNER_PROVIDERS",
    "BackendDevice",
    "DeviceName",
    "choose_device",
    "device_kind",
    "openvino_devices",
]

DEVICE_KINDS = ("cpu", "gpu", "npu")
# The providers edge's ORT runner opens (devices/runners.OrtRunner), by the device kind they run.
ORT_RUNNER_PROVIDERS: dict[str, str] = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "gpu",
    "DmlExecutionProvider": "gpu",
}


@dataclass(frozen=True)
class BackendDevice:
    name: str  # as the backend names it: "CPU", "GPU.0", "NPU", "cpu", "CUDAExecutionProvider"
    kind: str  # "cpu" | "gpu" | "npu"
    full_name: str = ""
    properties: dict[str, Any] = field(default_factory=dict)
    index: int | None = None  # the runtime's number among devices of its kind: OpenVINO's GPU.1 -> 1
    memory_bytes: int | None = None  # its own memory (a discrete GPU's); None: it shares the system's
    runnable: bool = True  # False: discovered and listed, but edge cannot run on it (`why_not` says why)
    why_not: str = ""


def _kind(name: str) -> str:
    upper = name.upper()
    return "npu" if "NPU" in upper else "gpu" if "GPU" in upper else "cpu"


def openvino_devices(core: Any) -> tuple[BackendDevice, ...]:
    """OpenVINO's devices as its `Core` lists them (`CPU`, `GPU.0`, `GPU.1`, `NPU`), each with its number and, for
    a discrete GPU, its own memory (`GPU_DEVICE_TOTAL_MEM_SIZE`; an integrated one shares the system's)."""
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
        _, _, number = name.partition(".")
        total = props.get("GPU_DEVICE_TOTAL_MEM_SIZE", "")
        own = props.get("DEVICE_TYPE") == "Type.DISCRETE" and total.isdigit()
        devices.append(
            BackendDevice(
                name,
                _kind(name),
                full,
                props,
                index=int(number) if number.isdigit() else None,
                memory_bytes=int(total) if own else None,
            )
        )
    return tuple(devices)


_NAME = re.compile(r"^(cpu|gpu|npu)(?:\.(\d+))?$")


@dataclass(frozen=True)
class DeviceName:
    kind: str  # cpu | gpu | npu
    index: int | None = None  # the runtime's number among devices of this kind; None: any one of them

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}.{self.index}"

    @classmethod
    def parse(cls, text: str) -> DeviceName:
        """`gpu`, `gpu.1`, `GPU.1` (OpenVINO's spelling); anything else is a DeviceError saying what exists."""
        m = _NAME.match(text.strip().lower())
        if m is None:
            raise DeviceError(
                f"unknown device {text!r}",
                hint="use cpu, gpu, npu, or a numbered one as the runtime lists it (gpu.0, gpu.1: `edge devices`)",
            )
        return cls(m.group(1), None if m.group(2) is None else int(m.group(2)))

    def matches(self, dev: BackendDevice) -> bool:
        return dev.kind == self.kind and (self.index is None or dev.index == self.index)


def device_kind(device: str) -> str:
    """The kind of a device name (`gpu.1` -> `gpu`); names that are no device (`auto`, `hetero:...`) unchanged."""
    m = _NAME.match(device.strip().lower())
    return m.group(1) if m else device


def choose_device(devices: Sequence[BackendDevice], name: DeviceName) -> BackendDevice | None:
    """The runnable device `name` asks for. Where it names no number and several match, a discrete GPU (its own
    memory: the faster one on an iGPU + dGPU laptop) before the lowest-numbered; None when none matches."""
    found = [d for d in devices if d.runnable and name.matches(d)]
    if not found:
        return None
    return min(found, key=lambda d: (d.memory_bytes is None, -1 if d.index is None else d.index))
