"""This machine's CPU: its model, cores and the ISA extensions the backends' kernels use (a leaf: everything that
keys a cache or a choice on the CPU reads it here)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import dataclass

import psutil

__all__ = ["ISA_FLAGS", "CpuInfo", "probe_cpu"]

ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    arch: str
    physical_cores: int
    logical_cores: int
    isa: dict[str, bool]


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
