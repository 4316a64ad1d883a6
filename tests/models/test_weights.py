"""GGUF -> ONNX weight import (models/weights.py into graph_opt's BlockWeight, emitted by graph_opt's one
emitter in every form of graph_opt.FORMS): exact against gguf-py, run in ONNX Runtime and OpenVINO.

Tolerance of the runtime checks. y = x @ W^T in float32: every product and each of the k - 1 additions
rounds with relative error <= eps = 2^-24, in whatever order the kernel sums, so
|y - y_exact| <= k * eps * sum_j |x_j| |w_j| (first order). Integer zero points are exact ((code - zp) is
an exact small integer), so |w| = |W_q| + |bias| with W_q = (code - zp) * scale; the split form's bias
term (block sums of x times bias) is bounded by the same |bias| terms (the "nbits" and "qdq" forms). A float zero point
zp_f = zp - bias / scale rounds to eps * |zp_f|, so (code - zp_f) * scale carries a few
eps * ((|code| + |zp|) * |scale| + |bias|): that is the magnitude used for the "nbits" form of formats
with a min ("nbits_fzp"). Each output element is checked against (k + 8) * eps * (|x| @ magnitude^T), against the
float64 product of x and gguf-py's dequantized W. That is far inside the issue's 1e-3 (relative to the
output scale); the measured maximum is printed.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from edge.errors import ModelFormatError
from edge.graph_opt import BlockWeight, linear_protos
from edge.models.gguf_file import GGUFFile, open_gguf
from edge.models.weights import (
    FLOAT_TYPES,
    NBITS_TYPES,
    dequantize_raw,
    dequantize_rows,
    dequantize_tensor,
    import_linear,
    linear_from_raw,
)

T = GGMLQuantizationType
EPS = 2.0**-24
N_OUT = 24
# gguf-py quantizes these itself; the K-quants it only dequantizes, so their blocks are crafted.
GGUF_QUANTIZABLE = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
# Byte offsets of the float16 fields in each block (random bytes are valid blocks except NaN/inf there).
F16_FIELDS = {
    T.Q4_0: (0,),
    T.Q4_1: (0, 2),
    T.Q5_0: (0,),
    T.Q5_1: (0, 2),
    T.Q8_0: (0,),
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
}
LOWERINGS = ("nbits", "nbits_fzp", "qdq")
# Exact fp32 in OpenVINO's CPU plugin needs its dynamic int8 quantization of activations off: by default
# (group size 32) it quantizes x for u4/u8 weights with integer zero points and blocks >= 32, ~5e-3 error.
OV_EXACT = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


def _k_for(qtype: GGMLQuantizationType) -> int:
    return 512  # a multiple of every block (K-quants: 256)


def _random_blocks(qtype: GGMLQuantizationType, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid raw blocks uint8 [n, row bytes], with some scale-0 sub-blocks that keep a min."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // block, type_size), dtype=np.uint8)
    for at in F16_FIELDS[qtype]:
        h = raw[..., at : at + 2].copy().view(np.float16)
        h[~np.isfinite(h)] = np.float16(0.25)
        raw[..., at : at + 2] = h.view(np.uint8)
    first = raw[0, 0]  # scale 0 with a nonzero min in the first block of row 0
    if qtype in (T.Q4_K, T.Q5_K):
        first[4] &= 0xC0  # sub-block 0: 6-bit scale 0 (its min sits in byte 8)
        first[8] |= 0x05
    elif qtype == T.Q2_K:
        first[0] = 0x70  # sub-block 0: scale 0, min 7
    elif qtype in (T.Q4_1, T.Q5_1):
        first[0:2] = np.zeros(2, np.uint8)  # d = 0, m random
    return raw.reshape(n, -1)


def _source(qtype: GGMLQuantizationType, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """What GGUFWriter gets for `qtype`: float arrays for float types, raw blocks otherwise."""
    values = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    values[1, :64] = 0.3  # constant blocks: Q4_1 / Q5_1 quantize them to d = 0, m = 0.3
    if qtype == T.F32:
        return values
    if qtype == T.F16:
        return values.astype(np.float16)
    if qtype == T.BF16 or qtype in GGUF_QUANTIZABLE:
        return quantize(values, qtype)
    return _random_blocks(qtype, n, k, rng)


ALL_TYPES = (*FLOAT_TYPES, *NBITS_TYPES)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> GGUFFile:
    """One GGUF holding, per supported type, `q.<TYPE>` (gguf-quantized where gguf-py can) and
    `r.<TYPE>` (random raw blocks, quantized types), each of GGUF shape (512, 24); plus a Q4_1 weight
    with an odd number of blocks per row and unsupported types."""
    rng = np.random.default_rng(1234)
    path = tmp_path_factory.mktemp("weights") / "weights.gguf"
    w = GGUFWriter(path, "llama")
    for qtype in ALL_TYPES:
        k = _k_for(qtype)
        data = _source(qtype, N_OUT, k, rng)
        w.add_tensor(f"q.{qtype.name}", data, raw_dtype=qtype if data.dtype == np.uint8 else None)
        if qtype in NBITS_TYPES:
            w.add_tensor(f"r.{qtype.name}", _random_blocks(qtype, N_OUT, k, rng), raw_dtype=qtype)
    w.add_tensor(
        "odd.Q4_1", quantize(rng.standard_normal((7, 96)).astype(np.float32), T.Q4_1), raw_dtype=T.Q4_1
    )
    for qtype in (T.IQ4_NL, T.TQ1_0, T.Q8_1):
        block, type_size = GGML_QUANT_SIZES[qtype]
        raw = np.zeros((4, 256 // block * type_size), np.uint8)
        w.add_tensor(f"bad.{qtype.name}", raw, raw_dtype=qtype)
    w.add_tensor("bad.I32", np.zeros((4, 32), np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return open_gguf(path)


def _reference(gguf: GGUFFile, name: str) -> np.ndarray:
    """gguf-py's dequantization of the whole tensor, numpy shape [n, k]."""
    info = gguf.tensors[name]
    raw = gguf.tensor_bytes(name).reshape(info.shape[1], -1)
    return np.asarray(dequantize(raw, T(info.ggml_type)), np.float32).reshape(info.shape[1], info.shape[0])


def _tensor_names() -> list[str]:
    names = [f"q.{t.name}" for t in ALL_TYPES] + [f"r.{t.name}" for t in NBITS_TYPES]
    return [*names, "odd.Q4_1"]


# ---------------------------------------------------------------------------------------------------------
# Numpy: decoding is exact


@pytest.mark.parametrize("name", _tensor_names())
def test_dequantize_equals_gguf_bit_for_bit(gguf_file: GGUFFile, name: str) -> None:
    weight = import_linear(gguf_file, name)
    ref = _reference(gguf_file, name)
    got = _dequantize(weight)
    assert got.dtype == np.float32 and got.shape == ref.shape
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(dequantize_tensor(gguf_file, name, chunk_rows=5), ref)


@pytest.mark.parametrize("qtype", NBITS_TYPES, ids=lambda t: t.name)
def test_nbits_layout(gguf_file: GGUFFile, qtype: GGMLQuantizationType) -> None:
    from onnx import numpy_helper

    w = import_linear(gguf_file, f"r.{qtype.name}")
    assert isinstance(w, BlockWeight)
    assert (w.k, w.n) == (512, N_OUT)
    assert w.bits in (4, 8) and w.block_size in (16, 32)
    assert w.codes.dtype == np.uint8 and w.codes.shape == (w.n, w.k)
    assert int(w.codes.max()) < 1 << w.bits
    assert w.scales.dtype == np.float32 and w.scales.shape == (w.n, w.k_blocks)
    _, inits = linear_protos(w, "X", "Y", "l", lowering="nbits")
    packed = next(numpy_helper.to_array(t) for t in inits if t.name == "l.B")
    assert packed.dtype == np.uint8
    assert packed.shape == (w.n, w.k // w.block_size, w.block_size * w.bits // 8)
    # MatMulNBits packs element 2i in the low nibble and 2i + 1 in the high nibble of byte i.
    if w.bits == 4:
        flat = packed.reshape(w.n, -1)
        np.testing.assert_array_equal(flat & 0x0F, w.codes[:, 0::2])
        np.testing.assert_array_equal(flat >> 4, w.codes[:, 1::2])
    else:
        np.testing.assert_array_equal(packed.reshape(w.n, -1), w.codes)


@pytest.mark.parametrize("qtype", [t for t in NBITS_TYPES if t in (T.Q4_1, T.Q5_1, T.Q4_K, T.Q5_K, T.Q2_K)])
def test_float_zero_point_form(gguf_file: GGUFFile, qtype: GGMLQuantizationType) -> None:
    """(code - zp) * scale with float zero points reproduces W; scale-0 blocks (min only) exactly."""
    w = import_linear(gguf_file, f"r.{qtype.name}")
    assert isinstance(w, BlockWeight) and w.bias is not None
    zero = w.scales == 0
    assert zero.any(), "the crafted blocks include a scale-0 sub-block"
    codes, scales, zp = w.float_zero_points()
    q = codes.reshape(w.n, w.k_blocks, w.block_size).astype(np.float32)
    got = (q - zp[..., None]) * scales[..., None]
    ref = _reference(gguf_file, f"r.{qtype.name}").reshape(got.shape)
    np.testing.assert_array_equal(got[zero], ref[zero])
    assert (np.abs(got - ref) <= 4 * EPS * _magnitude(w, "nbits_fzp").reshape(got.shape)).all()


def test_float_types(gguf_file: GGUFFile) -> None:
    f16 = import_linear(gguf_file, "q.F16")
    assert isinstance(f16, np.ndarray) and f16.dtype == np.float16  # kept, not widened
    bf16 = import_linear(gguf_file, "q.BF16")
    assert isinstance(bf16, np.ndarray) and bf16.dtype == np.float32
    np.testing.assert_array_equal(bf16, _reference(gguf_file, "q.BF16"))
    f32 = import_linear(gguf_file, "q.F32")
    assert isinstance(f32, np.ndarray) and f32.shape == (N_OUT, 512)


@pytest.mark.parametrize("name", _tensor_names())
def test_rows_equal_whole_table(gguf_file: GGUFFile, name: str) -> None:
    ref = _reference(gguf_file, name)
    ids = np.array([3, 0, 3, ref.shape[0] - 1, 1], np.int64)  # repeats and any order
    np.testing.assert_array_equal(dequantize_rows(gguf_file, name, ids), ref[ids])
    assert dequantize_rows(gguf_file, name, []).shape == (0, ref.shape[1])


def test_rows_out_of_range(gguf_file: GGUFFile) -> None:
    for bad in ([N_OUT], [-1]):
        with pytest.raises(IndexError, match="out of range"):
            dequantize_rows(gguf_file, "q.Q8_0", bad)


@pytest.mark.parametrize("name", ["bad.IQ4_NL", "bad.TQ1_0", "bad.Q8_1", "bad.I32"])
def test_unsupported_type_is_named(gguf_file: GGUFFile, name: str) -> None:
    type_name = name.split(".")[1]
    for call in (lambda: import_linear(gguf_file, name), lambda: dequantize_rows(gguf_file, name, [0])):
        with pytest.raises(ModelFormatError) as info:
            call()
        text = str(info.value)
        assert name in text and type_name in text and "Q4_K" in text and "supported" in text


def test_onnx_options(gguf_file: GGUFFile) -> None:
    weight = import_linear(gguf_file, "q.Q4_0")
    assert isinstance(weight, BlockWeight)
    (node,), inits = linear_protos(weight, "X", "Y", "l", lowering="nbits")
    assert "accuracy_level" not in {a.name for a in node.attribute}  # 0: omitted
    assert {t.name for t in inits} == {"l.B", "l.scales"}  # the default zero point 8
    (node,), _ = linear_protos(weight, "X", "Y", "l", lowering="nbits", accuracy_level=4)
    assert node.op_type == "MatMulNBits" and node.domain == "com.microsoft"
    assert {a.name: a.i for a in node.attribute}["accuracy_level"] == 4
    tags = {p.key: p.value for p in node.metadata_props}
    assert tags == {"edge.linear": "l", "edge.linear.form": "nbits", "edge.linear.role": "weight"}
    with pytest.raises(ValueError, match="lowering"):
        linear_protos(weight, "X", "Y", "l", lowering="fp8")


def test_unknown_type_number() -> None:
    with pytest.raises(ModelFormatError, match="unknown type 99"):
        linear_from_raw(np.zeros(16, np.uint8), (4, 1), 99)


def test_bad_shapes() -> None:
    raw = np.zeros(2 * 18, np.uint8)
    with pytest.raises(ModelFormatError, match="multiple of"):
        linear_from_raw(raw, (48, 1), T.Q4_0)
    with pytest.raises(ModelFormatError, match="bytes"):
        linear_from_raw(raw, (32, 1), T.Q4_0)
    with pytest.raises(ModelFormatError, match="2-D"):
        linear_from_raw(raw, (32, 2, 1), T.Q4_0)
    assert dequantize_raw(raw, (32, 2, 1), T.Q4_0).shape == (1, 2, 32)


# ---------------------------------------------------------------------------------------------------------
# ONNX Runtime and OpenVINO run the lowered weights


def _model_path(
    weight: BlockWeight | np.ndarray, tmp_path: Path, x_rank: int, lowering: str = "nbits"
) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    nodes, inits = linear_protos(weight, "X", "Y", "layer0", lowering=lowering, rank=x_rank)
    n, k = _dequantize(weight).shape
    lead: list[int | str | None] = ["batch", "seq"] if x_rank == 3 else ["rows"]
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [*lead, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [*lead, n])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 10
    onnx.checker.check_model(model)
    path = tmp_path / "linear.onnx"
    onnx.save(model, path)
    return path


def _run_ort(path: Path, x: np.ndarray) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    # ORT fuses DequantizeLinear -> MatMul into MatMulNBits with accuracy level 4 (int8 activations) by
    # default; level 0 keeps it fp32.
    opts.add_session_config_entry("session.qdq_matmulnbits_accuracy_level", "0")
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"X": x})[0]


def _compile_ov(path: Path):  # type: ignore[no-untyped-def]
    ov = pytest.importorskip("openvino")
    core = ov.Core()
    return core.compile_model(core.read_model(str(path)), "CPU", OV_EXACT)


def _run_ov(path: Path, x: np.ndarray) -> np.ndarray:
    return _compile_ov(path)({"X": x})[0]


def _dequantize(weight: BlockWeight | np.ndarray) -> np.ndarray:
    return weight.dequantize() if isinstance(weight, BlockWeight) else weight.astype(np.float32)


def _magnitude(weight: BlockWeight | np.ndarray, lowering: str = "nbits") -> np.ndarray:
    """The scale of the rounding errors per weight (see the module docstring), float64 [n, k]; "nibbles" sums
    two products, (hi - zh) 16 s and (lo - zl) s, each as large as its own magnitude."""
    if not isinstance(weight, BlockWeight):
        return np.abs(weight).astype(np.float64)
    codes = weight.codes.reshape(weight.n, weight.k_blocks, weight.block_size).astype(np.float64)
    zp = weight.integer_zero_points()[..., None].astype(np.float64)
    scale = np.abs(weight.scales[..., None]).astype(np.float64)
    if lowering == "nbits_fzp":
        mag = (codes + zp) * scale
    elif lowering == "nibbles":
        hi = np.abs(codes // 16 - zp // 16) * 16 + np.abs(codes % 16 - zp % 16)
        mag = hi * scale
    else:
        mag = np.abs(codes - zp) * scale
    if weight.bias is not None:
        mag = mag + np.abs(weight.bias)[..., None]
    return mag.reshape(weight.n, weight.k)


def _check(
    y: np.ndarray, x: np.ndarray, ref_w: np.ndarray, weight: BlockWeight | np.ndarray, lowering: str
) -> float:
    x64 = x.astype(np.float64).reshape(-1, x.shape[-1])
    ref = x64 @ ref_w.astype(np.float64).T
    mag = _magnitude(weight, lowering)
    bound = (ref_w.shape[1] + 8) * EPS * (np.abs(x64) @ mag.T)
    got = y.reshape(ref.shape).astype(np.float64)
    err = np.abs(got - ref)
    assert (err <= bound + 1e-30).all(), f"max err {err.max():.3e}, where over bound: {(err > bound).sum()}"
    rel = float(err.max() / max(np.abs(ref).max(), 1e-30))
    assert rel < 1e-3
    return rel


def _cases() -> list[tuple[str, str]]:
    cases = []
    for name in _tensor_names():
        qtype = T[name.split(".")[1]]
        eight_bit = qtype in NBITS_TYPES and qtype not in (T.Q4_0, T.Q4_1, T.Q4_K, T.Q3_K, T.Q2_K)
        for lowering in (
            (*LOWERINGS, "nibbles") if eight_bit else LOWERINGS if qtype in NBITS_TYPES else ("float",)
        ):
            cases.append((name, lowering))
    return cases


@pytest.mark.parametrize("runtime", ["ort", "openvino"])
@pytest.mark.parametrize(("name", "lowering"), _cases())
def test_lowering_runs_exactly(
    gguf_file: GGUFFile, tmp_path: Path, name: str, lowering: str, runtime: str
) -> None:
    weight = import_linear(gguf_file, name)
    if (
        runtime == "ort"
        and lowering == "nbits_fzp"
        and isinstance(weight, BlockWeight)
        and weight.bits == 8
        and weight.bias is not None
    ):
        pytest.skip("ORT's CPU MatMulNBits refuses 8-bit weights with float zero points (use nbits)")
    path = _model_path(weight, tmp_path, x_rank=2, lowering=lowering)
    x = np.random.default_rng(7).standard_normal((3, _dequantize(weight).shape[1])).astype(np.float32)
    y = (_run_ort if runtime == "ort" else _run_ov)(path, x)
    rel = _check(y, x, _reference(gguf_file, name), weight, lowering)
    print(f"{name} {lowering} {runtime}: max |err| / max |y| = {rel:.1e}")


@pytest.mark.parametrize("lowering", LOWERINGS)
@pytest.mark.parametrize("name", ["r.Q4_K", "r.Q6_K"])
def test_rank3_input(gguf_file: GGUFFile, tmp_path: Path, name: str, lowering: str) -> None:
    """Decoder activations are [batch, seq, hidden]; the bias term's reshapes must keep that shape."""
    weight = import_linear(gguf_file, name)
    assert isinstance(weight, BlockWeight)
    path = _model_path(weight, tmp_path, x_rank=3, lowering=lowering)
    x = np.random.default_rng(8).standard_normal((2, 5, weight.k)).astype(np.float32)
    for run in (_run_ov,) if lowering == "nbits_fzp" and weight.bits == 8 else (_run_ort, _run_ov):
        y = run(path, x)
        assert y.shape == (2, 5, weight.n)
        _check(y, x, _reference(gguf_file, name), weight, lowering)


def test_f16_weight_kept_f16(gguf_file: GGUFFile) -> None:
    weight = import_linear(gguf_file, "q.F16")
    nodes, (init,) = linear_protos(weight, "X", "Y", "l")
    assert init.data_type == 10 and [n.op_type for n in nodes] == ["Cast", "MatMul"]  # FLOAT16, cast in-graph
    assert [{p.key: p.value for p in n.metadata_props}["edge.linear.form"] for n in nodes] == ["float"] * 2


@pytest.mark.parametrize(
    ("name", "lowering", "precision"),
    [
        ("q.Q4_0", "nbits", "u4"),
        ("r.Q4_K", "nbits_fzp", "u4"),
        ("r.Q4_K", "nbits", "u4"),
        ("q.Q4_0", "qdq", "i4"),
        ("r.Q6_K", "nbits", "u8"),
        ("q.Q5_1", "nbits", "u8"),
        ("q.Q8_0", "qdq", "i8"),
    ],
)
def test_openvino_keeps_weights_compressed(
    gguf_file: GGUFFile, tmp_path: Path, name: str, lowering: str, precision: str
) -> None:
    """OpenVINO's compiled FullyConnected reads the 4/8-bit codes (no fp32 copy of the weight)."""
    weight = import_linear(gguf_file, name)
    compiled = _compile_ov(_model_path(weight, tmp_path, x_rank=2, lowering=lowering))
    weight_types = [
        op.input(1).get_element_type().get_type_name()
        for op in compiled.get_runtime_model().get_ordered_ops()
        if op.get_rt_info()["layerType"].astype(str) == "FullyConnected"
    ]
    assert precision in weight_types, weight_types


# ---------------------------------------------------------------------------------------------------------
# Real catalog models


REAL_MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


@pytest.mark.slow
@pytest.mark.parametrize("model", REAL_MODELS)
def test_real_model_weights(model: str, tmp_path: Path) -> None:
    """Type inventory of a real model; one linear weight of each type imports exactly and runs in ORT and
    OpenVINO; token_embd rows decode like gguf-py."""
    from edge.models.resolve import resolve_model

    gguf = open_gguf(resolve_model(model))
    inventory = Counter(T(t.ggml_type).name for t in gguf.tensors.values())
    print(f"\n{model}: " + ", ".join(f"{k} x{v}" for k, v in sorted(inventory.items())))
    picked: dict[str, str] = {}  # the smallest linear weight of each type, to keep the test quick
    for name, info in sorted(gguf.tensors.items(), key=lambda item: item[1].nbytes):
        qtype = T(info.ggml_type).name
        if len(info.shape) == 2 and name != "token_embd.weight" and qtype not in picked:
            picked[qtype] = name
    assert picked
    rng = np.random.default_rng(0)
    for qtype, name in picked.items():
        weight = import_linear(gguf, name)
        ref = gguf.tensor_array(name)
        np.testing.assert_array_equal(_dequantize(weight), ref)
        x = rng.standard_normal((2, ref.shape[1])).astype(np.float32)
        path = _model_path(weight, tmp_path, x_rank=2)
        for runtime, run in (("ort", _run_ort), ("openvino", _run_ov)):
            rel = _check(run(path, x), x, ref, weight, "nbits")
            print(f"  {qtype:5s} {name} {ref.shape}: {runtime} max |err| / max |y| = {rel:.1e}")
    emb = gguf.tensors["token_embd.weight"]
    ids = rng.integers(0, emb.shape[1], 64)
    rows = gguf.tensor_bytes("token_embd.weight").reshape(emb.shape[1], -1)[np.sort(ids)]
    expected = dequantize(np.ascontiguousarray(rows), T(emb.ggml_type))
    np.testing.assert_array_equal(dequantize_rows(gguf, "token_embd.weight", np.sort(ids)), expected)
    print(f"  token_embd {T(emb.ggml_type).name} {emb.shape}: 64 rows equal gguf-py's")
