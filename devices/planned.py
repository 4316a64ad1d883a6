"""Running a `Plan`: its partitions converted once (cached on disk, every file checked by SHA-256 on reuse)
and opened as one `PartitionedDecoder`, each partition on its own (backend, device), one ring-buffer KV.

The partitions are graph_opt's openvino-target graphs (MatMulNBits linears, standard opset-23 fusions), which
both ONNX Runtime and OpenVINO run, so any graph backend takes any partition; llama.cpp runs whole models only. An NPU-shaped plan gets fixed shapes (a prefill graph of `prefill_chunk` tokens and a one-token decode
graph over `capacity` KV slots); emulated, those exact graphs compile on OpenVINO's CPU device.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from edge.devices.auto import AUTO, Choice, choose_backend
from edge.devices.base import Decoder
from edge.devices.llamacpp import INSTALL_LLAMACPP
from edge.devices.memory import MemoryEstimate, check_fits
from edge.devices.partitioned import PartitionedDecoder, PartitionedOptions, open_artifact_decoder
from edge.devices.phase_split import PhaseHalf, open_phase_split, parse_phase_plan
from edge.devices.placement import Placement
from edge.devices.planner import (
    PREFERRED_BACKENDS,
    DeviceProfile,
    Plan,
    Target,
    model_profile,
    parse_device,
    plan,
)
from edge.devices.precision import check_f32_kv, kv_dtype_for
from edge.devices.registry import BACKENDS, DecoderOptions, estimate_memory
from edge.errors import (
    BackendUnavailableError,
    DeviceError,
    InsufficientMemoryError,
    ModelFormatError,
    NoUsableDeviceError,
    PlanError,
)
from edge.models.arch import ArchConfig
from edge.models.artifact import file_sha256
from edge.models.build_progress import BuildTask, cached_note
from edge.models.checked import CheckedModel, as_checked
from edge.models.store import cache_dir, file_identity

__all__ = [
    "DeviceRequest",
    "Opening",
    "PlannedOptions",
    "open_planned_decoder",
    "open_requested",
    "plan_artifact",
    "resolve_request",
]

PLAN_FORMAT = 3  # bump when what a plan artifact holds changes


@dataclass(frozen=True)
class PlannedOptions:
    n_ctx: int = 4096
    threads: int | None = None
    prefill_chunk: int = 64  # static (NPU) plans: the prefill graph's width
    static_capacity: int = 1024  # static plans: KV slots (the ring wraps beyond, keeping sinks)
    precision: str = "fast"  # every partition's: fast | exact
    available_memory: int | None = None  # bytes to assume free for the memory check; None measures it
    # sequences that will run at once (slots, each its own KV): auto prefers the backends that batch
    # (devices/auto.py), and a split by phase must hold that many KV caches beside both halves' weights
    parallel: int = 1
    kv_dtype: str = "auto"  # the KV cache's type: auto | f32 | f16 (devices/precision.kv_dtype_for)

    @property
    def batching(self) -> bool:
        return self.parallel > 1


def _ranges(plan: Plan) -> str:
    return ",".join(f"{p.layers.start}-{p.layers.stop - 1}" for p in plan.partitions)


def _verify(folder: Path) -> bool:
    """The DONE record lists every file's SHA-256; a partial, edited or truncated entry is rebuilt."""
    try:
        done = json.loads((folder / "DONE").read_text(encoding="utf-8"))
        files = done["sha256"]
        present = {p.name for p in folder.iterdir() if p.is_file() and p.name != "DONE"}
        if not isinstance(files, dict) or set(files) != present:
            return False
        return all(file_sha256(folder / name) == digest for name, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def plan_artifact(
    gguf_path: Path, plan: Plan, options: PlannedOptions, log: Callable[[str], None] | None = None
) -> Path:
    """The converted partitions of `plan` for the model at `gguf_path`, built on first use."""
    static = plan.static
    capacity = min(options.n_ctx, options.static_capacity)
    st = gguf_path.stat()
    key = json.dumps(
        [str(gguf_path.resolve()), st.st_size, st.st_mtime_ns, PLAN_FORMAT, _ranges(plan), static]
        + [options.precision]
        + ([options.prefill_chunk, capacity] if static else []),
    )
    out = cache_dir() / "plans" / hashlib.sha256(key.encode()).hexdigest()[:20]
    if out.is_dir() and _verify(out):
        return out
    if out.exists():
        shutil.rmtree(out, ignore_errors=True)  # partial or tampered: rebuilt below
    out.parent.mkdir(parents=True, exist_ok=True)
    kind = "NPU-shaped (static) " if static else ""
    # announced before convert's imports (onnx, graph_opt: seconds on 2 cores); its steps join this task
    with BuildTask(f"the {kind}partitions {_ranges(plan)} for {gguf_path.name}", cached_note(out.parent)):
        _convert_plan(gguf_path, plan, options, out, static, capacity, log)
    if not _verify(out):
        raise ModelFormatError(f"the converted partitions in {out} do not match their SHA-256 record")
    return out


def _convert_plan(
    gguf_path: Path,
    plan: Plan,
    options: PlannedOptions,
    out: Path,
    static: bool,
    capacity: int,
    log: Callable[[str], None] | None,
) -> None:
    from edge.models.convert import ConvertOptions, convert

    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        art = tmp / "art"
        opts = ConvertOptions(
            target="openvino",
            ranges=_ranges(plan),
            static=static,
            prefill_chunk=options.prefill_chunk,
            capacity=capacity,
            # plans are lowered once for every backend (target openvino; OpenVINO ignores the accuracy
            # levels): exact plans give ORT partitions fp32 activations, fast ones int8
            precision=options.precision,
        )
        convert(gguf_path, art, opts, log=log)
        digests = {p.name: file_sha256(p) for p in art.iterdir() if p.is_file()}
        # the format, source and precision: what `edge models`, `edge rm` and `edge cache --prune` read
        done = {
            "sha256": digests,
            "format": PLAN_FORMAT,
            "model": file_identity(gguf_path),
            "precision": options.precision,
        }
        (art / "DONE").write_text(json.dumps(done, sort_keys=True), encoding="utf-8")
        try:
            os.replace(art, out)
        except OSError:  # another process built it first
            if not _verify(out):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def open_planned_decoder(
    gguf_path: Path,
    plan: Plan,
    options: PlannedOptions | None = None,
    *,
    log: Callable[[str], None] | None = None,
) -> PartitionedDecoder:
    opts = options or PlannedOptions()
    for p in plan.partitions:
        if BACKENDS[p.device.backend].runner is None:
            raise DeviceError(
                f"{p.device.backend} runs whole models only; it cannot take one partition of a plan",
                hint="name a graph backend for each device, e.g. --device hetero:openvino:cpu,ort:cpu",
            )
    path = plan_artifact(gguf_path, plan, opts, log)
    # an emulated NPU is OpenVINO's CPU device running the NPU-shaped (static) graphs
    where = [(p.device.backend, "cpu" if p.device.emulated else p.device.device) for p in plan.partitions]
    popts = PartitionedOptions(capacity=opts.n_ctx, threads=opts.threads, precision=opts.precision)
    return open_artifact_decoder(path, where, options=popts)


@dataclass(frozen=True)
class DeviceRequest:
    """What the user asked for: `--backend`, `--device`, `--fallback [KIND]`, `--emulate`."""

    backend: str | None = None
    device: str = "cpu"
    fallback: str | None = None  # a device kind to use in place of an absent one; None refuses
    emulate: bool = False  # an NPU-shaped graph compiled on the CPU, when no NPU is asked to be real
    # `--plan prefill=B:D[:P],decode=B:D[:P]`: the model split by phase (devices/phase_split.py)
    phases: str | None = None


def _kv_per_token(cfg: ArchConfig) -> list[int]:
    return [2 * cfg.n_head_kv * cfg.head_dim * 4] * cfg.n_layer  # fp32 K and V (kvcache's dtype)


def _placement_of(plan: Plan) -> Placement:
    backends = "+".join(dict.fromkeys(p.device.backend for p in plan.partitions))
    kinds = "+".join(
        dict.fromkeys(
            "npu (emulated on cpu)" if p.device.emulated else p.device.kind for p in plan.partitions
        )
    )
    return Placement(backends, kinds, plan.fallback)


@dataclass(frozen=True)
class Opening:
    """Where a request runs, decided and sized but not opened yet (opening is the slow part: a graph build, a
    compile, llama.cpp reading the file), so the caller can check the rest of the file first."""

    placement: Placement
    plan: Plan | None
    # the decoder, and where it runs: auto's choice may still move to llama.cpp when the own graph builder
    # refuses the file while building (devices/planned._open_auto)
    open: Callable[[], tuple[Decoder, Placement]]


def _check_fits(
    backend: str,
    model: CheckedModel,
    n_ctx: int,
    options: PlannedOptions,
    device: str = "cpu",
    own_memory: int | None = None,
) -> None:
    """The backend sizes the model before anything is allocated (InsufficientMemoryError when it cannot fit).
    `own_memory`: the device's own (a discrete GPU's), where the system's free memory does not size it."""
    need = estimate_memory(backend, model, n_ctx, _decoder_options(options), device)
    available = options.available_memory if options.available_memory is not None else own_memory
    if need is not None:
        where = backend if own_memory is None else f"{backend}:{device}"
        check_fits(need, model.path.name, where, n_ctx, available)


def _fit_kv(
    backend: str,
    model: CheckedModel,
    n_ctx: int,
    options: PlannedOptions,
    device: str,
    own_memory: int | None = None,
) -> tuple[PlannedOptions, str | None]:
    """`_check_fits`, except where --kv-dtype auto's f32 ring does not fit and an f16 one does (at precision
    fast): the options with f16 then, and the note that says so. The user asked for a context, not a type."""
    try:
        _check_fits(backend, model, n_ctx, options, device, own_memory)
        return options, None
    except InsufficientMemoryError as exc:
        auto_f32 = (
            options.kv_dtype == "auto" and kv_dtype_for("auto", backend, device, options.precision) == "f32"
        )
        if not auto_f32 or options.precision != "fast":
            raise
        half = replace(options, kv_dtype="f16")
        try:
            _check_fits(backend, model, n_ctx, half, device, own_memory)
        except InsufficientMemoryError:
            raise exc from None
        need, free = exc.needed >> 20, exc.available >> 20
    return half, (
        f"the KV cache is kept in f16 (keys and values rounded to fp16): in f32 the model needs about {need} "
        f"MiB and {free} MiB is available (--kv-dtype f32 asks for f32 regardless)"
    )


def _decoder_options(options: PlannedOptions) -> DecoderOptions:
    return DecoderOptions(
        n_ctx=options.n_ctx,
        n_threads=options.threads,
        precision=options.precision,
        slots=options.batching,
        kv_dtype=options.kv_dtype,
    )


def resolve_request(
    model: CheckedModel | Path,
    request: DeviceRequest,
    options: PlannedOptions,
    *,
    log: Callable[[str], None] | None = None,
) -> Opening:
    """Decide where `model` (a GGUF or an `edge convert` artifact, checked: models/checked.py; a bare path is
    checked here) runs as `request` says, and check that it
    fits: one device keeps the whole model on one backend (with none named, or `auto`, the CPU runs the one
    that measures fastest for this model: devices/auto.py, and the placement says why); `--device auto`,
    `hetero:...` and an emulated NPU go through the planner."""

    model = as_checked(model)
    if request.phases is not None:
        return _open_phases(model, request, options)
    mode, targets = parse_device(request.device)
    if request.emulate and (mode != "single" or targets[0].kind != "npu"):
        raise DeviceError("--emulate applies to --device npu only", hint="use --device npu --emulate")
    dopts = _decoder_options(options)
    asked = None if request.backend in (None, AUTO) else request.backend  # auto: edge chooses
    npu = mode == "single" and targets[0].kind == "npu" and not request.emulate
    if npu and model.artifact is None and _has_npu(asked or targets[0].backend):
        # an NPU compiles static shapes only: the NPU-shaped plan, as --emulate runs it on the CPU (its speed
        # is not measured for one device: the NPU's probe graph is no plan's, and nothing is ranked)
        target = replace(targets[0], backend=asked or targets[0].backend)
        return _open_plan(
            model, request, options, mode, [target], _profiles(False, measure=False), dopts, log
        )
    if mode == "single" and not request.emulate:
        return _open_single(model, request, options, targets[0], asked, dopts)

    profiles = _profiles(request.emulate)
    if asked and mode == "auto":
        profiles = [p for p in profiles if p.backend == asked]
    if model.artifact is not None:
        if mode != "hetero":
            raise DeviceError(
                f"{model.path} is already partitioned; name a device per partition with --device hetero:A,B",
                hint="or run it on one device with --device cpu",
            )
        return _open_artifact_partitions(model, targets, profiles, options)
    return _open_plan(model, request, options, mode, targets, profiles, dopts, log)


def _open_phases(
    model: CheckedModel,
    request: DeviceRequest,
    options: PlannedOptions,
    *,
    auto: Choice | None = None,
    fallback: str | None = None,
) -> Opening:
    """A phase split: each half placed on its (backend, device) as a single device would be, the memory of both
    halves' weights checked at once, one ring KV between them. `auto`: --backend auto chose this split (its
    `plan` is `request.phases`); `fallback`: the device it replaced, when auto's CPU was a fallback."""
    from edge.devices.discovery import discover
    from edge.devices.placement import place

    assert request.phases is not None
    split = parse_phase_plan(request.phases, options.precision)
    if request.backend not in (None, AUTO) or request.device != "cpu":
        raise PlanError(
            "--plan names each phase's backend and device; it takes no --backend or --device",
            hint="drop --backend and --device: the plan names each half's",
        )
    if request.emulate and (split.prefill.device != "npu" or split.decode.device == "npu"):
        raise PlanError(
            "--emulate with --plan emulates an NPU prefill half only",
            hint="e.g. --plan prefill=openvino:npu,decode=ort:cpu --emulate",
        )
    if model.artifact is not None:
        raise PlanError(f"{model.path.name} is an edge convert artifact; a phase split runs a GGUF")
    allow = request.fallback is not None
    halves, fallbacks = [], []
    for phase, half in (("prefill", split.prefill), ("decode", split.decode)):
        if phase == "prefill" and request.emulate:  # the NPU-shaped graphs on the CPU: nothing to discover
            halves.append(half)
            continue
        where = place(discover((half.backend,)), backend=half.backend, device=half.device, fallback=allow)
        halves.append(replace(half, device=where.device))
        if where.fallback:
            fallbacks.append(f"{phase} {where.fallback}")
    split = replace(split, prefill=halves[0], decode=halves[1])
    # an NPU half's static graphs hold min(n_ctx, static_capacity) slots, and the split's ring with them
    ctx = min(options.n_ctx, options.static_capacity) if split.prefill.device == "npu" else options.n_ctx
    # one ring between the halves: the decode half's type, which reads it every step
    kv = kv_dtype_for(options.kv_dtype, split.decode.backend, split.decode.device, split.decode.precision)
    if split.prefill.device == "npu":  # its static graphs take f32 K/V: auto is f32 with one
        check_f32_kv(options.kv_dtype, "an NPU-shaped prefill half")
        kv = "f32"
    sized = replace(_decoder_options(options), kv_dtype=kv)
    estimates = [estimate_memory(h.backend, model, ctx, sized, h.device) for h in halves]
    if all(e is not None for e in estimates):
        a, b = estimates
        assert a is not None and b is not None
        # both halves hold their weights; the KV is the split's one ring (the halves' own stay unwritten), or
        # one per slot when it serves parallel sequences
        rings = a.kv_cache * max(1, options.parallel)
        need = MemoryEstimate(a.weights + b.weights, rings, a.scratch + b.scratch, kv)
        check_fits(need, model.path.name, split.backend, ctx, options.available_memory)
    said = "; ".join(f for f in (fallback, *fallbacks) if f) or None
    where = Placement(split.backend, split.device, said, auto=auto)

    def open_split() -> tuple[Decoder, Placement]:
        static = None
        if (
            split.prefill.device == "npu"
        ):  # an NPU takes static shapes: the prefill half is an NPU-shaped plan
            static = partial(_npu_half, model, split.prefill, options, request.emulate)
        dec = open_phase_split(
            model.gguf,
            split,
            capacity=options.n_ctx,
            threads=options.threads,
            static_prefill=static,
            slots=options.batching and static is None,  # slots refuse a static half (replicas then)
            kv_dtype=kv,
        )
        return dec, where

    return Opening(where, None, open_split)


def _has_npu(backend: str | None) -> bool:
    """Whether a graph backend (`backend`, or any) reports a runnable NPU here."""
    from edge.devices.discovery import discover

    names = (backend,) if backend else tuple(b for b in PREFERRED_BACKENDS["npu"] if BACKENDS[b].runner)
    if any(BACKENDS.get(b) is None or BACKENDS[b].runner is None for b in names):
        return False  # a backend without graph partitions: _open_single says so
    inv = discover(names)
    return any(d.kind == "npu" and d.runnable for b in inv.backends if b.available for d in b.devices)


def _profiles(emulate: bool, measure: bool = True) -> list[DeviceProfile]:
    """The devices the planner places partitions on; with `emulate`, the emulated NPU only, even where a real
    one exists. `measure=False`: cached speeds only (one device needs no ranking)."""
    from edge.devices.discovery import discover
    from edge.devices.probe import device_profiles

    profiles = device_profiles(discover(), measure=measure, emulate_npu=emulate)
    return [p for p in profiles if p.kind != "npu" or p.emulated] if emulate else profiles


def _npu_half(
    model: CheckedModel, half: PhaseHalf, options: PlannedOptions, emulate: bool
) -> PartitionedDecoder:
    """A phase split's prefill half on an NPU (or emulated: OpenVINO's CPU running the NPU-shaped graphs): the
    whole model as one static-shape partition, as `--device npu [--emulate]` plans it."""
    opts = replace(options, precision=half.precision, parallel=1)
    dopts = DecoderOptions(n_ctx=opts.n_ctx, n_threads=opts.threads, precision=opts.precision)
    request = DeviceRequest(backend=half.backend, device="npu", emulate=emulate)
    target = [Target("npu", half.backend)]
    dec, _ = _open_plan(model, request, opts, "single", target, _profiles(emulate), dopts, None).open()
    if not isinstance(dec, PartitionedDecoder) or not dec.static:
        dec.close()
        raise PlanError(f"the NPU half of the split planned as {dec.backend}:{dec.device}, not static shapes")
    return dec


def _open_single(
    model: CheckedModel,
    request: DeviceRequest,
    options: PlannedOptions,
    t: Target,
    asked: str | None,
    dopts: DecoderOptions,
) -> Opening:
    """The whole model on one device: the backend asked for, the artifact's own, or (auto, on the CPU) the
    one measured fastest for this file; an absent device falls back only if the request allows it."""
    from edge.devices.discovery import discover
    from edge.devices.placement import place
    from edge.devices.registry import open_decoder

    path, artifact = model.path, model.artifact is not None
    backend = asked or t.backend
    auto = backend is None and not artifact  # --backend auto on a GGUF: the fastest measured
    choice = _auto_choice(path, options) if auto and t.kind == "cpu" else None
    if choice is not None and choice.plan is not None:  # auto split it by phase: opened as --plan is
        opening = _open_auto_split(model, request, options, choice)
        if isinstance(opening, Opening):
            return opening
        choice = opening  # the split does not fit: the single backend it beat
    if backend is None and not artifact and t.kind == "gpu":
        gpu = _open_gpu(model, options, t, allow_fallback=request.fallback is not None)
        if gpu is not None:
            return gpu
        # no backend has a GPU and a fallback is allowed: on to the CPU below, said as a fallback
    if backend is None:
        if model.artifact is not None:
            backend = model.artifact.target
        else:
            backend = choice.backend if choice else PREFERRED_BACKENDS[t.kind][0]
    allow = request.fallback is not None
    named = asked is not None or t.backend is not None  # errors name only a chosen backend
    try:
        placement = place(
            discover((backend,)), backend=backend, device=t.device, fallback=allow, backend_named=named
        )
    except DeviceError:  # say it again with every backend's devices listed, not only this one's
        placement = place(discover(), backend=backend, device=t.device, fallback=allow, backend_named=named)
    if auto and placement.device == "cpu":  # asked for the CPU, or fallen back to it
        choice = choice or _auto_choice(path, options)
        if choice.plan is not None:
            opening = _open_auto_split(model, request, options, choice, placement.fallback)
            if isinstance(opening, Opening):
                return opening
            choice = opening
        placement = Placement(choice.backend, "cpu", placement.fallback, auto=choice)
    options, note = _fit_kv(
        placement.backend, model, options.n_ctx, options, placement.device, placement.memory_bytes
    )
    single = replace(placement, note=note, kv_dtype=options.kv_dtype)
    dopts = _decoder_options(options)
    if single.auto is not None:
        return Opening(single, None, lambda: _open_auto(model, single, dopts))
    return Opening(single, None, lambda: (open_decoder(single.backend, model, single.device, dopts), single))


def _open_gpu(
    model: CheckedModel, options: PlannedOptions, t: Target, *, allow_fallback: bool
) -> Opening | None:
    """`--device gpu[.N]` with no backend named: each backend that reports such a GPU, in PREFERRED_BACKENDS
    order, sized with the GPU's memory; the first that holds the model opens, and where its runtime refuses to
    compile there, the next. NoUsableDeviceError names each backend and why not; None where none reports the GPU
    and a fallback is allowed (the caller falls back to the CPU)."""
    from edge.devices.discovery import discover
    from edge.devices.placement import place
    from edge.devices.registry import open_decoder

    inv = discover()
    tried: list[tuple[str, str]] = []
    candidates: list[Placement] = []
    too_big = False  # a GPU was found and the model does not fit it: no fallback hides that
    for backend in PREFERRED_BACKENDS["gpu"]:
        try:
            where = place(inv, backend=backend, device=t.device)
        except DeviceError as exc:  # unavailable, or it reports no such GPU
            tried.append((backend, exc.message))
            continue
        try:
            opts, note = _fit_kv(backend, model, options.n_ctx, options, where.device, where.memory_bytes)
        except InsufficientMemoryError as exc:
            tried.append((backend, exc.message))
            too_big = True
            continue
        candidates.append(replace(where, note=note, kv_dtype=opts.kv_dtype))
    if not candidates:
        if allow_fallback and not too_big:
            return None
        raise _no_gpu(t, tried)

    def open_first() -> tuple[Decoder, Placement]:
        failed = list(tried)
        for where in candidates:
            opts = replace(options, kv_dtype=where.kv_dtype or options.kv_dtype)
            try:
                decoder = open_decoder(where.backend, model, where.device, _decoder_options(opts))
            except Exception as exc:  # a driver or GPU compiler that refuses: the next backend, said below
                failed.append((where.backend, f"{where.device} failed to open: {type(exc).__name__}: {exc}"))
                continue
            refused = [f"{b}:{why}" for b, why in failed[len(tried) :]]
            said = "; ".join(n for n in (*refused, where.note) if n) or None
            return decoder, replace(where, note=said)
        raise _no_gpu(t, failed)

    return Opening(candidates[0], None, open_first)


def _no_gpu(t: Target, tried: list[tuple[str, str]]) -> NoUsableDeviceError:
    listed = "; ".join(f"{backend}: {why}" for backend, why in tried)
    return NoUsableDeviceError(
        f"no backend runs {t.device} here (tried {listed})",
        attempts=tuple(tried),
        hint="use --device cpu, add --fallback cpu, or see `edge devices` for each backend's devices",
    )


def _open_auto_split(
    model: CheckedModel,
    request: DeviceRequest,
    options: PlannedOptions,
    choice: Choice,
    fallback: str | None = None,
) -> Opening | Choice:
    """--backend auto's split by phase (devices/auto_split.py), opened as `--plan choice.plan` would be; where
    its two halves' weights do not fit in memory, the choice of the single backend it beat instead (with a
    note: the user asked for no split, so one that does not fit must not stop the load)."""
    assert choice.plan is not None and choice.split is not None
    phases = DeviceRequest(fallback=request.fallback, phases=choice.plan)
    try:
        return _open_phases(model, phases, options, auto=choice, fallback=fallback)
    except InsufficientMemoryError as exc:
        single = choice.split.single
        note = f"the split by phase does not fit in memory ({exc.message}); running {single} alone"
        verdict = replace(choice.split, chosen=False, why=note)
        why = "fastest single backend measured on this machine; the split by phase that measured faster does not fit"
        notes = "; ".join(n for n in (choice.note, note) if n)
        return replace(choice, backend=single, why=why, note=notes, split=verdict)


def _open_artifact_partitions(
    model: CheckedModel, targets: list[Target], profiles: list[DeviceProfile], options: PlannedOptions
) -> Opening:
    """An `edge convert` artifact's partitions, one per device named in --device hetero:A,B."""
    path, art = model.path, model.artifact
    assert art is not None
    if len(targets) != len(art.partitions):
        raise DeviceError(
            f"{path.name} has {len(art.partitions)} partitions but --device names {len(targets)} devices",
            hint="convert with a matching --partitions, or name one device per partition",
        )
    where = []
    for t in targets:
        dev = next(
            (
                p
                for p in profiles
                if p.kind == t.kind and t.index in (None, p.index) and p.backend == (t.backend or art.target)
            ),
            None,
        )
        if dev is None or BACKENDS[dev.backend].runner is None:
            raise DeviceError(f"no graph backend runs {t} here", hint="use openvino:cpu or ort:cpu")
        where.append((dev.backend, dev.device))
    check_f32_kv(options.kv_dtype, f"{path.name} (an edge convert artifact)")
    popts = PartitionedOptions(capacity=options.n_ctx, threads=options.threads, precision=options.precision)
    backends = "+".join(dict.fromkeys(b for b, _ in where))
    kinds = "+".join(dict.fromkeys(k for _, k in where))
    parts = Placement(backends, kinds)
    return Opening(parts, None, lambda: (open_artifact_decoder(path, where, options=popts), parts))


def _open_plan(
    model: CheckedModel,
    request: DeviceRequest,
    options: PlannedOptions,
    mode: str,
    targets: list[Target],
    profiles: list[DeviceProfile],
    dopts: DecoderOptions,
    log: Callable[[str], None] | None,
) -> Opening:
    """A GGUF through the planner (--device auto, hetero:..., an emulated NPU): partitions by layers, sized by
    the devices' measured speeds and capped by their memory."""
    from edge.devices.registry import open_decoder

    gguf = model.gguf
    cfg = ArchConfig.from_gguf(gguf.metadata, set(gguf.tensors))
    npu = request.emulate or (mode == "single" and targets[0].kind == "npu")  # static graphs: a fixed KV
    ctx = min(options.n_ctx, options.static_capacity) if npu else options.n_ctx
    profile = model_profile(
        {n: t.nbytes for n, t in gguf.tensors.items()}, cfg.n_layer, _kv_per_token(cfg), ctx
    )
    if mode == "hetero":  # partitions run on graph backends; a bare kind means OpenVINO, then ONNX Runtime
        targets = [t if t.backend else Target(t.kind, _graph_backend(t.kind, profiles)) for t in targets]
    plan_ = plan(profile, profiles, mode, targets, fallback=request.fallback)
    first = plan_.partitions[0].device
    whole = len(plan_.partitions) == 1 and not plan_.static  # one whole-model graph: any KV type
    if not whole:  # partitions take f32 K/V (auto is f32 there)
        check_f32_kv(options.kv_dtype, f"the {'NPU-shaped' if plan_.static else 'partitioned'} plan")
    # one partition or several, they hold the whole model and one KV between them: their backend sizes it
    _check_fits(first.backend, model, ctx, options if whole else replace(options, kv_dtype="f32"), first.kind)
    where = _placement_of(plan_)
    if whole:
        return Opening(where, plan_, lambda: (open_decoder(first.backend, model, first.kind, dopts), where))
    return Opening(where, plan_, lambda: (open_planned_decoder(model.path, plan_, options, log=log), where))


def open_requested(
    model: CheckedModel | Path,
    request: DeviceRequest,
    options: PlannedOptions,
    *,
    log: Callable[[str], None] | None = None,
) -> tuple[Decoder, Placement, Plan | None]:
    """`resolve_request`, then open: the decoder, where it runs, and the plan when one was made."""
    opening = resolve_request(model, request, options, log=log)
    decoder, placement = opening.open()
    return decoder, placement, opening.plan


def _auto_choice(path: Path, options: PlannedOptions) -> Choice:
    return choose_backend(
        path, precision=options.precision, threads=options.threads, batching=options.batching
    )


def _open_auto(model: CheckedModel, placement: Placement, dopts: DecoderOptions) -> tuple[Decoder, Placement]:
    """Open auto's choice. A file the own graph builder refuses only while building (a block type it does not
    import, partial rotary embeddings) goes to llama.cpp, as one models/arch.py refuses does, with the note."""
    from edge.devices.registry import open_decoder

    try:
        return open_decoder(placement.backend, model, "cpu", dopts), placement
    except ModelFormatError as exc:
        if placement.backend == "llamacpp" or dopts.precision == "exact":
            raise
        try:
            decoder = open_decoder("llamacpp", model, "cpu", dopts)
        except BackendUnavailableError as refused:  # not installed, or failing its known-answer check here
            raise ModelFormatError(
                f"{exc.message}; only llama.cpp may run this file, and {refused.message}",
                hint=refused.hint or INSTALL_LLAMACPP,
            ) from None
        note = f"{exc.message}; llama.cpp runs it"
        choice = Choice("llamacpp", "refused", "edge's own graphs do not run this file", note=note)
        return decoder, Placement("llamacpp", "cpu", placement.fallback, auto=choice)


def _graph_backend(kind: str, profiles: list[DeviceProfile]) -> str:
    """The preferred backend for `kind` that runs partitions (edge's own graphs)."""
    graph = [b for b in PREFERRED_BACKENDS.get(kind, ()) if BACKENDS[b].runner is not None]
    for backend in graph:
        if any(p.backend == backend and p.kind == kind for p in profiles):
            return backend
    return graph[0] if graph else "openvino"  # absent: the planner reports it with what exists
