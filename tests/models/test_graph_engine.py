"""edge's own graph engine on tiny random GGUFs (issue 4, "Done when"): GraphDecoder on ONNX Runtime and OpenVINO
against llama.cpp and against an independent numpy forward, and the ring-buffer KV cache behind it.

- F32 weights, each family and RoPE scaling: logits agree with llama.cpp's (its KV cache in f32) at every
  position (cosine >= 0.9999999, same argmax), the sequence fed as chunked prefill, a short chunk and
  single-token decode steps. (With llama.cpp's default f16 KV cache the cosine falls to ~0.999999 on
  phi3-longrope, whose attention factor sharpens the scores: that is llama.cpp's rounding, not a difference
  in the model.)
- Each weight type edge imports (F32, F16, BF16, the legacy quants gguf-py quantizes, and the K-quants as
  crafted valid random blocks), each family, both backends with precision="exact": logits equal the numpy forward
  (tests/numpy_reference.py, float64 on `gguf.quants.dequantize`d weights) within 1e-3; an unsupported type is
  a ModelFormatError naming the tensor.
- Ring buffer: rollback after a wrap is bit-exact, generation runs to 4x the capacity (and equals StreamingLLM
  attention in the reference), policy "error" refuses cleanly and reset() recovers, capacity only matters
  after the wrap.
- Static shapes (every KV slot bound each step, what NPUs need) give the dynamic path's logits.

Measured numbers are printed (pytest -s shows them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

from edge.devices.graph_decoder import GraphDecoder, GraphOptions
from edge.errors import ContextOverflowError, ModelFormatError
from edge.models.gguf_file import open_gguf
from edge.models.weights import supported_types
from tests import numpy_reference as ref
from tests.tiny_models import TinySpec, write_tiny_model

T = GGMLQuantizationType
ARCHS = (
    *("llama", "qwen2", "gemma3", "qwen3", "phi3"),
    *("llama3-rope", "llama-linear-rope", "phi3-longrope", "phi3-longrope-short", "mistral", "qwen2-head"),
)
BACKENDS = ("ort", "openvino")
SPECS = {
    "llama": TinySpec(arch="llama"),  # untied head (output.weight)
    "qwen2": TinySpec(arch="qwen2", tied=True, seed=1),  # Q/K/V biases, tied head
    "qwen3": TinySpec(arch="qwen3", seed=3),  # QK-norm, no biases, untied head
    # Llama 3.1 / 3.2: RoPE frequency factors in rope_freqs.weight (divisors 1..8), base 500k
    "llama3-rope": TinySpec(arch="llama", rope_freqs=True, rope_base=5e5, seed=4),
    "llama-linear-rope": TinySpec(arch="llama", rope_scale=4.0, seed=5),  # rope.scaling.type linear, factor 4
    "phi3": TinySpec(arch="phi3", seed=8),  # attn_qkv and [gate; up] in ffn_up (Phi-3-mini-4k: no scaling)
    # Phi-3 128k: LongRoPE tables and attention factor; llama.cpp (n_ctx 64) and edge (capacity 4096) both
    # run past the original context of 32, so the long table applies
    "phi3-longrope": TinySpec(arch="phi3", long_rope=True, original_context=32, seed=9),
    # ... and within an original context of 4096: the short table
    "phi3-longrope-short": TinySpec(arch="phi3", long_rope=True, ctx=8192, original_context=4096, seed=10),
    "mistral": TinySpec(arch="llama", n_head=8, n_head_kv=2, head_dim=8, rope_base=1e6, seed=6),  # GQA 4:1
    "qwen2-head": TinySpec(arch="qwen2", seed=7),  # Qwen2.5 >= 3B: biases and an output.weight
    # 6 layers: five sliding-window (window 8, RoPE base 10k) and one global (RoPE base from the file)
    "gemma3": TinySpec(arch="gemma3", n_layer=6, sliding_window=8, rope_base=1e6, seed=2),
}
# gguf-py quantizes these itself (tests/tiny_models.py writes them from random normal weights)
GGUF_PY_TYPES = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0)
# gguf-py only dequantizes these: valid random blocks are crafted (on 256-wide models: K-quant rows are
# super-blocks of 256)
CRAFTED_TYPES = (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)
# byte offsets of each block's float16 scale fields (the rest of a block is codes and 6/8-bit sub-scales,
# valid for any bytes)
F16_FIELDS = {
    T.Q2_K: (80, 82),
    T.Q3_K: (108,),
    T.Q4_K: (0, 2),
    T.Q5_K: (0, 2),
    T.Q6_K: (208,),
    T.IQ4_NL: (0,),
}
KQUANT_DIMS = {"n_embd": 256, "n_head": 4, "head_dim": 64, "n_ff": 256}
# crafted token_embd spread: keeps the 256-wide models' logits in the range of the 64-wide ones (tens)
EMBD_STD = 0.25

COS_MIN = 0.9999999
CONTEXT = GraphOptions().capacity  # the decoders' KV capacity (picks phi3's LongRoPE table)
MAX_ABS = 1e-3

pytestmark = pytest.mark.usefixtures("edge_cache")


# --- fixtures and helpers -----------------------------------------------------------------------------------


def ids_for(n: int, seed: int = 0, vocab: int = 320) -> list[int]:
    return np.random.default_rng(seed).integers(3, vocab, n).tolist()


def craft_blocks(qtype: T, n: int, k: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Random valid raw blocks uint8 [n, row bytes] of `qtype` whose dequantized values have about `std`.

    Codes and sub-block scales are random bytes; the float16 super-block scales (d, dmin) get random signs and
    magnitudes, then one common factor (the values are linear in them) brings the spread to `std`."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // block, type_size), dtype=np.uint8)
    fields = F16_FIELDS[qtype]
    u = rng.uniform(0.5, 1.5, (n, k // block, len(fields))) * rng.choice([-1.0, 1.0], (n, k // block, 1))

    def set_fields(values: np.ndarray) -> None:
        for j, at in enumerate(fields):
            raw[..., at : at + 2] = values[..., j].astype(np.float16)[..., None].view(np.uint8)

    set_fields(u)
    spread = float(dequantize(raw.reshape(n, -1), qtype).std())
    set_fields(u * (std / spread))
    out = raw.reshape(n, -1)
    assert np.isfinite(dequantize(out, qtype)).all()
    return out


def retype(src: Path, dst: Path, qtype_for: Callable[[str], T | None], seed: int = 0) -> Path:
    """Copy a GGUF, replacing each 2-D tensor for which qtype_for(name) is a type by crafted raw blocks of it."""
    rng = np.random.default_rng(seed)
    reader = GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    w = GGUFWriter(str(dst), arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        qtype = qtype_for(t.name) if len(t.shape) == 2 else None
        if qtype is None:
            w.add_tensor(t.name, np.array(t.data))
        else:
            k, n = (int(d) for d in t.shape)
            std = EMBD_STD if t.name == "token_embd.weight" else 1.0 / np.sqrt(k)
            w.add_tensor(t.name, craft_blocks(qtype, n, k, std, rng), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, T], Path]:
    """tiny(arch, weight type) -> the tiny model's path, written once per module."""
    root = tmp_path_factory.mktemp("tiny_models")

    @cache
    def make(arch: str, qtype: T = T.F32) -> Path:
        spec = SPECS[arch]
        if qtype in CRAFTED_TYPES:
            f32 = write_tiny_model(root / f"{arch}-256-F32.gguf", replace(spec, **KQUANT_DIMS))
            return retype(f32, root / f"{arch}-{qtype.name}.gguf", lambda _: qtype)
        return write_tiny_model(root / f"{arch}-{qtype.name}.gguf", replace(spec, weight_type=qtype))

    return make


@cache
def reference(
    path: Path, ids: tuple[int, ...], streaming: tuple[int, int] | None = None, context: int = CONTEXT
) -> np.ndarray:
    return ref.forward(ref.load(path), ids, streaming=streaming, context=context)


def decoder(path: Path, backend: str, **options: Any) -> GraphDecoder:
    return GraphDecoder(
        open_gguf(path), GraphOptions(backend=backend, threads=1, precision="exact", **options)
    )


def feed(dec: GraphDecoder, ids: Sequence[int], plan: Sequence[int]) -> np.ndarray:
    """Logits [len(ids), vocab], the ids fed in forward() calls of the sizes in `plan`."""
    assert sum(plan) == len(ids)
    out, at = [], 0
    for n in plan:
        out.append(dec.forward(ids[at : at + n]))
        at += n
    assert dec.position == len(ids)
    return np.concatenate(out)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64 * b64).sum(-1) / (np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1))


def llamacpp_logits(path: Path, ids: Sequence[int]) -> np.ndarray:
    import llama_cpp

    f32 = llama_cpp.GGML_TYPE_F32  # KV cache in f32: llama.cpp's f16 rounding is not what is measured
    llm = llama_cpp.Llama(
        str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1, type_k=f32, type_v=f32
    )
    try:
        llm.eval(list(ids))
        return np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()


# --- 1. F32 against llama.cpp -------------------------------------------------------------------------------

N_SEQ = 48
# 30 tokens as prefill (chunks of 16: 16 + 14; gemma3's window-8 ring caps a step at 8), a 5-token chunk,
# then one token per step
PLAN = (30, 5, *[1] * (N_SEQ - 35))


@pytest.fixture(scope="module")
def llamacpp_f32(tiny: Callable[[str, T], Path]) -> Callable[[str], np.ndarray]:
    @cache
    def get(arch: str) -> np.ndarray:
        return llamacpp_logits(tiny(arch, T.F32), ids_for(N_SEQ))

    return get


@pytest.mark.parametrize("arch", ARCHS)
def test_numpy_reference_agrees_with_llamacpp(
    arch: str, tiny: Callable[[str, T], Path], llamacpp_f32: Callable[[str], np.ndarray]
) -> None:
    """The reference itself is checked against llama.cpp before anything is measured against it."""
    path = tiny(arch, T.F32)
    ours = reference(path, tuple(ids_for(N_SEQ)))
    theirs = llamacpp_f32(arch)
    cos = cosines(ours, theirs)
    print(f"\n[reference vs llama.cpp] {arch}: min cosine {cos.min():.8f}")
    assert cos.min() >= COS_MIN
    np.testing.assert_array_equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_f32_logits_agree_with_llamacpp_at_every_position(
    arch: str, backend: str, tiny: Callable[[str, T], Path], llamacpp_f32: Callable[[str], np.ndarray]
) -> None:
    dec = decoder(tiny(arch, T.F32), backend, prefill_chunk=16)
    assert dec.chunk == (8 if arch == "gemma3" else 16)
    ours = feed(dec, ids_for(N_SEQ), PLAN)
    theirs = llamacpp_f32(arch)
    assert ours.shape == theirs.shape == (N_SEQ, dec.vocab_size)
    cos = cosines(ours, theirs)
    print(
        f"\n[vs llama.cpp] {arch}/{backend}: min cosine {cos.min():.8f} (at {int(cos.argmin())}), "
        f"max |diff| {np.abs(ours - theirs).max():.2e}"
    )
    assert cos.min() >= COS_MIN, f"cosine {cos.min()} at position {int(cos.argmin())}"
    np.testing.assert_array_equal(ours.argmax(-1), theirs.argmax(-1))


SCALED = ("llama3-rope", "llama-linear-rope", "phi3-longrope", "phi3-longrope-short")


@pytest.mark.parametrize("arch", SCALED)
def test_rope_scaling_is_what_makes_them_agree(
    arch: str, tiny: Callable[[str, T], Path], llamacpp_f32: Callable[[str], np.ndarray]
) -> None:
    """The scaled models' agreement is not luck: the same forward without the file's RoPE scaling (factors,
    linear scale, attention factor) is far from llama.cpp."""
    model = ref.load(tiny(arch, T.F32))
    plain = replace(
        model,
        freq_scale=1.0,
        attn_factor=1.0,
        weights={k: v for k, v in model.weights.items() if not k.startswith("rope_")},
    )
    cos = cosines(ref.forward(plain, ids_for(N_SEQ)), llamacpp_f32(arch))
    print(f"\n[scaling ignored vs llama.cpp] {arch}: min cosine {cos.min():.6f}")
    assert cos.min() < 0.999


def test_longrope_table_follows_the_capacity(tiny: Callable[[str, T], Path]) -> None:
    """A phi3 128k decoder whose KV capacity is within the original context (32) uses the short table, as
    llama.cpp does for such an n_ctx; past it, the long one."""
    path, ids = tiny("phi3-longrope", T.F32), ids_for(24, seed=5)
    short = reference(path, tuple(ids), context=32)
    assert cosines(short, reference(path, tuple(ids))).min() < 0.999  # the tables differ
    for backend in BACKENDS:
        ours = feed(decoder(path, backend, capacity=32, max_rollback=0, prefill_chunk=16), ids, (16, 8))
        assert float(np.abs(ours - short).max()) < MAX_ABS


# --- 2. every weight type against the numpy forward ---------------------------------------------------------

N_QSEQ = 20
QPLAN = (12, *[1] * (N_QSEQ - 12))
ALL_TYPES = (*GGUF_PY_TYPES, *CRAFTED_TYPES)


def test_every_supported_type_is_covered() -> None:
    assert sorted(t.name for t in ALL_TYPES) == sorted(supported_types())
    for qtype in CRAFTED_TYPES:  # if gguf-py learns to quantize them, write them from real weights instead
        with pytest.raises(NotImplementedError):
            quantize(np.zeros((1, 256), np.float32), qtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_numpy_forward(
    arch: str, qtype: T, backend: str, tiny: Callable[[str, T], Path]
) -> None:
    path = tiny(arch, qtype)
    types = {t.tensor_type for t in GGUFReader(str(path)).tensors if len(t.shape) == 2}
    assert types == {qtype}, f"the model's linear weights are {types}"
    ids = ids_for(N_QSEQ, seed=3)
    ours = feed(decoder(path, backend, prefill_chunk=16), ids, QPLAN)
    want = reference(path, tuple(ids))
    err = float(np.abs(ours - want).max())
    print(
        f"\n[vs numpy] {arch}/{qtype.name}/{backend}: max |diff| {err:.2e} (logits up to {np.abs(want).max():.1f})"
    )
    assert err < MAX_ABS


@pytest.mark.parametrize("tensor", ["blk.0.attn_q.weight", "blk.1.ffn_down.weight"])
def test_unsupported_type_names_the_tensor(
    tensor: str, tiny: Callable[[str, T], Path], tmp_path: Path
) -> None:
    path = retype(tiny("llama", T.F32), tmp_path / "iq4_nl.gguf", lambda n: T.IQ4_NL if n == tensor else None)
    with pytest.raises(ModelFormatError, match=r"IQ4_NL") as err:
        decoder(path, "ort")
    assert tensor in str(err.value)


# --- 3. the ring buffer on a tiny model ---------------------------------------------------------------------

CAP, SINK = 16, 4
RING_ARCHS = ("llama", "gemma3")  # gemma3: window-8 layers (their own ring) beside a global one


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", RING_ARCHS)
@pytest.mark.parametrize(
    ("n_prefix", "k"), [(14, 6), (26, 6), (29, 8)], ids=["across-wrap", "after-wrap", "after-wrap-k8"]
)
def test_rollback_after_wrap_restores_exact_logits(
    arch: str, backend: str, n_prefix: int, k: int, tiny: Callable[[str, T], Path]
) -> None:
    path = tiny(arch, T.F32)
    ids = ids_for(n_prefix + 1 + k, seed=4)
    prefix, nxt, extra = ids[:n_prefix], ids[n_prefix], ids[n_prefix + 1 :]
    dec = decoder(path, backend, capacity=CAP, sink=SINK, max_rollback=8, prefill_chunk=8)
    dec.forward(prefix)
    keys = [a.copy() for a in dec.cache.keys]
    values = [a.copy() for a in dec.cache.values]
    want = dec.forward([nxt])
    dec.rollback(1)
    dec.forward(extra[:3])  # several commits: a chunk, then single tokens
    for t in extra[3:]:
        dec.forward([t])
    assert dec.position == n_prefix + k > CAP  # the extra tokens overwrote ring slots
    dec.rollback(k)
    assert dec.position == n_prefix
    for i in range(len(keys)):
        np.testing.assert_array_equal(dec.cache.keys[i], keys[i])
        np.testing.assert_array_equal(dec.cache.values[i], values[i])
    got = dec.forward([nxt])
    np.testing.assert_array_equal(got, want)
    # and that state is the one the ring should hold: sinks + the most recent tokens
    streaming = reference(path, (*prefix, nxt), (SINK, CAP))[-1]
    err = float(np.abs(got[0] - streaming).max())
    print(
        f"\n[rollback] {arch}/{backend} prefix {n_prefix} k {k}: bit-exact; vs streaming reference {err:.2e}"
    )
    assert err < MAX_ABS


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", RING_ARCHS)
def test_ring_generation_runs_to_4x_capacity(arch: str, backend: str, tiny: Callable[[str, T], Path]) -> None:
    path = tiny(arch, T.F32)
    dec = decoder(path, backend, capacity=CAP, sink=SINK, policy="ring", prefill_chunk=8)
    tokens = ids_for(8, seed=5)
    rows = [dec.forward(tokens)]
    while len(tokens) < 4 * CAP:
        tokens.append(int(np.argmax(rows[-1][-1])))
        rows.append(dec.forward([tokens[-1]]))
        assert dec.position == len(tokens)
        assert np.isfinite(rows[-1]).all()
    assert dec.position == 4 * CAP
    assert dec.cache.fill == CAP
    assert sorted(dec.cache.positions(dec.cfg.n_layer - 1)) == [
        *range(SINK),
        *range(4 * CAP - (CAP - SINK), 4 * CAP),
    ]  # the global layer holds the sinks and the most recent tokens
    # every step equals attention over the sinks + the most recent capacity - sink tokens
    got = np.concatenate(rows)
    err = float(np.abs(got - reference(path, tuple(tokens), (SINK, CAP))).max())
    print(f"\n[ring 4x] {arch}/{backend}: {len(tokens)} tokens, vs streaming reference {err:.2e}")
    assert err < MAX_ABS


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", RING_ARCHS)
def test_error_policy_refuses_overflow_and_reset_recovers(
    arch: str, backend: str, tiny: Callable[[str, T], Path]
) -> None:
    dec = decoder(tiny(arch, T.F32), backend, capacity=CAP, sink=SINK, policy="error", prefill_chunk=8)
    ids = ids_for(CAP + 4, seed=6)
    first = dec.forward(ids[:CAP])  # exactly full
    with pytest.raises(ContextOverflowError, match=rf"{CAP} \+ 1 tokens exceed the KV cache of {CAP}") as err:
        dec.forward([ids[CAP]])
    assert err.value.hint and "ring" in err.value.hint
    assert dec.position == CAP  # nothing was committed
    dec.reset()
    assert dec.position == 0
    np.testing.assert_array_equal(dec.forward(ids[:CAP]), first)
    dec.reset()
    with pytest.raises(ContextOverflowError):  # one call larger than the cache commits nothing either
        dec.forward(ids)
    assert dec.position == 0
    np.testing.assert_array_equal(dec.forward(ids[:8]), first[:8])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", RING_ARCHS)
def test_capacity_matters_only_after_the_wrap(
    arch: str, backend: str, tiny: Callable[[str, T], Path]
) -> None:
    path = tiny(arch, T.F32)
    ids = ids_for(40, seed=7)
    plan = (20, *[1] * 20)  # the wrap falls inside the third prefill chunk
    big = feed(decoder(path, backend, capacity=4096, sink=SINK, prefill_chunk=8), ids, plan)
    small = feed(decoder(path, backend, capacity=CAP, sink=SINK, prefill_chunk=8), ids, plan)
    # a token at p attends to itself and CAP slots; the first token that has lost one is at CAP + 1
    before = float(np.abs(big[: CAP + 1] - small[: CAP + 1]).max())
    first_after = float(np.abs(big[CAP + 1] - small[CAP + 1]).max())
    print(
        f"\n[capacity] {arch}/{backend}: max |diff| up to the wrap {before:.2e}, just after {first_after:.2e}"
    )
    assert before <= 1e-5
    assert first_after > 1e-3
    assert all(np.abs(big[p] - small[p]).max() > 1e-4 for p in range(CAP + 1, len(ids)))


# --- 4. static shapes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_static_shapes_equal_dynamic(arch: str, backend: str, tiny: Callable[[str, T], Path]) -> None:
    path = tiny(arch, T.F32)
    ids = ids_for(60, seed=8)
    plan = (30, 5, *[1] * 25)  # capacity 48: the dynamic path binds 32 slots, then 48; the ring wraps
    opts = {"capacity": 48, "sink": SINK, "prefill_chunk": 16}
    dynamic = feed(decoder(path, backend, **opts), ids, plan)
    static = decoder(path, backend, static_shapes=True, **opts)
    fixed = feed(static, ids, plan)
    assert static._bound_slots(static.cfg.n_layer - 1) == 48
    err = float(np.abs(fixed - dynamic).max())
    print(f"\n[static] {arch}/{backend}: max |diff| vs dynamic {err:.2e}")
    assert err <= 1e-5


@pytest.mark.parametrize(("backend", "precision"), [("ort", "exact"), ("ort", "fast"), ("openvino", "exact")])
def test_last_only_prompt_over_chunks(backend: str, precision: str, tiny: Callable[[str, T], Path]) -> None:
    """A prompt of several chunks with last_only: the earlier chunks run without the head (no rows scored);
    the one row returned and the KV it leaves are those of a forward of every row (ORT fast: the staged graph)."""
    path = tiny("llama", T.F32)
    ids = ids_for(40, seed=3)
    opts = GraphOptions(backend=backend, threads=1, precision=precision, prefill_chunk=16)
    last, every = GraphDecoder(open_gguf(path), opts), GraphDecoder(open_gguf(path), opts)
    got = last.forward(ids, last_only=True)
    want = every.forward(ids)
    assert got.shape == (1, last.vocab_size)
    # a one-row head and a 40-row head may sum in another order (MLAS's M=1 kernel)
    np.testing.assert_allclose(got[0], want[-1], rtol=0, atol=1e-5 if precision == "exact" else 1e-3)
    step = ids_for(1, seed=4)
    np.testing.assert_array_equal(last.forward(step), every.forward(step))
