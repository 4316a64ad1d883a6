"""Devices as the runtimes report them, with no GPU or NPU here: each runtime's answers are injected in the
shapes it gives them (OpenVINO's `Core.available_devices` and `get_property`, ONNX Runtime's providers and
`OrtEpDevice`s), and edge is followed up to what it would hand the runtime (the device name and config given to
`compile_model`, the providers given to `InferenceSession`)."""

from __future__ import annotations

import enum
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import edge.devices.discovery as discovery
import edge.devices.probes as probes
from edge.devices.discovery import BackendDevice, BackendStatus, CpuInfo, Inventory
from edge.devices.placement import place
from edge.devices.planned import DeviceRequest, PlannedOptions, resolve_request
from edge.devices.planner import Target, parse_device
from edge.devices.probes import ORT_EP_LIBRARIES_ENV, probe_openvino, probe_ort
from edge.devices.runners import NPU_CONFIG, OpenVinoRunner, OrtRunner, RunnerOptions
from edge.errors import DeviceError, InsufficientMemoryError, NoUsableDeviceError
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")

GIB = 1 << 30


# -- OpenVINO, as its Core answers ------------------------------------------------------------------------------
class Type(enum.Enum):  # openvino.properties.device.Type: str() gives "Type.DISCRETE"
    INTEGRATED = 0
    DISCRETE = 1


LAPTOP: dict[str, dict[str, object]] = {  # an iGPU + dGPU laptop with an NPU
    "CPU": {"FULL_DEVICE_NAME": "Intel(R) Core(TM) Ultra 7 155H", "DEVICE_TYPE": Type.INTEGRATED},
    "GPU.0": {
        "FULL_DEVICE_NAME": "Intel(R) Arc(TM) Graphics (iGPU)",
        "DEVICE_TYPE": Type.INTEGRATED,
        "GPU_DEVICE_TOTAL_MEM_SIZE": 16 * GIB,
        "OPTIMIZATION_CAPABILITIES": ["FP32", "FP16", "INT8"],
    },
    "GPU.1": {
        "FULL_DEVICE_NAME": "NVIDIA GeForce RTX 4060 Laptop GPU (dGPU)",
        "DEVICE_TYPE": Type.DISCRETE,
        "GPU_DEVICE_TOTAL_MEM_SIZE": 8 * GIB,
    },
    "NPU": {"FULL_DEVICE_NAME": "Intel(R) AI Boost", "DEVICE_TYPE": Type.INTEGRATED},
}


class FakeCompiled:
    def create_infer_request(self) -> object:
        return object()


class FakeCore:
    def __init__(self, devices: Mapping[str, Mapping[str, object]]) -> None:
        self.devices = devices
        self.compiled: list[tuple[str, str, dict[str, object]]] = []

    @property
    def available_devices(self) -> list[str]:
        return list(self.devices)

    def get_property(self, device: str, name: str) -> object:
        if name not in self.devices[device]:
            raise RuntimeError(f"Unsupported property {name} by {device} plugin")
        return self.devices[device][name]

    def compile_model(self, model: str, device: str, config: Mapping[str, object]) -> FakeCompiled:
        self.compiled.append((model, device, dict(config)))
        return FakeCompiled()


@pytest.fixture
def core(monkeypatch: pytest.MonkeyPatch) -> FakeCore:
    """`import openvino` gives a module whose Core is this laptop's."""
    fake = FakeCore(LAPTOP)
    module = types.ModuleType("openvino")
    module.Core = lambda: fake  # type: ignore[attr-defined]
    module.get_version = lambda: "2026.0.0-injected"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "openvino", module)
    return fake


def _graph(path: Path) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)
    return path


def test_openvino_numbered_gpus_are_two_devices_each_with_its_memory(core: FakeCore) -> None:
    status = probe_openvino()
    devs = {d.name: d for d in status.devices}
    assert list(devs) == ["CPU", "GPU.0", "GPU.1", "NPU"]
    assert [devs[n].kind for n in devs] == ["cpu", "gpu", "gpu", "npu"]
    assert (devs["GPU.0"].index, devs["GPU.1"].index, devs["CPU"].index) == (0, 1, None)
    # the dGPU is sized with its own memory; the iGPU shares the system's (None)
    assert devs["GPU.1"].memory_bytes == 8 * GIB and devs["GPU.0"].memory_bytes is None
    assert devs["GPU.1"].full_name.startswith("NVIDIA")


def _inventory(*backends: BackendStatus) -> Inventory:
    cpu = CpuInfo("test cpu", "x86_64", 4, 8, {"avx2": True})
    return Inventory("Linux", cpu, 64000, 32000, backends)


def test_a_numbered_gpu_is_placed_by_its_number_in_either_spelling(core: FakeCore) -> None:
    inv = _inventory(probe_openvino())
    for asked in ("gpu.1", "GPU.1"):  # edge's spelling and OpenVINO's
        where = place(inv, backend="openvino", device=asked)
        assert (where.device, where.memory_bytes) == ("gpu.1", 8 * GIB)
    assert place(inv, backend="openvino", device="gpu.0").device == "gpu.0"
    # a bare gpu where two exist: the discrete one, named exactly
    assert place(inv, backend="openvino", device="gpu").device == "gpu.1"
    with pytest.raises(
        DeviceError, match=r"no gpu\.2 .*found: openvino:cpu, openvino:gpu\.0, openvino:gpu\.1"
    ):
        place(inv, backend="openvino", device="gpu.2")


def test_runtime_devices_parse_with_a_backend_and_refuse_other_spellings() -> None:
    assert parse_device("openvino:gpu.1") == ("single", [Target("gpu", "openvino", 1)])
    assert parse_device("GPU.0") == ("single", [Target("gpu", None, 0)])
    assert str(Target("gpu", "openvino", 1)) == "openvino:gpu.1"
    for bad in ("gpu:1", "gpu.x", "tpu"):
        with pytest.raises(DeviceError, match="unknown device") as err:
            parse_device(bad)
        assert "gpu.1" in (err.value.hint or "")


def test_the_runner_compiles_for_the_exact_gpu_never_the_bare_alias(core: FakeCore, tmp_path: Path) -> None:
    graph = _graph(tmp_path / "g.onnx")
    OpenVinoRunner(graph, RunnerOptions(device="gpu.0"))
    OpenVinoRunner(graph, RunnerOptions(device="gpu"))  # two GPUs: the discrete one, by its name
    assert [device for _, device, _ in core.compiled] == ["GPU.0", "GPU.1"]
    with pytest.raises(DeviceError, match=r"OpenVINO has no GPU\.3 device here \(devices: CPU, GPU\.0"):
        OpenVinoRunner(graph, RunnerOptions(device="gpu.3"))


def test_one_gpu_is_compiled_by_the_name_openvino_lists(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fake = FakeCore({"CPU": LAPTOP["CPU"], "GPU": LAPTOP["GPU.0"]})
    module = types.ModuleType("openvino")
    module.Core = lambda: fake  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "openvino", module)
    OpenVinoRunner(_graph(tmp_path / "g.onnx"), RunnerOptions(device="gpu"))
    assert fake.compiled[0][1] == "GPU"


def test_the_npu_is_compiled_with_openvinos_npuw_settings(core: FakeCore, tmp_path: Path) -> None:
    OpenVinoRunner(_graph(tmp_path / "g.onnx"), RunnerOptions(device="npu"))
    _, device, config = core.compiled[0]
    assert device == "NPU"
    assert {k: config[k] for k in NPU_CONFIG} == dict(NPU_CONFIG)
    assert config["NPU_USE_NPUW"] == "YES" and config["NPUW_FOLD"] == "YES"
    assert "NUM_STREAMS" not in config and "INFERENCE_NUM_THREADS" not in config


# -- the model-level paths, with discovery injected ----------------------------------------------------------------
@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("runtime-devices") / "tiny.gguf", TinySpec(seed=7))


LLAMA_CPU = BackendStatus("llamacpp", True, "0", (BackendDevice("cpu", "cpu"),))
OV_CPU = BackendStatus("openvino", True, "0", (BackendDevice("CPU", "cpu"),))
ORT_CUDA = BackendStatus(
    "ort",
    True,
    "1.32.0",
    (
        BackendDevice("CPUExecutionProvider", "cpu"),
        BackendDevice("CUDAExecutionProvider", "gpu"),
        BackendDevice("QNNExecutionProvider", "npu", runnable=False, why_not="QDQ only"),
    ),
)


def _discovering(monkeypatch: pytest.MonkeyPatch, inv: Inventory) -> None:
    def discover(backends: tuple[str, ...] | None = None) -> Inventory:
        keep = tuple(b for b in inv.backends if backends is None or b.name in backends)
        return Inventory(inv.os, inv.cpu, inv.memory_total_mb, inv.memory_available_mb, keep)

    monkeypatch.setattr(discovery, "discover", discover)


def test_a_machine_whose_only_gpu_is_orts_cuda_runs_gpu_there(
    monkeypatch: pytest.MonkeyPatch, model_file: Path
) -> None:
    _discovering(monkeypatch, _inventory(LLAMA_CPU, OV_CPU, ORT_CUDA))
    opening = resolve_request(model_file, DeviceRequest(device="gpu"), PlannedOptions(n_ctx=256))
    assert (opening.placement.backend, opening.placement.device) == ("ort", "gpu")


def test_gpu_says_what_it_tried_when_no_backend_has_one(
    monkeypatch: pytest.MonkeyPatch, model_file: Path
) -> None:
    ort_cpu = BackendStatus("ort", True, "1.32.0", (BackendDevice("CPUExecutionProvider", "cpu"),))
    _discovering(monkeypatch, _inventory(LLAMA_CPU, OV_CPU, ort_cpu))
    with pytest.raises(NoUsableDeviceError) as err:
        resolve_request(model_file, DeviceRequest(device="gpu"), PlannedOptions(n_ctx=256))
    assert [b for b, _ in err.value.attempts] == ["openvino", "llamacpp", "ort"]
    assert all("no gpu is usable by" in why for _, why in err.value.attempts)
    assert err.value.message.startswith("no backend runs gpu here (tried openvino: ")
    # with a fallback allowed, the CPU runs it and says so
    opening = resolve_request(
        model_file, DeviceRequest(device="gpu", fallback="cpu", backend="ort"), PlannedOptions(n_ctx=256)
    )
    assert (opening.placement.device, opening.placement.fallback) == ("cpu", "gpu -> cpu")


def test_the_gpu_asked_for_by_number_is_the_one_placed(
    core: FakeCore, monkeypatch: pytest.MonkeyPatch, model_file: Path
) -> None:
    _discovering(monkeypatch, _inventory(LLAMA_CPU, probe_openvino(), ORT_CUDA))
    opts = PlannedOptions(n_ctx=256)
    for request, device in (
        (DeviceRequest(device="gpu.0"), "gpu.0"),
        (DeviceRequest(backend="openvino", device="GPU.0"), "gpu.0"),
        (DeviceRequest(device="openvino:gpu.1"), "gpu.1"),
        (DeviceRequest(device="gpu"), "gpu.1"),  # the discrete one, by its number
    ):
        where = resolve_request(model_file, request, opts).placement
        assert (where.backend, where.device) == ("openvino", device), request
    # a number no backend has: each backend tried says so
    with pytest.raises(NoUsableDeviceError, match=r"no backend runs gpu\.2 here") as err:
        resolve_request(model_file, DeviceRequest(device="gpu.2"), opts)
    assert [b for b, _ in err.value.attempts] == ["openvino", "llamacpp", "ort"]


def test_a_gpu_is_sized_with_its_own_memory(monkeypatch: pytest.MonkeyPatch, model_file: Path) -> None:
    tiny_dgpu = BackendDevice("GPU.1", "gpu", index=1, memory_bytes=1 << 10)  # 1 KiB of its own
    ov = BackendStatus("openvino", True, "0", (BackendDevice("CPU", "cpu"), tiny_dgpu))
    _discovering(monkeypatch, _inventory(LLAMA_CPU, ov))
    with pytest.raises(InsufficientMemoryError, match=r"on openvino:gpu\.1 .* but 0 MiB is available"):
        resolve_request(
            model_file, DeviceRequest(backend="openvino", device="gpu.1"), PlannedOptions(n_ctx=256)
        )
    with pytest.raises(NoUsableDeviceError, match=r"openvino: .*needs about"):
        resolve_request(model_file, DeviceRequest(device="gpu"), PlannedOptions(n_ctx=256))


def test_the_gpu_tried_next_opens_when_the_first_refuses(
    monkeypatch: pytest.MonkeyPatch, model_file: Path
) -> None:
    import edge.devices.registry as registry

    ov = BackendStatus("openvino", True, "0", (BackendDevice("CPU", "cpu"), BackendDevice("GPU", "gpu")))
    _discovering(monkeypatch, _inventory(LLAMA_CPU, ov, ORT_CUDA))
    opened: list[tuple[str, str]] = []

    refusing = {"openvino"}

    def open_decoder(backend: str, model: object, device: str, options: object) -> object:
        opened.append((backend, device))
        if backend in refusing:
            raise RuntimeError("GPU plugin: clCreateContext failed")
        return object()

    monkeypatch.setattr(registry, "open_decoder", open_decoder)
    opening = resolve_request(model_file, DeviceRequest(device="gpu"), PlannedOptions(n_ctx=256))
    _, where = opening.open()
    assert opened == [("openvino", "gpu"), ("ort", "gpu")]
    assert where.backend == "ort" and (where.note or "").startswith(
        "openvino:gpu failed to open: RuntimeError: GPU plugin: clCreateContext failed"
    )
    # every one refuses: the error lists each backend tried, in order, and why
    refusing.add("ort")
    with pytest.raises(NoUsableDeviceError) as err:
        resolve_request(model_file, DeviceRequest(device="gpu"), PlannedOptions(n_ctx=256)).open()
    assert [b for b, _ in err.value.attempts] == ["llamacpp", "openvino", "ort"]
    assert "no gpu is usable by llamacpp" in err.value.attempts[0][1]
    assert all("failed to open: RuntimeError" in why for _, why in err.value.attempts[1:])


def test_a_real_npu_takes_the_static_plan(
    core: FakeCore, monkeypatch: pytest.MonkeyPatch, model_file: Path
) -> None:
    _discovering(monkeypatch, _inventory(LLAMA_CPU, probe_openvino()))
    opening = resolve_request(
        model_file, DeviceRequest(device="npu"), PlannedOptions(n_ctx=4096, static_capacity=512)
    )
    assert opening.plan is not None and opening.plan.static
    (part,) = opening.plan.partitions
    assert (part.device.backend, part.device.kind, part.device.emulated) == ("openvino", "npu", False)
    assert opening.placement.device == "npu"
    assert "speed not measured" in opening.plan.explain()


# -- ONNX Runtime, as it reports its execution providers ----------------------------------------------------------
class OrtHardwareDeviceType(enum.Enum):
    CPU = 0
    GPU = 1
    NPU = 2


class FakeHardwareDevice:
    def __init__(
        self, kind: OrtHardwareDeviceType, vendor: str, device_id: int, metadata: dict[str, str] | None = None
    ) -> None:
        self.type, self.vendor, self.vendor_id, self.device_id = kind, vendor, 0, device_id
        self.metadata: dict[str, str] = metadata or {}


class FakeEpDevice:
    def __init__(self, ep_name: str, ep_vendor: str, device: FakeHardwareDevice) -> None:
        self.ep_name, self.ep_vendor, self.device = ep_name, ep_vendor, device
        self.ep_metadata: dict[str, str] = {}
        self.ep_options: dict[str, str] = {}


class FakeSession:
    def __init__(self, path: str, options: object, providers: Sequence[str]) -> None:
        self.path, self.options, self.providers = path, options, list(providers)

    def get_providers(self) -> list[str]:
        return self.providers

    def io_binding(self) -> object:
        return object()


def _ort_module(providers: Sequence[str], ep_devices: Sequence[FakeEpDevice] | None) -> types.ModuleType:
    """onnxruntime as a build with these providers reports itself; `ep_devices` None: older than 1.22."""
    ort = types.ModuleType("onnxruntime")
    ort.__version__ = "1.32.0" if ep_devices is not None else "1.20.1"
    ort.get_available_providers = lambda: list(providers)  # type: ignore[attr-defined]
    ort.get_all_providers = lambda: [  # type: ignore[attr-defined]
        "CPUExecutionProvider",
        "CUDAExecutionProvider",
        "DmlExecutionProvider",
        "QNNExecutionProvider",
        "CoreMLExecutionProvider",
    ]
    ort.sessions: list[FakeSession] = []  # type: ignore[misc]

    def session(path: str, options: object, providers: Sequence[str]) -> FakeSession:
        s = FakeSession(path, options, providers)
        ort.sessions.append(s)  # type: ignore[attr-defined]
        return s

    ort.InferenceSession = session  # type: ignore[attr-defined]
    ort.SessionOptions = lambda: types.SimpleNamespace(  # type: ignore[attr-defined]
        add_session_config_entry=lambda k, v: None, register_custom_ops_library=lambda p: None
    )
    ort.GraphOptimizationLevel = types.SimpleNamespace(ORT_ENABLE_ALL=99)  # type: ignore[attr-defined]
    if ep_devices is not None:
        ort.registered: list[tuple[str, str]] = []  # type: ignore[misc]
        ort.get_ep_devices = lambda: list(ep_devices)  # type: ignore[attr-defined]
        ort.register_execution_provider_library = lambda name, path: ort.registered.append((name, path))  # type: ignore[attr-defined]
    return ort


CPU_HW = FakeHardwareDevice(OrtHardwareDeviceType.CPU, "Intel", 0)
EP_DEVICES = [
    FakeEpDevice("CPUExecutionProvider", "Microsoft", CPU_HW),
    FakeEpDevice(
        "CUDAExecutionProvider",
        "Microsoft",
        FakeHardwareDevice(
            OrtHardwareDeviceType.GPU, "NVIDIA", 0x2860, {"DxgiVideoMemory": "8188 MB", "Discrete": "1"}
        ),
    ),
    FakeEpDevice(
        "DmlExecutionProvider",
        "Microsoft",
        FakeHardwareDevice(OrtHardwareDeviceType.GPU, "Intel", 0x7D55, {"DxgiVideoMemory": "128 MB"}),
    ),
    FakeEpDevice(
        "QNNExecutionProvider", "Microsoft", FakeHardwareDevice(OrtHardwareDeviceType.NPU, "Qualcomm", 1)
    ),
    # a plugin library's EP: not one of this build's own providers
    FakeEpDevice(
        "WebGpuExecutionProvider", "Microsoft", FakeHardwareDevice(OrtHardwareDeviceType.GPU, "Intel", 7)
    ),
]


@pytest.fixture
def fresh_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes, "_REGISTERED", {})


def test_ort_ep_devices_are_listed_runnable_or_with_why_not(
    monkeypatch: pytest.MonkeyPatch, fresh_plugins: None
) -> None:
    ort = _ort_module(["CUDAExecutionProvider", "CPUExecutionProvider"], EP_DEVICES)
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)
    monkeypatch.setenv(ORT_EP_LIBRARIES_ENV, "webgpu=/opt/ort/libonnxruntime_providers_webgpu.so")
    status = probe_ort()
    assert ort.registered == [("webgpu", "/opt/ort/libonnxruntime_providers_webgpu.so")]  # type: ignore[attr-defined]
    devs = {d.name: d for d in status.devices}
    assert [(n, d.kind, d.runnable) for n, d in devs.items()] == [
        ("CPUExecutionProvider", "cpu", True),
        ("CUDAExecutionProvider", "gpu", True),
        ("DmlExecutionProvider", "gpu", True),
        ("QNNExecutionProvider", "npu", False),
        ("WebGpuExecutionProvider", "gpu", False),
    ]
    # the discrete GPU sized with its own memory as ORT reports it; the integrated one with the system's
    assert devs["CUDAExecutionProvider"].memory_bytes == 8188 << 20
    assert devs["DmlExecutionProvider"].memory_bytes is None
    assert devs["CUDAExecutionProvider"].properties["metadata.Discrete"] == "1"
    assert "QDQ" in devs["QNNExecutionProvider"].why_not
    assert devs["WebGpuExecutionProvider"].properties["plugin"] is True
    assert "plugin EP" in devs["WebGpuExecutionProvider"].why_not
    assert (
        devs["CUDAExecutionProvider"].full_name
        == "Microsoft CUDAExecutionProvider on NVIDIA GPU (device id 10336)"
    )
    probe_ort()  # a second discovery does not register the library again (ORT refuses that)
    assert len(ort.registered) == 1  # type: ignore[attr-defined]
    # placement offers only what the runner opens
    inv = _inventory(status)
    assert place(inv, backend="ort", device="gpu").device == "gpu"
    with pytest.raises(DeviceError, match="no npu is usable by ort"):
        place(inv, backend="ort", device="npu")


def test_a_plugin_library_that_fails_to_register_is_said(
    monkeypatch: pytest.MonkeyPatch, fresh_plugins: None
) -> None:
    ort = _ort_module(["CPUExecutionProvider"], EP_DEVICES[:1])

    def refuse(name: str, path: str) -> None:
        raise RuntimeError(f"LoadLibrary failed with error 126 for {path}")

    ort.register_execution_provider_library = refuse  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)
    monkeypatch.setenv(ORT_EP_LIBRARIES_ENV, "qnn=/nowhere/QnnHtp.dll")
    assert "plugin EP not registered: qnn (/nowhere/QnnHtp.dll): LoadLibrary failed" in probe_ort().note
    monkeypatch.setenv(ORT_EP_LIBRARIES_ENV, "/nowhere/without-a-name.so")
    with pytest.raises(DeviceError, match="is not NAME=PATH"):
        probe_ort()


def test_older_ort_lists_its_providers_by_name(monkeypatch: pytest.MonkeyPatch, fresh_plugins: None) -> None:
    ort = _ort_module(["CoreMLExecutionProvider", "AzureExecutionProvider", "CPUExecutionProvider"], None)
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)
    monkeypatch.setenv(ORT_EP_LIBRARIES_ENV, "webgpu=/opt/ort/libonnxruntime_providers_webgpu.so")
    status = probe_ort()
    assert [(d.name, d.runnable) for d in status.devices] == [
        ("CoreMLExecutionProvider", False),
        ("CPUExecutionProvider", True),
    ]
    assert "webgpu: onnxruntime 1.20.1 has no plugin EPs (1.22 or later has)" in status.note


def test_the_ort_runner_opens_cuda_for_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    ort = _ort_module(["CUDAExecutionProvider", "CPUExecutionProvider"], EP_DEVICES)
    monkeypatch.setitem(sys.modules, "onnxruntime", ort)
    OrtRunner(_graph(tmp_path / "g.onnx"), RunnerOptions(device="gpu"))
    (session,) = ort.sessions  # type: ignore[attr-defined]
    assert session.providers == ["CUDAExecutionProvider"]
    with pytest.raises(DeviceError, match="no provider edge runs on npu"):
        OrtRunner(_graph(tmp_path / "g.onnx"), RunnerOptions(device="npu"))
    with pytest.raises(DeviceError, match=r"first gpu, not gpu\.1"):
        OrtRunner(_graph(tmp_path / "g.onnx"), RunnerOptions(device="gpu.1"))


def test_the_runtime_answers_here_have_the_shapes_injected() -> None:
    """The shapes the fakes above give are the installed runtimes' own (where they are installed)."""
    ort = pytest.importorskip("onnxruntime")
    eps = ort.get_ep_devices()
    assert eps and {"ep_name", "ep_vendor", "device"} <= set(dir(eps[0]))
    hw = eps[0].device
    assert {"type", "vendor", "device_id", "metadata"} <= set(dir(hw))
    assert str(hw.type).rsplit(".", 1)[-1] in ("CPU", "GPU", "NPU")
    ov = pytest.importorskip("openvino")
    assert "CPU" in ov.Core().available_devices
    assert str(ov.Core().get_property("CPU", "DEVICE_TYPE")).startswith("Type.")


def test_edge_devices_lists_each_device_as_the_runtime_names_it(
    core: FakeCore,
    monkeypatch: pytest.MonkeyPatch,
    fresh_plugins: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import json

    from edge.cli import main

    monkeypatch.setitem(sys.modules, "onnxruntime", _ort_module(["CPUExecutionProvider"], EP_DEVICES))
    inv = _inventory(LLAMA_CPU, probe_openvino(), probe_ort())
    monkeypatch.setattr(discovery, "discover", lambda backends=None: inv)
    assert main(["devices", "--json"]) == 0
    backends = {b["name"]: b for b in json.loads(capsys.readouterr().out)["backends"]}
    gpu1 = next(d for d in backends["openvino"]["devices"] if d["name"] == "GPU.1")
    assert (gpu1["index"], gpu1["memory_bytes"], gpu1["runnable"]) == (1, 8 * GIB, True)
    qnn = next(d for d in backends["ort"]["devices"] if d["name"] == "QNNExecutionProvider")
    assert not qnn["runnable"] and "QDQ" in qnn["why_not"]
    monkeypatch.setenv("COLUMNS", "600")  # one row a backend: the table wraps long cells otherwise
    assert main(["devices"]) == 0
    text = capsys.readouterr().out
    assert "GPU.1 (gpu, 8192 MB of its own)" in text
    assert "not run:" in text


def test_the_speed_probe_runs_only_where_the_device_does(monkeypatch: pytest.MonkeyPatch) -> None:
    import edge.devices.probe as probe

    timed: list[tuple[str, str]] = []

    def measure(backend: str, device: str) -> float:
        timed.append((backend, device))
        return 20.0

    monkeypatch.setattr(probe, "measure_bandwidth", measure)
    llama = BackendStatus("llamacpp", True, "0", (BackendDevice("cpu", "cpu"), BackendDevice("gpu", "gpu")))
    profiles = probe.device_profiles(_inventory(llama, ORT_CUDA), refresh=True)
    # llama.cpp's GPU offload is not timed with numpy on the CPU; ORT's QNN (not run by edge) is not offered
    assert timed == [("llamacpp", "cpu"), ("ort", "CPUExecutionProvider"), ("ort", "CUDAExecutionProvider")]
    gpu = next(p for p in profiles if (p.backend, p.kind) == ("llamacpp", "gpu"))
    assert (gpu.measured, gpu.bandwidth_gbs) == (False, 0.0)
    assert not any(p.kind == "npu" for p in profiles)
