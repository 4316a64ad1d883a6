"""A short measured micro-benchmark per (backend, device), cached on disk, that feeds the planner.

Decode reads every weight once per token, so what ranks devices for it is how fast each streams weights
through a matrix-vector product: one fp32 MatMul [1, K] x [K, N] (64 MiB of weights, more than the caches
hold), compiled by the backend itself on the device, timed over repeated runs (the best). llama.cpp has no graph
API to time a single op on, so its CPU figure is numpy's matvec on the same memory (labelled as such), and its
GPU offload is left unmeasured (0 GB/s, `measured=False`): numpy would time the CPU.

Results are cached per (backend, device, backend version, CPU model) in `cache_dir()/devices/probe.json`;
`edge devices --probe` measures again.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edge.devices.discovery import Inventory
from edge.devices.planner import DeviceProfile
from edge.devices.registry import runnable_backends
from edge.models.store import cache_dir

__all__ = ["device_profiles", "measure_bandwidth"]

_K = _N = 4096  # 64 MiB: beyond the last-level cache, so this is memory bandwidth
_RUNS = 10
PROBE_VERSION = 3  # part of the cache key: bump when the probe changes


def _matvec_onnx() -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((_K, _N), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matvec",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, _K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, _N])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


def _time(run: Callable[[], object]) -> float:
    run()  # warm-up: first-run allocations and lazy compilation
    times = []
    for _ in range(_RUNS):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return min(times)  # the best run: other work on the machine only ever slows a run down


def _ort(device: str) -> float:
    import onnxruntime as ort

    provider = device if device.endswith("ExecutionProvider") else "CPUExecutionProvider"
    sess = ort.InferenceSession(_matvec_onnx(), providers=[provider])
    x = np.ones((1, _K), np.float32)
    return _time(lambda: sess.run(None, {"x": x}))


def _openvino(device: str) -> float:
    import openvino as ov

    core = ov.Core()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matvec.onnx"
        path.write_bytes(_matvec_onnx())
        compiled = core.compile_model(core.read_model(str(path)), device, {"INFERENCE_PRECISION_HINT": "f32"})
    request = compiled.create_infer_request()
    x = np.ones((1, _K), np.float32)
    return _time(lambda: request.infer({0: x}))


def _numpy(_device: str) -> float:
    w = np.random.default_rng(0).standard_normal((_K, _N), dtype=np.float32)
    x = np.ones((1, _K), np.float32)
    return _time(lambda: x @ w)


_MEASURE: dict[str, Callable[[str], float]] = {"ort": _ort, "openvino": _openvino, "llamacpp": _numpy}


def _measurable(backend: str, kind: str) -> bool:
    """Whether the probe runs where the device does: numpy's matvec stands for llama.cpp's CPU only, so its GPU
    offload is left unmeasured rather than given the CPU's figure."""
    return backend != "llamacpp" or kind == "cpu"


def measure_bandwidth(backend: str, device: str) -> float:
    """GB/s of weights streamed by one matvec on (backend, device name)."""
    seconds = _MEASURE[backend](device)
    return _K * _N * 4 / max(seconds, 1e-9) / 1e9


def _cache_file() -> Path:
    return cache_dir() / "devices" / "probe.json"


def _load_cache() -> dict[str, float]:
    try:
        data = json.loads(_cache_file().read_text(encoding="utf-8"))
        return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError, TypeError):
        return {}  # a missing or corrupt cache is measured again


def _save_cache(data: dict[str, float]) -> None:
    path = _cache_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".probe.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _memory(inventory: Inventory, props: dict[str, object]) -> int:
    system = inventory.memory_available_mb << 20
    for key in ("GPU_DEVICE_TOTAL_MEM_SIZE", "NPU_DEVICE_TOTAL_MEM_SIZE"):
        value = props.get(key)
        if isinstance(value, str) and value.isdigit():
            total = int(value)
            # integrated devices report the shared system memory: what is free is what they get
            return min(total, system) if props.get("DEVICE_TYPE") == "Type.INTEGRATED" else total
    return system


def device_profiles(
    inventory: Inventory, *, measure: bool = True, refresh: bool = False, emulate_npu: bool = False
) -> list[DeviceProfile]:
    """Every runnable (backend, device) of the inventory with its memory and measured bandwidth.
    `measure=False` uses cached figures only (unmeasured devices get 0 GB/s and `measured=False`).
    `emulate_npu` adds an NPU-shaped device (static shapes) that OpenVINO compiles on the CPU."""
    cache = {} if refresh else _load_cache()
    changed = False
    out: list[DeviceProfile] = []
    runnable = runnable_backends()
    for status in inventory.backends:
        if not status.available or status.name not in runnable:
            continue
        for dev in status.devices:
            if not dev.runnable:  # listed by `edge devices` with why not; never planned on
                continue
            key = f"{PROBE_VERSION}|{status.name}|{dev.name}|{status.version}|{inventory.cpu.model}"
            gbs = cache.get(key)
            if gbs is None and measure and _measurable(status.name, dev.kind):
                try:
                    gbs = measure_bandwidth(status.name, dev.name)
                except Exception:  # a device that cannot run the probe is not offered to the planner
                    continue
                cache[key], changed = gbs, True
            out.append(
                DeviceProfile(
                    backend=status.name,
                    kind=dev.kind,
                    name=dev.name,
                    memory_bytes=_memory(inventory, dict(dev.properties)),
                    bandwidth_gbs=gbs or 0.0,
                    dynamic_shapes=dev.kind != "npu",
                    measured=gbs is not None,
                    index=dev.index,
                )
            )
    if emulate_npu and not any(d.kind == "npu" for d in out):
        cpu = next((d for d in out if d.backend == "openvino" and d.kind == "cpu"), None)
        if cpu is not None:
            out.append(
                DeviceProfile(
                    "openvino",
                    "npu",
                    cpu.name,
                    cpu.memory_bytes,
                    cpu.bandwidth_gbs,
                    False,
                    cpu.measured,
                    True,
                )
            )
    if changed:
        _save_cache(cache)
    return out
