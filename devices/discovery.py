"""What this machine can run on right now: the CPU's ISA, memory, and each backend's usable devices (the probes
live in devices/probes.py, one per backend; the CPU's in devices/cpu.py).
"""

from __future__ import annotations

import platform
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from edge.devices.cpu import ISA_FLAGS, CpuInfo, probe_cpu
from edge.devices.probes import (
    BackendDevice,
    BackendStatus,
    probe_coreml,
    probe_llamacpp,
    probe_openvino,
    probe_ort,
)

__all__ = [
    "ISA_FLAGS",
    "BackendDevice",
    "BackendStatus",
    "CpuInfo",
    "Inventory",
    "discover",
    "probe_coreml",
    "probe_cpu",
    "probe_llamacpp",
    "probe_openvino",
    "probe_ort",
]


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
