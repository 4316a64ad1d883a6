"""Turning `--backend` / `--device` into a concrete (backend, device), with fallback never silent."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge.devices.auto import Choice
from edge.devices.discovery import BackendDevice, Inventory
from edge.devices.planner import absent_device_hint
from edge.devices.registry import BACKENDS, runnable_backends
from edge.devices.runtime_devices import DEVICE_KINDS, DeviceName, choose_device, device_kind
from edge.errors import BackendUnavailableError, DeviceError


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
    # the memory the device has for the model where it is not the system's (a discrete GPU's own); None: the
    # system's free memory sizes it
    memory_bytes: int | None = field(default=None, compare=False)


def _runnable(inventory: Inventory, backend: str) -> list[BackendDevice]:
    status = inventory.backend(backend)
    if status is None or not status.available:
        return []
    return [d for d in status.devices if d.runnable]


def _usable(inventory: Inventory, backend: str) -> list[str]:
    return sorted({d.kind for d in _runnable(inventory, backend)})


def _spelled(dev: BackendDevice) -> str:
    """edge's name of a runtime's device: `gpu.1` for OpenVINO's GPU.1, the kind where it is not numbered."""
    return str(DeviceName(dev.kind, dev.index))


def _everything(inventory: Inventory) -> str:
    found = [
        f"{b.name}:{name}"
        for b in inventory.backends
        for name in dict.fromkeys(_spelled(d) for d in _runnable(inventory, b.name))
    ]
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
    if status is not None and not status.available and not named and device_kind(device) in DEVICE_KINDS:
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
        return _placed(backend, inventory, DeviceName(best))
    name = DeviceName.parse(device)  # gpu.1: the runtime's second GPU
    if choose_device(_runnable(inventory, backend), name) is not None:
        return _placed(backend, inventory, name)
    if fallback and "cpu" in kinds:
        return Placement(backend, "cpu", fallback=f"{device} -> cpu")
    by = f" by {backend}" if named else ""
    raise DeviceError(
        f"no {device} is usable{by} on this machine (found: {_everything(inventory)})",
        hint=absent_device_hint(device),
    )


def _placed(backend: str, inventory: Inventory, name: DeviceName) -> Placement:
    """On the device `name` picks (devices/runtime_devices.choose_device), named as exactly as the runtime numbers
    it, so the runner compiles for that one (GPU.1, never GPU where two exist), sized by its own memory."""
    dev = choose_device(_runnable(inventory, backend), name)
    assert dev is not None
    return Placement(backend, _spelled(dev), memory_bytes=dev.memory_bytes)
