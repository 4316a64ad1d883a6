"""The ring KV cache in f16 (`--kv-dtype`): half the bytes, the graphs reading it, who chooses it, who refuses it.

The own graphs take f16 K/V inputs and widen them at their entry; their new K/V stay f32 and the ring rounds
them as it stores them. So a first forward (nothing in the past) writes exactly the f32 ring's K/V rounded to
fp16, and every later step reads K/V within fp16 rounding of the f32 ring's.
"""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import onnx
import pytest

import edge
from edge.cli_args import KV_CHOICES as CLI_KV_CHOICES
from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.llamacpp import LlamaCppDecoder, LlamaCppOptions
from edge.devices.memory import graph_memory, llamacpp_memory
from edge.devices.phase_split import PhaseSplitDecoder
from edge.devices.planned import DeviceRequest, PlannedOptions, open_requested, resolve_request
from edge.devices.precision import KV_CHOICES, check_f32_kv, kv_dtype_for
from edge.devices.registry import DecoderOptions, estimate_memory
from edge.errors import InsufficientMemoryError, PlanError
from edge.models.gguf_file import open_gguf
from tests.devices.test_batch import PLANS, _options, _run_plan, _slots_as_alone
from tests.edge.test_cli import EDGE, assert_one_line_error
from tests.tiny_models import TinySpec, write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")

Q = gguf.GGMLQuantizationType
SPECS = {
    "llama-q4_1": TinySpec(arch="llama", weight_type=Q.Q4_1, seed=5),
    "gemma3-f16": TinySpec(arch="gemma3", n_layer=3, weight_type=Q.F16, seed=7),  # sliding windows of 8
}


# How far the f16 ring's logits may be from the f32 ring's, as a fraction of the largest logit: measured (ORT
# and OpenVINO alike, 2026-12-05) gemma3 2.9e-5 at either precision, llama Q4_1 2.0e-4 at exact and 1.3-1.5e-2
# at fast, where int8 activations turn the K/V's rounding into whole quantization steps
DRIFT = {
    ("gemma3-f16", "exact"): 3e-4,
    ("gemma3-f16", "fast"): 3e-4,
    ("llama-q4_1", "exact"): 2e-3,
    ("llama-q4_1", "fast"): 5e-2,
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("kv16")
    return {name: write_tiny_model(tmp / f"{name}.gguf", spec) for name, spec in SPECS.items()}


def _graph(path: Path, backend: str, precision: str, kv: str, staged: bool | None = None) -> GraphDecoder:
    opts = GraphOptions(backend=backend, precision=precision, capacity=48, sink=2, threads=1, kv_dtype=kv)
    return GraphDecoder(open_gguf(path), replace(opts, staged=staged))


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize(
    ("backend", "precision"), [("ort", "fast"), ("ort", "exact"), ("openvino", "fast")], ids=str
)
def test_an_f16_ring_holds_the_f32_rings_kv_rounded_and_decodes_within_its_rounding(
    files: dict[str, Path], name: str, backend: str, precision: str
) -> None:
    prompt = list(range(3, 40))
    steps = [(7 * t) % 50 + 3 for t in range(30)]  # past the ring's 48 slots: it wraps
    runs = {}
    for kv in ("f32", "f16"):
        dec = _graph(files[name], backend, precision, kv)
        first = dec.forward(prompt[:5])  # one piece, nothing in the past
        keys = [k.copy() for k in dec.cache.keys]
        rows = [*dec.forward(prompt[5:]), *(dec.forward([t])[-1] for t in steps)]
        inputs = {
            i.name: i.type.tensor_type.elem_type
            for i in onnx.load(dec.graph_path, load_external_data=False).graph.input
        }
        runs[kv] = first, keys, np.stack(rows), inputs, dec.cache.dtype, dec.cache.nbytes
        dec.close()
    (first32, keys32, rows32, in32, dt32, bytes32), (first16, keys16, rows16, in16, dt16, bytes16) = (
        runs.values()
    )
    assert (dt32, dt16) == (np.float32, np.float16)
    assert bytes16 * 2 == bytes32
    want = {n: onnx.TensorProto.FLOAT16 for n in in32 if n.startswith(("past_", "stage_key", "stage_value"))}
    assert want and {n: in16[n] for n in want} == want
    assert all(
        in16[n] == t for n, t in in32.items() if n not in want
    )  # the rest of the contract is unchanged
    # the first layer's keys come before any attention: the f32 ring's, rounded as stored
    np.testing.assert_array_equal(keys16[0], keys32[0].astype(np.float16))
    rows16, rows32 = np.concatenate([first16, rows16]), np.concatenate([first32, rows32])
    scale = float(np.abs(rows32).max())
    # of the largest logit; the real models' KL: benchmarks/results/kv-f16-2026-12-05.md
    np.testing.assert_allclose(rows16, rows32, atol=DRIFT[name, precision] * scale)


def test_slots_on_an_f16_ring_decode_as_the_decoder_alone(files: dict[str, Path]) -> None:
    gg = open_gguf(files["llama-q4_1"])
    opts = replace(_options("ort", True, 48, slot_axis=True), kv_dtype="f16")
    engine = _slots_as_alone(lambda: GraphDecoder(gg, opts))
    assert engine.mean_batch > 1.5, engine.mean_batch


def test_a_split_on_an_f16_ring_decodes_as_its_decode_half_alone(files: dict[str, Path]) -> None:
    gg = open_gguf(files["gemma3-f16"])
    opts = replace(_options("ort", False, 48), kv_dtype="f16")
    alone = GraphDecoder(gg, opts)
    want = [_run_plan(alone, p)[0] for p in PLANS if alone.reset() is None]
    alone.close()
    split = PhaseSplitDecoder(GraphDecoder(gg, replace(opts, backend="openvino")), GraphDecoder(gg, opts))
    assert split.cache.dtype == np.float16
    got = [_run_plan(split, p)[0] for p in PLANS if split.reset() is None]
    split.close()
    assert got == want


def test_halves_on_rings_of_two_types_are_refused(files: dict[str, Path]) -> None:
    gg = open_gguf(files["llama-q4_1"])
    f32 = GraphDecoder(gg, _options("openvino", False, 48))
    f16 = GraphDecoder(gg, replace(_options("ort", False, 48), kv_dtype="f16"))
    with pytest.raises(PlanError, match="KV type f32 vs f16"):
        PhaseSplitDecoder(f32, f16)
    f32.close()
    f16.close()


def test_the_graph_cache_keeps_its_keys_for_f32_and_builds_f16_apart(files: dict[str, Path]) -> None:
    import hashlib
    import json
    from dataclasses import asdict

    from edge.devices.graph_decoder import GRAPH_FORMAT, _graph_dir
    from edge.models.transformer import BuildOptions

    gg = open_gguf(files["llama-q4_1"])
    f32 = BuildOptions(accuracy_level=4, staged=True)
    # the key as graphs cached before --kv-dtype (and before attention per slot, the K-quant kernels) were
    # stored under
    fields = {k: v for k, v in asdict(f32).items() if k not in ("slot_axis", "kv_dtype", "kquant")}
    st = gg.path.stat()
    where = [str(gg.path.resolve()), st.st_size, st.st_mtime_ns, GRAPH_FORMAT, fields]
    old = json.dumps([*where, "target:ort", "fuse:True", "precision:fast"], sort_keys=True)
    folder = _graph_dir(gg, f32, "ort", True, "fast")
    assert folder.name == hashlib.sha256(old.encode()).hexdigest()[:20]
    assert _graph_dir(gg, replace(f32, kv_dtype="f16"), "ort", True, "fast") != folder
    plain, half = (
        _graph(files["llama-q4_1"], "ort", "fast", "f32"),
        _graph(files["llama-q4_1"], "ort", "fast", "f16"),
    )
    assert plain.graph_path != half.graph_path


def test_auto_keeps_f32_on_the_cpu_graphs_and_f16_where_the_runtime_has_it() -> None:
    assert KV_CHOICES == CLI_KV_CHOICES  # the CLI declares them without importing numpy
    assert kv_dtype_for("auto", "ort", "cpu", "fast") == "f32"
    assert kv_dtype_for("auto", "openvino", "cpu", "fast") == "f32"
    assert kv_dtype_for("auto", "openvino", "gpu", "fast") == "f16"
    assert kv_dtype_for("auto", "openvino", "gpu", "exact") == "f32"
    assert kv_dtype_for("auto", "llamacpp", "cpu", "exact") == "f16"  # one precision: its own default
    assert kv_dtype_for("f16", "ort", "cpu", "fast") == "f16"
    assert kv_dtype_for("f32", "llamacpp", "cpu", "fast") == "f32"
    with pytest.raises(ValueError, match="exact keeps the KV cache in f32"):
        kv_dtype_for("f16", "ort", "cpu", "exact")
    with pytest.raises(ValueError, match="must be auto or f32 or f16"):
        kv_dtype_for("q8_0", "ort", "cpu", "fast")
    with pytest.raises(ValueError, match="--kv-dtype must be auto or f32 or f16, not 'bf16'"):
        DecoderOptions(kv_dtype="bf16")
    check_f32_kv("auto", "a partitioned plan")  # auto is f32 where only f32 runs, whatever the device
    with pytest.raises(PlanError, match="x keeps its KV cache in f32; --kv-dtype f16"):
        check_f32_kv("f16", "x")


def test_memory_is_sized_in_the_rings_type(files: dict[str, Path]) -> None:
    path = files["llama-q4_1"]
    g = open_gguf(path)
    assert graph_memory(g, 100, "f16").kv_cache * 2 == graph_memory(g, 100).kv_cache
    assert llamacpp_memory(g, 100, "f32").kv_cache == 2 * llamacpp_memory(g, 100).kv_cache
    f16 = DecoderOptions(kv_dtype="f16")
    assert estimate_memory("ort", path, 100, f16) == graph_memory(g, 100, "f16")
    assert estimate_memory("llamacpp", path, 100, DecoderOptions(kv_dtype="f32")) == llamacpp_memory(
        g, 100, "f32"
    )
    need = graph_memory(g, 1 << 20, "f16")
    tight = PlannedOptions(n_ctx=1 << 20, kv_dtype="f16", available_memory=need.total - 1)
    with pytest.raises(InsufficientMemoryError, match="in f16") as err:
        resolve_request(path, DeviceRequest("ort"), tight)
    assert err.value.hint is not None and "--kv-dtype f16" not in err.value.hint  # it is f16 already
    fits = replace(tight, available_memory=need.total)  # the f32 ring would not
    assert resolve_request(path, DeviceRequest("ort"), fits).placement.backend == "ort"


def test_the_load_opens_the_type_asked_for_and_refuses_what_cannot_hold_it(files: dict[str, Path]) -> None:
    path = files["llama-q4_1"]
    opts = PlannedOptions(n_ctx=64, threads=1, kv_dtype="f16")
    dec, _, _ = open_requested(path, DeviceRequest("ort"), opts)
    assert dec.cache.dtype == np.float16  # type: ignore[attr-defined]
    dec.close()
    split, _, _ = open_requested(path, DeviceRequest(phases="prefill=openvino:cpu,decode=ort:cpu"), opts)
    assert split.cache.dtype == np.float16  # type: ignore[attr-defined]
    split.close()
    with pytest.raises(PlanError, match="partitioned plan keeps its KV cache in f32"):
        resolve_request(path, DeviceRequest(device="hetero:openvino:cpu,ort:cpu"), opts)
    with pytest.raises(PlanError, match="NPU-shaped prefill half keeps its KV cache in f32"):
        resolve_request(path, DeviceRequest(phases="prefill=openvino:npu,decode=ort:cpu", emulate=True), opts)
    with pytest.raises(ValueError, match="exact keeps the KV cache in f32"):
        edge.load(str(path), backend="ort", precision="exact", kv_dtype="f16", draft="none")


@pytest.mark.parametrize("kv", ["f16", "f32"])
def test_llamacpp_keeps_its_kv_in_the_type_asked_for(files: dict[str, Path], kv: str) -> None:
    dec = LlamaCppDecoder(files["llama-q4_1"], LlamaCppOptions(n_ctx=256, n_threads=1, kv_dtype=kv))
    try:
        assert (
            dec._llama.context_params.type_k == dec._llama.context_params.type_v == {"f32": 0, "f16": 1}[kv]
        )
        assert dec.forward([1, 5, 9])[-1].shape[-1] == dec.vocab_size
        assert dec.kv_fill().dtype == kv
        slots = dec.slots(2)  # the batch context is made from this one's parameters, its KV type included
        params = slots[0].engine._ctx.params  # type: ignore[attr-defined]
        assert params.type_k == params.type_v == {"f32": 0, "f16": 1}[kv]
        assert [s.kv_fill().dtype for s in slots] == [kv, kv]
        for s in slots:
            s.close()
    finally:
        dec.close()


def test_the_cli_says_in_one_line_that_exact_keeps_f32(files: dict[str, Path]) -> None:
    args = (
        "run",
        str(files["llama-q4_1"]),
        "hi",
        "--backend",
        "ort",
        "--precision",
        "exact",
        "--kv-dtype",
        "f16",
    )
    proc = subprocess.run([*EDGE, *args], capture_output=True, text=True, timeout=120)
    assert_one_line_error(proc, "exact keeps the KV cache in f32")


def test_auto_keeps_the_kv_in_f16_where_only_that_fits_and_says_so(files: dict[str, Path]) -> None:
    path = files["llama-q4_1"]
    g, n_ctx = open_gguf(path), 1 << 16
    f16, f32 = graph_memory(g, n_ctx, "f16").total, graph_memory(g, n_ctx).total
    between = PlannedOptions(n_ctx=n_ctx, threads=1, available_memory=(f16 + f32) // 2)
    opening = resolve_request(path, DeviceRequest("ort"), between)
    note = opening.placement.note
    assert note is not None and "kept in f16" in note and f"{f32 >> 20} MiB" in note
    dec, placement = opening.open()
    assert dec.kv_fill().dtype == "f16" and placement.note == note
    assert placement.kv_dtype == "f16"  # what a device takeover (edge.Model) asks for again
    dec.close()
    # room for f32: nothing changes, nothing said
    roomy = resolve_request(path, DeviceRequest("ort"), replace(between, available_memory=f32))
    assert roomy.placement.note is None and roomy.placement.kv_dtype == "auto"
    # asked for f32, or exact: the type is the user's, so the load is refused as before
    for refused in (replace(between, kv_dtype="f32"), replace(between, precision="exact")):
        with pytest.raises(InsufficientMemoryError, match="in f32") as err:
            resolve_request(path, DeviceRequest("ort"), refused)
        assert err.value.hint is not None and "--kv-dtype f16" in err.value.hint
    # too little even for f16: the f32 figure is the error
    with pytest.raises(InsufficientMemoryError, match="in f32"):
        resolve_request(path, DeviceRequest("ort"), replace(between, available_memory=f16 - 1))


def test_an_f16_ring_keeps_orts_rows_batch_invariant(files: dict[str, Path]) -> None:
    """The step's own K/V are rounded as the ring will store them before it attends over them, so a k-token
    forward computes what k one-token forwards do: ORT at fast stays batch-invariant (devices/invariance.py
    checks it on this machine at load), and greedy speculative decoding keeps its guarantee."""
    claims = []
    for kv in ("f32", "f16"):
        dec = _graph(files["llama-q4_1"], "ort", "fast", kv)
        assert dec.staged
        claims.append(dec.capabilities().batch_invariant)
        dec.close()
    # where the f32 graph's rows are batch-invariant on this CPU (not on every one: the load checks), so are
    # the f16 graph's (before its own K/V were rounded they were not: the claim fell, and greedy drafting with it)
    assert claims[1] == claims[0], claims


def test_a_draft_model_holds_its_kv_in_the_type_asked_for(files: dict[str, Path]) -> None:
    from edge.drafters import open_drafter
    from edge.models.tokenizer import load_tokenizer

    path = files["llama-q4_1"]
    tok = load_tokenizer(open_gguf(path).metadata)
    for kv, want in (("f16", "f16"), ("auto", "f32")):
        d = open_drafter(str(path), tok, "target", tok.vocab_size, device="ort:cpu", n_threads=1, kv_dtype=kv)
        assert d.decoder.kv_fill().dtype == want  # type: ignore[attr-defined]
        d.close()
