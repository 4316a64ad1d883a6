"""Graphs whose K-quant linears run on edge's kernels (MatMulKQuant in ONNX Runtime), on tiny random models:
the same logits as the float64 forward within precision fast's rounding, on every ISA path; where the kernels
do not apply, the lossless graph."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from gguf import GGMLQuantizationType as T

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.devices.kquant import ISAS, isa_runs, kernel_library
from edge.errors import BackendUnavailableError, DeviceError
from edge.graph_opt import kquant_op
from edge.models.gguf_file import open_gguf
from tests import numpy_reference as ref
from tests.models.test_graph_engine import KQUANT_DIMS, SPECS, cosines, ids_for, llamacpp_logits, retype
from tests.tiny_models import write_tiny_model

pytestmark = pytest.mark.usefixtures("edge_cache")

N = 20
PLAN = (12, *[1] * (N - 12))  # a 12-token prompt, then one token a step


def _v_q6(name: str) -> T:  # Q4_K_M's mix: most linears Q4_K, the V projections and the head Q6_K
    return T.Q6_K if "attn_v" in name or name == "output.weight" else T.Q4_K


MIXES: dict[str, Callable[[str], T]] = {
    "Q4_K": lambda _: T.Q4_K,
    "Q5_K": lambda _: T.Q5_K,
    "Q6_K": lambda _: T.Q6_K,
    "Q4_K_M-like": _v_q6,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], Path]:
    root = tmp_path_factory.mktemp("kquant_models")
    made: dict[tuple[str, str], Path] = {}

    def make(arch: str, mix: str) -> Path:
        if (arch, mix) not in made:
            f32 = write_tiny_model(root / f"{arch}-f32.gguf", replace(SPECS[arch], **KQUANT_DIMS))
            made[arch, mix] = retype(f32, root / f"{arch}-{mix}.gguf", MIXES[mix])
        return made[arch, mix]

    return make


def _decoder(path: Path, **options: object) -> GraphDecoder:
    opts = GraphOptions(backend="ort", threads=1, precision="fast", prefill_chunk=16, **options)  # type: ignore[arg-type]
    return GraphDecoder(open_gguf(path), opts)


def _feed(dec: GraphDecoder, ids: list[int]) -> np.ndarray:
    out, at = [], 0
    for n in PLAN:
        out.append(dec.forward(ids[at : at + n]))
        at += n
    return np.concatenate(out)


def _kquant_nodes(dec: GraphDecoder) -> int:
    graph = onnx.load(str(dec.graph_path), load_external_data=False).graph
    return sum(1 for n in graph.node if n.domain == kquant_op.DOMAIN and n.op_type == kquant_op.OP_TYPE)


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_logits_follow_the_float64_forward(arch: str, mix: str, tiny: Callable[[str, str], Path]) -> None:
    """Prompt and decode steps through the kernels: as close to the float64 forward as llama.cpp, which rounds
    the activations the same way (int8 per 256); every K-quant linear on them. MatMulNBits' int8 path rounds
    per 32 (and 16 for Q/K/V) and comes closer, at ~1.4x the bytes a token."""
    path = tiny(arch, mix)
    ids = ids_for(N, seed=3)
    want = ref.forward(ref.load(path), ids)
    kq = _decoder(path)
    # per layer: Q/K/V stacked where their types agree (Q4_K_M-like: Q/K, then V apart), the output, gate and
    # up stacked, down; then the head. Each op rounds its input once: fewer ops, fewer roundings a token
    assert kq.kquant and _kquant_nodes(kq) == 2 * (5 if mix == "Q4_K_M-like" else 4) + 1
    ours = _feed(kq, ids)
    nbits = _decoder(path, kquant=False)
    assert not nbits.kquant and _kquant_nodes(nbits) == 0
    cos_ours, cos_nbits = cosines(ours, want).min(), cosines(_feed(nbits, ids), want).min()
    cos_llama = cosines(llamacpp_logits(path, ids), want).min()
    print(
        f"\n[{arch}/{mix}] min cosine to float64: kquant {cos_ours:.6f}, llama.cpp {cos_llama:.6f}, "
        f"MatMulNBits int8 {cos_nbits:.6f}"
    )
    assert cos_ours >= 0.995
    assert 1 - cos_ours <= 1.5 * (1 - cos_llama) + 1e-6


@pytest.mark.parametrize("isa", [i for i in ISAS if isa_runs(i)])
def test_every_isa_path_in_the_graph(
    isa: str, tiny: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """EDGE_KQUANT_ISA forces the op's kernels: each path this CPU runs gives the portable path's logits, bit
    for bit (every kernel adds the blocks in one order)."""
    path, ids = tiny("qwen2", "Q4_K_M-like"), ids_for(N, seed=4)
    monkeypatch.setenv("EDGE_KQUANT_ISA", "portable")
    base = _feed(_decoder(path), ids)
    monkeypatch.setenv("EDGE_KQUANT_ISA", isa)
    np.testing.assert_array_equal(_feed(_decoder(path), ids), base)


def test_a_forced_isa_this_cpu_cannot_run_is_an_error(
    tiny: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGE_KQUANT_ISA", "sse9")
    with pytest.raises(Exception, match="EDGE_KQUANT_ISA"):
        _decoder(tiny("qwen2", "Q4_K")).forward([5, 6, 7])


def test_where_the_kernels_do_not_apply(
    tiny: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """exact keeps the lossless graph; so does an accuracy level other than int8's, and a file without K-quant
    linears; asking for the kernels there is an error that says where they run; EDGE_KQUANT=off turns auto
    off."""
    path = tiny("qwen2", "Q4_K")
    exact = GraphDecoder(open_gguf(path), GraphOptions(backend="ort", threads=1, precision="exact"))
    assert not exact.kquant
    with pytest.raises(DeviceError, match="ort:cpu at precision fast"):
        GraphDecoder(open_gguf(path), GraphOptions(backend="ort", precision="exact", kquant=True))
    assert not _decoder(path, accuracy_level=0).kquant  # fp32 activations asked for: MatMulNBits keeps them
    f32 = write_tiny_model(path.with_name("plain-f32.gguf"), SPECS["qwen2"])
    assert not _decoder(f32).kquant
    monkeypatch.setenv("EDGE_KQUANT", "off")
    assert not _decoder(path).kquant


def test_without_a_compiler_the_graph_falls_back_and_says_so(
    tiny: Callable[[str, str], Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No library built yet and no compiler: one note on stderr, then the lossless graph, which answers."""
    from edge.devices.kquant import build, choose

    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "fresh"))  # no library built here yet
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no cc, gcc or clang
    monkeypatch.setattr(build, "_FAILED", None)  # restored (None) after the test: its failure is not kept
    choose._say_once.cache_clear()
    try:
        dec = _decoder(tiny("qwen2", "Q4_K"))
        assert not dec.kquant and dec.forward([5, 6, 7]).shape[0] == 3
        assert "need a C compiler" in capsys.readouterr().err
        with pytest.raises(BackendUnavailableError, match="C compiler"):
            _decoder(tiny("qwen2", "Q4_K"), kquant=True)
    finally:
        monkeypatch.setattr(build, "_FAILED", None)


def test_a_compiler_without_vnni_still_builds_every_variant(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A compiler older than AVX512-VNNI (GCC < 8) refuses -mavx512vnni: that variant is built without it (its
    multiply-adds unfused), the library still has every table, and they still give the portable bits."""
    import ctypes
    import shutil

    from edge.devices.kquant import build

    real = shutil.which("cc") or shutil.which("gcc")
    assert real is not None
    fake = tmp_path / "old-cc"
    fake.write_text(
        f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -mavx512vnni ] && exit 1; done\nexec {real} "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", str(fake))
    monkeypatch.setattr(build, "_FAILED", None)
    try:
        built = kernel_library()
    finally:
        monkeypatch.setattr(build, "_FAILED", None)
    assert built.path.is_relative_to(tmp_path) and "kq_avx512vnni" in built.variants
    lib = ctypes.CDLL(str(built.path))
    lib.kq_kernels_for.restype = ctypes.c_void_p
    rng = np.random.default_rng(1)
    x = rng.standard_normal((13, 512)).astype(np.float32)
    w = rng.integers(0, 256, (40, 2 * 144), dtype=np.uint8)
    w.reshape(40, 2, 144)[:, :, :4] = np.array([0.01, 0.01], np.float16).view(np.uint8)  # finite d, dmin
    outs = {}
    for isa in (0, 3):
        if lib.kq_kernels_for(isa) is None:
            continue
        y = np.empty((13, 40), np.float32)
        f32, u8 = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_uint8)
        lib.kq_matmul.argtypes = [ctypes.c_int, ctypes.c_int, f32, ctypes.c_int64, ctypes.c_int64, u8,
                                  ctypes.c_int64, f32]  # fmt: skip
        assert (
            lib.kq_matmul(
                isa, 12, x.ctypes.data_as(f32), 13, 512, w.ctypes.data_as(u8), 40, y.ctypes.data_as(f32)
            )
            == 0
        )
        outs[isa] = y
    if 3 in outs:
        np.testing.assert_array_equal(outs[3], outs[0])


def test_a_cache_emptied_since_is_built_into_again(
    tiny: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A process whose cache folder changes (or is pruned) between two loads builds into the new one, never
    hands ORT a library path that is gone."""
    first = kernel_library().path
    monkeypatch.setenv("EDGE_CACHE_DIR", str(tmp_path / "elsewhere"))
    dec = _decoder(tiny("qwen2", "Q4_K"))
    assert dec.kquant and dec.forward([5, 6, 7]).shape[0] == 3
    assert kernel_library().path != first and kernel_library().path.is_relative_to(tmp_path)


def test_rows_stay_batch_invariant(tiny: Callable[[str, str], Path]) -> None:
    """ORT at precision fast claims batch-invariant rows (greedy speculative decoding relies on it); the
    kernels keep the claim, and the run of the graph that checks it here (devices/invariance.py) agrees."""
    dec = _decoder(tiny("qwen2", "Q4_K_M-like"))
    assert dec.kquant and dec.capabilities().batch_invariant
