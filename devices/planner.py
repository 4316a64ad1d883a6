"""The planner: `--device cpu|gpu|npu|auto|hetero:A,B` -> which layers run where, and why.

Decoding a token reads every weight once, so a layer's cost on a device is its bytes over the device's measured
bandwidth (devices/probe.py); prefill is compute-bound but follows the same order between devices of one machine.
A plan must also fit: each partition's weights plus the KV of its layers must fit its device's memory.

- one device (cpu, gpu, npu): the whole model there, or a clear error listing what exists (`fallback` replaces
  an absent device by the CPU and says so);
- `auto`: the fastest device that holds the whole model; if none does, layers spread over the devices in
  order of speed, each filled up to its memory;
- `hetero:A,B,...`: every listed device gets layers, in the listed order (hidden states flow A -> B), in
  proportion to its measured speed, capped by its memory; the last partition carries the output head.

Unit tests drive this with described devices (an NPU with 4 GB and static shapes only, an iGPU sharing system
memory), so no hardware is needed to check a plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from edge.devices.runtime_devices import DeviceName
from edge.errors import DeviceError

__all__ = [
    "DeviceProfile",
    "ModelProfile",
    "Plan",
    "PlannedPartition",
    "Target",
    "model_profile",
    "parse_device",
    "plan",
]

# With no backend named, a device kind runs on the first of these that has it (`--device gpu` on a whole model:
# each of them that reports a GPU, in this order, until one opens: devices/planned._open_gpu).
PREFERRED_BACKENDS: Mapping[str, tuple[str, ...]] = {
    "cpu": ("llamacpp", "openvino", "ort"),
    "gpu": ("openvino", "llamacpp", "ort"),
    "npu": ("openvino", "ort"),
}
_MB = 1 << 20


@dataclass(frozen=True)
class Target:
    """One item of `--device`: a device kind, optionally numbered as the runtime numbers it (`gpu.1`: OpenVINO's
    GPU.1), optionally on a named backend (`openvino:npu`)."""

    kind: str
    backend: str | None = None
    index: int | None = None

    @property
    def device(self) -> str:
        return str(DeviceName(self.kind, self.index))

    def __str__(self) -> str:
        return f"{self.backend}:{self.device}" if self.backend else self.device


@dataclass(frozen=True)
class DeviceProfile:
    """A (backend, device) the planner may use. `bandwidth_gbs` is measured (devices/probe.py) or described."""

    backend: str
    kind: str
    name: str
    memory_bytes: int  # what it can hold for this model (an iGPU: its share of system memory)
    bandwidth_gbs: float
    dynamic_shapes: bool = True  # NPUs compile fixed shapes only
    measured: bool = False
    emulated: bool = False  # an NPU-shaped graph compiled on the CPU (labelled as emulation everywhere)
    index: int | None = None  # the runtime's number among devices of its kind (OpenVINO's GPU.1 -> 1)

    @property
    def device(self) -> str:
        """edge's name of it: `gpu.1`, or the kind where the runtime does not number it."""
        return str(DeviceName(self.kind, self.index))

    @property
    def label(self) -> str:
        return f"{self.backend}:{self.device}" + (" (NPU emulated on the CPU)" if self.emulated else "")


@dataclass(frozen=True)
class ModelProfile:
    n_layer: int
    layer_bytes: tuple[int, ...]  # weights per decoder layer
    head_bytes: int  # final norm + output projection
    embed_bytes: int  # token embeddings: looked up on the host, not on a device
    kv_bytes_per_token: tuple[int, ...]  # per layer (K and V, the cache's dtype)
    n_ctx: int

    def weights(self, layers: range, head: bool) -> int:
        return sum(self.layer_bytes[i] for i in layers) + (self.head_bytes if head else 0)

    def kv(self, layers: range) -> int:
        return sum(self.kv_bytes_per_token[i] for i in layers) * self.n_ctx


@dataclass(frozen=True)
class PlannedPartition:
    layers: range
    head: bool
    device: DeviceProfile
    weight_bytes: int
    kv_bytes: int
    est_ms_per_token: float  # decode: weight bytes / bandwidth

    @property
    def static(self) -> bool:
        return not self.device.dynamic_shapes

    def describe(self) -> str:
        span = f"layers {self.layers.start}-{self.layers.stop - 1}" + (" + head" if self.head else "")
        speed = (
            f"~{self.est_ms_per_token:.1f} ms/token at {self.device.bandwidth_gbs:.1f} GB/s"
            f"{' measured' if self.device.measured else ' (described)'}"
            if self.device.bandwidth_gbs > 0
            else "speed not measured"
        )
        return (
            f"{span} on {self.device.label}: weights {self.weight_bytes / _MB:.0f} MB, KV {self.kv_bytes / _MB:.0f} MB"
            f"{', static shapes' if self.static else ''}, {speed}"
        )


@dataclass(frozen=True)
class Plan:
    partitions: tuple[PlannedPartition, ...]
    fallback: str | None = None  # "npu -> cpu" when the requested device was replaced
    reasons: tuple[str, ...] = field(default=())

    @property
    def est_ms_per_token(self) -> float:
        return sum(p.est_ms_per_token for p in self.partitions)

    @property
    def static(self) -> bool:
        return any(p.static for p in self.partitions)

    def explain(self) -> str:
        lines = [f"plan: {len(self.partitions)} partition(s), ~{self.est_ms_per_token:.1f} ms/token decode"]
        lines += [f"  {i}: {p.describe()}" for i, p in enumerate(self.partitions)]
        if self.fallback:
            lines.append(f"  fallback: {self.fallback}")
        lines += [f"  why: {r}" for r in self.reasons]
        return "\n".join(lines)


def parse_device(spec: str) -> tuple[str, list[Target]]:
    """`cpu` -> ("single", [cpu]); `auto` -> ("auto", []); `hetero:openvino:cpu,ort:cpu` -> ("hetero", [...])."""
    spec = spec.strip().lower()
    if spec == "auto":
        return "auto", []
    mode, _, rest = spec.partition(":") if spec.startswith("hetero:") else ("single", "", spec)
    items = [s.strip() for s in rest.split(",")] if rest else []
    if mode == "hetero" and len(items) < 2:
        raise DeviceError(
            f"--device {spec!r} names {len(items)} device(s); hetero needs two or more",
            hint="e.g. --device hetero:openvino:cpu,ort:cpu",
        )
    targets = []
    for item in items:
        backend, _, device = item.rpartition(":")
        if mode == "single" and len(items) != 1:
            raise DeviceError(
                f"unknown device {item!r} in --device {spec!r}",
                hint="use cpu, gpu, npu, auto, or hetero:[backend:]device,... (e.g. hetero:openvino:cpu,ort:cpu)",
            )
        try:
            name = DeviceName.parse(device)
        except DeviceError as exc:
            raise DeviceError(f"unknown device {item!r} in --device {spec!r}", hint=exc.hint) from None
        targets.append(Target(name.kind, backend or None, name.index))
    if not targets:
        raise DeviceError("--device is empty", hint="use cpu, gpu, npu, auto or hetero:A,B")
    return mode, targets


def model_profile(
    tensor_bytes: Mapping[str, int], n_layer: int, kv_per_token: Sequence[int], n_ctx: int
) -> ModelProfile:
    """Bytes per layer from GGUF tensor names (`blk.N.*`), the head (`output*`, or the tied embedding)."""
    layers = [0] * n_layer
    head = embed = 0
    for name, nbytes in tensor_bytes.items():
        if name.startswith("blk."):
            idx = name.split(".")[1]
            if idx.isdigit() and int(idx) < n_layer:
                layers[int(idx)] += nbytes
        elif name.startswith("output"):
            head += nbytes
        elif name.startswith("token_embd"):
            embed += nbytes
    if "output.weight" not in tensor_bytes:
        head += embed  # tied embeddings: the head reads the embedding matrix as its projection
    return ModelProfile(n_layer, tuple(layers), head, embed, tuple(kv_per_token), n_ctx)


def _fits(model: ModelProfile, layers: range, head: bool, dev: DeviceProfile) -> bool:
    return model.weights(layers, head) + model.kv(layers) <= dev.memory_bytes


def _partition(model: ModelProfile, layers: range, head: bool, dev: DeviceProfile) -> PlannedPartition:
    w = model.weights(layers, head)
    # an unmeasured device (one NPU alone needs no ranking: devices/planned.py) has no estimate
    ms = w / (dev.bandwidth_gbs * 1e9) * 1e3 if dev.bandwidth_gbs > 0 else 0.0
    return PlannedPartition(layers, head, dev, w, model.kv(layers), ms)


def _resolve(target: Target, devices: Sequence[DeviceProfile]) -> DeviceProfile | None:
    order = (target.backend,) if target.backend else PREFERRED_BACKENDS[target.kind]
    for backend in order:
        for dev in devices:
            if dev.backend == backend and dev.kind == target.kind and target.index in (None, dev.index):
                return dev
    return None


def absent_device_hint(device: str) -> str:
    """The ways out when `device` is absent: an NPU can be emulated on the CPU; any device can fall back."""
    fallback = "add --fallback cpu to run on the CPU instead (announced)"
    if device == "npu":
        return f"run the NPU-shaped graphs on the CPU with --device npu --emulate, or {fallback}"
    return f"use --device cpu, or {fallback}"


def _absent(target: Target, devices: Sequence[DeviceProfile]) -> DeviceError:
    found = ", ".join(d.label for d in devices) or "nothing"
    return DeviceError(
        f"no {target} on this machine (found: {found})",
        hint=absent_device_hint(target.kind),
    )


def _split(model: ModelProfile, devs: Sequence[DeviceProfile], shares: Sequence[float] | None) -> list[range]:
    """Contiguous layer ranges, one per device in order: each device's part of the weights in proportion to
    `shares` (None: filled up to its memory), never beyond its memory; every device gets at least one layer."""
    n = model.n_layer
    if len(devs) > n:
        raise DeviceError(f"{len(devs)} devices but the model has only {n} layers", hint="name fewer devices")
    left = float(sum(model.layer_bytes) + model.head_bytes)
    bounds, start = [], 0
    for i, dev in enumerate(devs):
        if i == len(devs) - 1:
            bounds.append(range(start, n))
            break
        budget = float("inf") if shares is None else left * shares[i] / sum(shares[i:])
        stop, used = start, 0
        while stop < n - (len(devs) - i - 1):  # later devices need a layer each
            nxt = used + model.layer_bytes[stop]
            if (nxt > budget and stop > start) or not _fits(model, range(start, stop + 1), False, dev):
                break
            used, stop = nxt, stop + 1
        # rounding: take the layer that straddles the budget when that lands nearer to it
        if shares is not None and stop < n - (len(devs) - i - 1) and stop > start:
            extra = model.layer_bytes[stop]
            if used + extra - budget < budget - used and _fits(model, range(start, stop + 1), False, dev):
                used, stop = used + extra, stop + 1
        if stop == start:
            raise DeviceError(
                f"not even one layer of the model fits {dev.label} ({dev.memory_bytes / _MB:.0f} MB)",
                hint="use a smaller model or other devices",
            )
        left -= used
        bounds.append(range(start, stop))
        start = stop
    return bounds


def plan(
    model: ModelProfile,
    devices: Sequence[DeviceProfile],
    mode: str,
    targets: Sequence[Target],
    *,
    fallback: str | None = None,
) -> Plan:
    """Assign the model's layers to devices (see the module docstring). `fallback`: a device kind to use in
    place of an absent one ("cpu"), or None to refuse."""
    reasons: list[str] = []
    whole = range(model.n_layer)
    if mode == "auto":
        fit = [d for d in devices if _fits(model, whole, True, d)]
        if fit:
            # the probe ranks devices; on one device the backend is the preferred one that has it (the
            # matvec probe measures the memory, not how well each backend runs a whole model)
            kind = max(fit, key=lambda d: d.bandwidth_gbs).kind
            best = _resolve(Target(kind), fit) or max(fit, key=lambda d: d.bandwidth_gbs)
            reasons.append(
                f"auto: {kind} is the fastest device that holds the whole model "
                f"({', '.join(f'{d.label} {d.bandwidth_gbs:.1f} GB/s' for d in devices)}); "
                f"{best.backend} is the preferred backend there"
            )
            return Plan((_partition(model, whole, True, best),), None, tuple(reasons))
        ranked = sorted(devices, key=lambda d: -d.bandwidth_gbs)
        reasons.append("auto: no single device holds the model; layers fill the fastest devices first")
        return Plan(_hetero(model, ranked, by_memory=True), None, tuple(reasons))
    chosen: list[DeviceProfile] = []
    note = None
    for target in targets:
        dev = _resolve(target, devices)
        if dev is None:
            if fallback is None:
                raise _absent(target, devices)
            dev = _resolve(Target(fallback, target.backend), devices) or _resolve(Target(fallback), devices)
            if dev is None:
                raise _absent(Target(fallback), devices)
            note = f"{target} -> {dev.label}"
            reasons.append(f"{target} is absent; fallback to {dev.label} as asked")
        chosen.append(dev)
    if mode == "single":
        dev = chosen[0]
        if not _fits(model, whole, True, dev):
            need = model.weights(whole, True) + model.kv(whole)
            raise DeviceError(
                f"the model needs about {need / _MB:.0f} MB (weights and KV for {model.n_ctx} tokens) but "
                f"{dev.label} holds {dev.memory_bytes / _MB:.0f} MB",
                hint="lower --ctx-size, use --device auto, or a hetero plan over several devices",
            )
        return Plan((_partition(model, whole, True, dev),), note, tuple(reasons))
    reasons.append("hetero: layers in proportion to each device's measured speed, capped by its memory")
    return Plan(_hetero(model, chosen, by_memory=False), note, tuple(reasons))


def _shares(devs: Sequence[DeviceProfile]) -> list[float]:
    """Speed shares in tenths of the fastest: a probe's small noise must not move layers (and force a new
    conversion) from one run to the next."""
    top = max(d.bandwidth_gbs for d in devs) or 1.0
    return [max(0.1, round(d.bandwidth_gbs / top * 10) / 10) for d in devs]


def _hetero(
    model: ModelProfile, devs: Sequence[DeviceProfile], *, by_memory: bool
) -> tuple[PlannedPartition, ...]:
    """One partition per device, in order: sized by speed share (or filled to memory), the head on the last."""
    ranges = _split(model, devs, None if by_memory else _shares(devs))
    parts = tuple(
        _partition(model, r, i == len(devs) - 1, d) for i, (r, d) in enumerate(zip(ranges, devs, strict=True))
    )
    for p in parts:
        if not _fits(model, p.layers, p.head, p.device):
            raise DeviceError(
                f"{p.describe()} does not fit its {p.device.memory_bytes / _MB:.0f} MB",
                hint="lower --ctx-size or add a device",
            )
    return parts
