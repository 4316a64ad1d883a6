"""Compile an ONNX partition on a backend and run it on numpy buffers without copying the KV cache.

A runner takes feeds (numpy arrays, bound by pointer) and returns the requested outputs as numpy arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from edge.devices.mapped import drop_mapped_pages, dropping_mapped_pages, mapped_sources, release_heap
from edge.devices.precision import BF16
from edge.devices.runtime_devices import ORT_RUNNER_PROVIDERS, DeviceName, choose_device, openvino_devices
from edge.errors import BackendUnavailableError, DeviceError
from edge.models.onnx_safety import check_onnx_file

OV_DQ_GROUP = 32  # OpenVINO's default: one int8 scale per 32 activations
# OpenVINO's CPU plugin repacks the weights on the first runs of each kernel kind (a prompt's chunks, then a
# one-row step), not in compile_model; the source pages are dropped during this many (a margin: on
# qwen2.5-coder-1.5b only norms and other small constants, ~8 MB, are read again later, in place, and fault
# back in). Repacking at load instead (a warm-up forward) cost more than it saved: first-prompt-*-2026-12-01.md
OV_REPACK_RUNS = 3
# OpenVINO's NPU plugin on an LLM's static graphs: NPUW (the plugin's partitioning layer) with the baseline its
# NPUW_LLM pipeline gives each of its own static sub-models (prefill, one-token generate): repeated blocks folded
# into one compiled function, int4/int8 weights decompressed to f16 with their scales on the NPU, the norms
# in higher precision, and one weights bank shared by the prefill and decode graphs of a model. NOTE: NPUW_LLM=YES
# itself is not set: it reshapes a dynamic Hugging Face-named graph to static shapes, and edge's NPU graphs are
# static already (a prefill chunk and a one-token step over a fixed KV, devices/planned.py).
NPU_CONFIG: Mapping[str, str] = {
    "NPU_USE_NPUW": "YES",
    "NPUW_DEVICES": "NPU",
    "NPUW_FOLD": "YES",
    "NPUW_DCOFF_TYPE": "f16",
    "NPUW_DCOFF_SCALE": "YES",
    "NPUW_FUNCALL_ASYNC": "YES",
    "NPUW_WEIGHTS_BANK": "shared",
    "NPU_COMPILATION_MODE_PARAMS": "compute-layers-with-higher-precision=Sqrt,Power,ReduceMean,Add_RMSNorm",
}


@dataclass(frozen=True)
class RunnerOptions:
    device: str = "cpu"  # edge's device name: cpu | gpu | npu, or numbered as the runtime numbers it (gpu.1)
    threads: int | None = None
    precision: str = "exact"  # exact: fp32 math; fast: int8 activations where the runtime has them
    cache_dir: Path | None = None  # compiled artifacts (OpenVINO blobs, ORT optimized model)
    spin: bool = True  # ORT: intra-op threads spin between runs (lowest latency for one session alone)
    # ORT: custom-op libraries the graph's ops need (devices/kquant's MatMulKQuant), registered before it opens
    custom_ops: tuple[Path, ...] = ()


class Runner(Protocol):
    backend: str
    device: str
    # the runtime prepares its kernels on the first run of each kind (many rows, one row) rather than when it
    # compiles: a model a user will talk to runs both once ahead of time (edge.model.Model.warm_up)
    prepares_on_first_run: bool

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]: ...

    def close(self) -> None: ...


def _closed(backend: str, device: str) -> DeviceError:
    return DeviceError(
        f"the {backend} session on {device} is closed (the device went away or the model was closed)",
        hint="load the model again",
    )


def _blob_names(folder: Path | None) -> set[str]:
    return set() if folder is None or not folder.is_dir() else {f.name for f in folder.glob("*.blob")}


def _threads(opts: RunnerOptions) -> int:
    import psutil

    return opts.threads or psutil.cpu_count(logical=False) or 1


# the most bytes of outputs a run may have for its output buffers to be kept for the next run (OrtRunner.run)
KEEP_OUTPUTS_BYTES = 4 << 20


class OrtRunner:
    backend = "ort"
    prepares_on_first_run = False  # MatMulNBits prepacks its weights when the session is created

    def __init__(self, model_path: Path, opts: RunnerOptions) -> None:
        try:
            import onnxruntime as ort
        except Exception as exc:
            raise BackendUnavailableError(
                f"onnxruntime does not import: {exc}", hint="pip install onnxruntime"
            ) from None
        wanted = ort_providers(ort, opts.device)
        check_onnx_file(model_path)  # external data inside the graph's folder, before ORT opens it
        so = ort.SessionOptions()
        so.intra_op_num_threads = _threads(opts)
        so.inter_op_num_threads = 1
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        for library in opts.custom_ops:
            so.register_custom_ops_library(str(library))
        if not opts.spin:
            # measured with a 0.5b draft taking turns with a 1.5b target: a 4-token verify 85 -> 59 ms
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = (
            3  # errors only: ORT's warnings (e.g. on saving the optimized graph) are noise
        )
        if opts.cache_dir is not None:
            # the optimized graph is kept beside the source; a second start loads it without re-optimizing
            so.optimized_model_filepath = str(opts.cache_dir / "ort_optimized.onnx")
        self._ort = ort
        self.session = ort.InferenceSession(str(model_path), so, providers=wanted)
        self.device = opts.device
        self._binding = self.session.io_binding()
        # the array each input is bound to (the binding holds it too, so it stays alive while bound)
        self._bound: dict[str, np.ndarray] = {}
        # the outputs kept bound for the inputs' current shapes (None: bind them afresh next run)
        self._kept_outputs: tuple[str, ...] | None = None
        self._keep_outputs = True  # False once ORT refused kept output buffers (OrtRunner.run)
        # NOTE: a kept binding reads the array's memory at run time only on the CPU provider; another one
        # (CUDA, DirectML) copies an input to its device when it is bound, so there every input is rebound
        self._keep_bindings = self.session.get_providers()[0] == "CPUExecutionProvider"

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
        b = self._binding
        if b is None:
            raise _closed(self.backend, self.device)
        if self._bound.keys() != feeds.keys():  # never a stale binding for an input not fed this time
            b.clear_binding_inputs()
            self._bound = {}
        for name, arr in feeds.items():
            # by pointer: the ring-buffer KV is not copied. An input fed the same array object as last run is
            # left bound (a decode step's past KV and staging views: RingDecoder and RingKVCache.gather hand
            # out the same views until the bound prefix or the window moves): ORT reads its memory at run
            # time, so what the ring wrote since is seen. ORT copies a non-contiguous array when binding it,
            # so those are bound every run. Skipping the ~120 binds of smollm2's step saves ~0.4 ms of ~8.
            old = self._bound.get(name)
            if old is not arr or not arr.flags.c_contiguous or not self._keep_bindings:
                if old is None or old.shape != arr.shape:
                    self._kept_outputs = None  # kept outputs are shaped for the inputs they were bound with
                b.bind_cpu_input(name, arr)
                self._bound[name] = arr
        # Outputs stay bound while the wanted outputs and every input's name and shape are the same as last run
        # (the output shapes follow from them in edge's graphs) and they are small (a decode step's): ORT then
        # writes into the buffers it allocated for the last run instead of 61 rebinds per smollm2 step (Python
        # around the run 0.72 -> 0.29 ms per decode step, benchmarks/results/ort-runner-overhead-2026-12-02.md).
        # Results from kept buffers are copies, so a caller's arrays are never overwritten by a later run; large
        # outputs (a prompt's logits) are handed out as ORT allocated them and bound afresh next run.
        wanted = tuple(outputs)
        if self._keep_outputs and wanted == self._kept_outputs:
            try:
                self.session.run_with_iobinding(b)
                return b.copy_outputs_to_cpu()  # type: ignore[no-any-return]
            except RuntimeError:
                # ORT refuses kept buffers whose shapes this run does not produce (a graph whose output shapes
                # hang on input values): this runner stops keeping them, and the run is redone with fresh ones
                # below (a real failure fails again there, with its own message)
                self._keep_outputs = False
        b.clear_binding_outputs()
        self._kept_outputs = None
        for name in outputs:
            b.bind_output(name, "cpu")
        self.session.run_with_iobinding(b)
        out = [v.numpy() for v in b.get_outputs()]
        if self._keep_outputs and sum(a.nbytes for a in out) <= KEEP_OUTPUTS_BYTES:
            self._kept_outputs = wanted
            return [a.copy() for a in out]
        return out

    def close(self) -> None:
        self._binding = None  # type: ignore[assignment]
        self._bound = {}
        self._kept_outputs = None
        self.session = None  # type: ignore[assignment]


class OpenVinoRunner:
    backend = "openvino"
    # NOTE: the CPU plugin repacks a FullyConnected's weights on its first execution per kernel kind (the
    # many-row and the one-row path), not in compile_model: gemma3-270m's first 512-token prompt after load ran
    # 1.55 s against 1.06 s warm, the 1.5b's 16.5 s against 11.3 s (benchmarks/results/first-prompt-*)
    prepares_on_first_run = True

    def __init__(self, model_path: Path, opts: RunnerOptions) -> None:
        try:
            import openvino as ov
        except Exception as exc:
            raise BackendUnavailableError(
                f"openvino does not import: {exc}", hint="pip install openvino"
            ) from None
        core = ov.Core()
        target = openvino_target(core, opts.device)
        config: dict[str, object] = {"PERFORMANCE_HINT": "LATENCY"}
        if target == "NPU":
            config.update(NPU_CONFIG)
        else:
            config["NUM_STREAMS"] = 1
        if target == "CPU":
            config["INFERENCE_NUM_THREADS"] = _threads(opts)
        bf16 = opts.precision == BF16
        if target == "CPU":
            # NOTE: the CPU plugin defaults to bf16 on AVX512-BF16 / AMX CPUs, and bf16 activations turn its
            # dynamic int8 quantization of activations off. f32 + a DQ group is its int8 path (u4/u8 weights
            # with integer zero points, weight groups divisible by the DQ group); group 0 is fp32-exact.
            # bf16 (a phase split's prefill half) asks for the matrix engine on purpose, DQ off.
            _check_bf16(core, bf16)
            config["INFERENCE_PRECISION_HINT"] = "bf16" if bf16 else "f32"
            config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = OV_DQ_GROUP if opts.precision == "fast" else 0
        elif bf16:
            raise DeviceError(
                f"precision bf16 is OpenVINO's CPU hint; {target} keeps its own", hint="use fast or exact"
            )
        # bf16 blobs beside the f32 ones: the mapped-pages bookkeeping (_compile) reads a folder as one model's
        blobs = None if opts.cache_dir is None else opts.cache_dir / ("openvino-bf16" if bf16 else "openvino")
        if blobs is not None:
            config["CACHE_DIR"] = str(blobs)
        self._ov = ov
        # external data inside the graph's folder, before OpenVINO opens it
        data = check_onnx_file(model_path)
        # NOTE: OpenVINO maps its source weights (the cached blob, or the ONNX external data on a first
        # compile) and they stay mapped after it has converted or repacked them; their pages are dropped while
        # it does (compile, the first inferences), or the peak RSS holds the source and the copy at once
        self._mapped = mapped_sources(data, [] if blobs is None else [blobs])
        self._repack_runs = OV_REPACK_RUNS
        self.compiled = self._compile(core, model_path, target, config, blobs)
        self.request = self.compiled.create_infer_request()
        self.device = opts.device

    def _compile(
        self, core: Any, model_path: Path, target: str, config: dict[str, object], blobs: Path | None
    ) -> Any:
        cached = _blob_names(blobs)
        # a compile from the ONNX graph unmaps its external data while the drops run (mapped.py: they reclaim
        # then); an import from the blob maps the blob for the model's life
        with dropping_mapped_pages(self._mapped, unmapping=not cached):
            compiled = core.compile_model(str(model_path), target, config)
        if blobs is not None and _blob_names(blobs) - cached:
            # compiled from the ONNX graph, the model holds its converted weights on the heap (0.95 GB more on
            # qwen2.5-coder-1.5b); imported from the blob it has just written, it maps them, as later loads do
            del compiled
            release_heap()
            compiled = core.compile_model(str(model_path), target, config)
            drop_mapped_pages(self._mapped)
        return compiled

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> list[np.ndarray]:
        ov, req = self._ov, self.request
        if req is None:
            raise _closed(self.backend, self.device)
        for name, arr in feeds.items():
            req.set_tensor(name, ov.Tensor(arr, shared_memory=True))
        if self._repack_runs > 0:
            self._repack_runs -= 1
            with dropping_mapped_pages(self._mapped):
                req.infer()
        else:
            req.infer()
        return [np.array(req.get_tensor(name).data, copy=True) for name in outputs]

    def close(self) -> None:
        self.request = None  # type: ignore[assignment]
        self.compiled = None  # type: ignore[assignment]


def ort_providers(ort: Any, device: str) -> list[str]:
    """The providers an ORT session for edge's `device` is given, in ORT's order of preference: those of
    ORT_RUNNER_PROVIDERS for its kind that this ORT build has (CUDA before DirectML on a GPU)."""
    name = DeviceName.parse(device)
    have = ort.get_available_providers()
    if name.index is not None:
        raise DeviceError(
            f"ONNX Runtime's runner opens a provider's first {name.kind}, not {name}",
            hint=f"use --device {name.kind} on ort, or --backend openvino for its numbered devices",
        )
    wanted = [p for p, kind in ORT_RUNNER_PROVIDERS.items() if kind == name.kind and p in have]
    if not wanted:
        raise DeviceError(
            f"onnxruntime has no provider edge runs on {name} here (providers: {', '.join(have)})",
            hint="use --device cpu, or see `edge devices` for why each provider is not run",
        )
    return wanted


def openvino_target(core: Any, device: str) -> str:
    """The exact name OpenVINO lists for edge's `device`: gpu.1 -> GPU.1; gpu -> its one GPU (GPU or GPU.0), or
    where it lists several, the one devices/runtime_devices.choose_device picks (never the bare GPU alias)."""
    name = DeviceName.parse(device)
    listed = [str(n) for n in core.available_devices]
    of_kind = [n for n in listed if n.partition(".")[0].lower() == name.kind] if name.index is None else []
    if str(name).upper() in listed or len(of_kind) == 1:
        # NOTE: by name where that is unambiguous: asking a device's properties loads its plugin (a GPU's takes
        # a while), which a CPU runner on a machine with a GPU must not pay
        return str(name).upper() if str(name).upper() in listed else of_kind[0]
    found = openvino_devices(core)
    dev = choose_device(found, name)
    if dev is None:
        have = ", ".join(d.name for d in found) or "none"
        raise DeviceError(
            f"OpenVINO has no {str(name).upper()} device here (devices: {have})",
            hint="use --device cpu, or a device `edge devices` lists",
        )
    return dev.name


def _check_bf16(core: Any, bf16: bool) -> None:
    """bf16 only where the CPU has a bf16 path (else OpenVINO would quietly run f32)."""
    if not bf16:
        return
    caps = [str(c) for c in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")]
    if "BF16" not in caps:
        raise DeviceError(
            f"this CPU has no bf16 path (OpenVINO's CPU capabilities: {', '.join(caps)})",
            hint="run the prefill half at fast or exact",
        )


# the runners of edge's own graphs, by backend (the registry's rows name them; partitions open them by name)
GRAPH_RUNNERS: dict[str, Callable[[Path, RunnerOptions], Runner]] = {
    "ort": OrtRunner,
    "openvino": OpenVinoRunner,
}


def graph_runner(backend: str) -> Callable[[Path, RunnerOptions], Runner]:
    """The runner that compiles and runs edge's own graphs on `backend`."""
    runner = GRAPH_RUNNERS.get(backend)
    if runner is None:
        raise DeviceError(
            f"no graph runner for backend {backend!r}", hint=f"use one of {sorted(GRAPH_RUNNERS)}"
        )
    return runner
