"""Turning `--backend` / `--device` into a concrete (backend, device), with fallback never silent."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge.devices.auto import Choice
from edge.devices.discovery import Inventory
from edge.devices.planner import absent_device_hint
from edge.devices.registry import BACKENDS, runnable_backends
from edge.errors import BackendUnavailableError, DeviceError

DEVICE_KINDS = ("cpu", "gpu", "npu")


@dataclass(frozen=True)
class Placement:
    backend: str
    device: str
    fallback: str | None = None  # "npu -> cpu" when the requested device was replaced
    auto: Choice | None = field(default=None, compare=False)  # --backend auto: what it chose and why
    # what the load chose for the user beyond the device (said once, as a fallback is): the KV cache in f16
    # where --kv-dtype auto's f32 would not fit (devices/planned._fit_kv)
    note: str | None = field(default=None, compare=False)
    # the --kv-dtype the decoder was opened with (the request, or auto's f16 where f32 would not fit), what a
    # device takeover asks for again; None: the load's request
    kv_dtype: str | None = field(default=None, compare=False)


def _usable(inventory: Inventory, backend: str) -> list[str]:
    status = inventory.backend(backend)
    if status is None or not status.available:
        return []
    return sorted({d.kind for d in status.devices})


def _everything(inventory: Inventory) -> str:
    found = [f"{b.name}:{k}" for b in inventory.backends for k in _usable(inventory, b.name)]
    return ", ".join(found) or "nothing"


def place(
    inventory: Inventory,
    *,
    backend: str | None,
    device: str,
    fallback: bool = False,
    backend_named: bool | None = None,
) -> Placement:
    """Pick where to run. An absent device is an error listing what exists, unless fallback is allowed.

    `backend_named`: whether the user chose the backend (default: `backend` is given); errors name a backend
    only when the user did."""
    named = backend is not None if backend_named is None else backend_named
    backend = backend or "llamacpp"
    if backend not in BACKENDS:
        raise DeviceError(f"unknown backend {backend!r}", hint=f"use one of: {', '.join(BACKENDS)}")
    status = inventory.backend(backend)
    if status is not None and not status.available and not named and device in DEVICE_KINDS:
        # the user asked for a device, not for this backend: its absence is the device's absence
        if fallback and "cpu" in _usable(inventory, "llamacpp"):
            return Placement("llamacpp", "cpu", fallback=f"{device} -> cpu")
        raise DeviceError(
            f"no {device} is usable on this machine (found: {_everything(inventory)})",
            hint=absent_device_hint(device),
        )
    if status is not None and not status.available:
        raise BackendUnavailableError(
            f"backend {backend!r} is unavailable: {status.reason}", hint=status.hint or None
        )
    if backend not in runnable_backends():
        raise BackendUnavailableError(
            f"backend {backend!r} is discovered but cannot run models in this version of edge",
            hint="use --backend llamacpp",
        )
    if device.startswith("hetero:"):
        raise DeviceError(
            "heterogeneous placement (partitions on several devices) is not in this version of edge",
            hint="use --device cpu with --backend llamacpp, ort or openvino",
        )
    kinds = _usable(inventory, backend)
    if device == "auto":
        best = next((k for k in ("gpu", "cpu") if k in kinds), None)
        if best is None:
            raise DeviceError(f"{backend} has no usable device (found: {_everything(inventory)})")
        return Placement(backend, best)
    if device not in DEVICE_KINDS:
        raise DeviceError(f"unknown device {device!r}", hint="use cpu, gpu, npu, auto or hetero:A,B")
    if device in kinds:
        return Placement(backend, device)
    if fallback and "cpu" in kinds:
        return Placement(backend, "cpu", fallback=f"{device} -> cpu")
    by = f" by {backend}" if named else ""
    raise DeviceError(
        f"no {device} is usable{by} on this machine (found: {_everything(inventory)})",
        hint=absent_device_hint(device),
    )
