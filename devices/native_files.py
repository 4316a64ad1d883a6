"""The known-answer check's model files (devices/native_check.py): tiny random one-layer decoders with the widths,
heads and weight types of the catalog's files, written with gguf's own writer.

Widths matter as much as types: llama.cpp's repacked kernels (AMX, the CPU repack buffer) take a weight only
when its rows and columns fit their tiles (a multiple of 32 columns, 256 for K-quants), so a file narrower than
the real ones would pass a check the real ones fail. Each file is one layer (the kernels are per linear) and
a 512-token vocabulary (a multiple of 32: the head takes the tiled path too).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES

__all__ = ["CHECK_MODELS", "CheckModel", "write_check_model"]

T = gguf.GGMLQuantizationType
N_VOCAB = 512
# byte offsets of each K-quant block's float16 super-block scales; the rest (codes, 6/8-bit sub-scales) is valid
# for any bytes, so a valid random block is random bytes with those two fields set
_F16_FIELDS = {T.Q4_K: (0, 2), T.Q6_K: (208,)}


@dataclass(frozen=True)
class CheckModel:
    """One check file: a family's widths and the GGML type of each linear role."""

    name: str
    arch: str  # llama | qwen2 (models/archs)
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    types: tuple[tuple[str, T], ...]  # role (token_embd, output, attn_q, ..., ffn_down) -> type
    tied: bool = False  # no output.weight: the head reads token_embd

    def type_of(self, role: str) -> T:
        return dict(self.types)[role]


def _roles(embd: T, q: T, k: T, v: T, o: T, gate: T, up: T, down: T, head: T | None) -> tuple:
    pairs = [("token_embd", embd), ("attn_q", q), ("attn_k", k), ("attn_v", v), ("attn_output", o)]
    pairs += [("ffn_gate", gate), ("ffn_up", up), ("ffn_down", down)]
    return tuple(pairs + ([("output", head)] if head is not None else []))


# what the catalog loads (edge models): smollm2-135m is Q4_1 with a Q8_0 tied embedding; qwen2.5-coder-0.5b's
# Q4_K_M is Q5_0 where its 896 columns refuse K-quants, Q8_0 values and head, Q6_K / Q4_K down projections;
# the 1.5b and gemma3's K-quant linears are 256-aligned (here also Q4_0, the type both repackers take first)
CHECK_MODELS: tuple[CheckModel, ...] = (
    CheckModel(
        "llama-576-q4_1", "llama", 576, 9, 3, 64, 1536, _roles(T.Q8_0, *[T.Q4_1] * 7, None), tied=True
    ),
    CheckModel(
        "qwen2-896-q5_0",
        "qwen2",
        896,
        14,
        2,
        64,
        4864,
        _roles(T.Q5_0, T.Q5_0, T.Q5_0, T.Q8_0, T.Q5_0, T.Q5_0, T.Q5_0, T.Q6_K, T.Q8_0),
    ),
    CheckModel(
        "qwen2-512-q4_k",
        "qwen2",
        512,
        4,
        2,
        128,
        1024,
        _roles(T.Q4_K, T.Q4_K, T.Q4_K, T.Q6_K, T.Q4_K, T.Q4_0, T.Q4_K, T.Q4_K, T.Q6_K),
    ),
)


def _crafted(qtype: T, n: int, k: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Random valid K-quant blocks uint8 [n, row bytes] whose values spread about `std` (gguf-py only
    dequantizes K-quants): random bytes, then the float16 scales set and brought to the spread."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    fields = _F16_FIELDS[qtype]
    u = rng.uniform(0.5, 1.5, (n, k // block, len(fields))) * rng.choice([-1.0, 1.0], (n, k // block, 1))

    def set_fields(values: np.ndarray) -> None:
        for j, at in enumerate(fields):
            raw[..., at : at + 2] = values[..., j].astype(np.float16)[..., None].view(np.uint8)

    set_fields(u)
    spread = float(gguf.quants.dequantize(raw.reshape(n, -1), qtype).std())
    set_fields(u * (std / spread))
    return raw.reshape(n, -1)


def _weight(qtype: T, n: int, k: int, std: float, rng: np.random.Generator) -> np.ndarray:
    if qtype in _F16_FIELDS:
        return _crafted(qtype, n, k, std, rng)
    return gguf.quants.quantize(rng.normal(0.0, std, (n, k)).astype(np.float32), qtype)


def _vocab(w: gguf.GGUFWriter) -> None:
    """A SentencePiece-style vocabulary llama.cpp accepts (unk, bos, eos, the 256 byte tokens, words); the
    check feeds token ids, so what the tokens spell does not matter."""
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    tokens += [f"\u2581w{i}".encode() for i in range(N_VOCAB - len(tokens))]
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(N_VOCAB - 259)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (N_VOCAB - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(False)


def write_check_model(path: Path, m: CheckModel, seed: int = 0) -> Path:
    """Write `m` as a one-layer GGUF at `path` (the same bytes for the same seed)."""
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), m.arch)
    w.add_context_length(4096)
    w.add_embedding_length(m.n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(m.n_ff)
    w.add_head_count(m.n_head)
    w.add_head_count_kv(m.n_head_kv)
    w.add_key_length(m.head_dim)
    w.add_value_length(m.head_dim)
    w.add_rope_dimension_count(m.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    _vocab(w)
    d, q, kv = m.n_embd, m.n_head * m.head_dim, m.n_head_kv * m.head_dim

    def lin(name: str, role: str, n_out: int, n_in: int, std: float | None = None) -> None:
        qtype = m.type_of(role)
        w.add_tensor(name, _weight(qtype, n_out, n_in, std or 1.0 / np.sqrt(n_in), rng), raw_dtype=qtype)

    def f32(name: str, values: np.ndarray) -> None:
        w.add_tensor(name, values.astype(np.float32))

    lin("token_embd.weight", "token_embd", N_VOCAB, d, std=1.0)
    f32("blk.0.attn_norm.weight", 1.0 + 0.1 * rng.standard_normal(d))
    for role, n_out in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
        lin(f"blk.0.{role}.weight", role, n_out, d)
        if m.arch == "qwen2":  # Qwen2 carries Q/K/V biases (llama.cpp requires them)
            f32(f"blk.0.{role}.bias", 0.1 * rng.standard_normal(n_out))
    lin("blk.0.attn_output.weight", "attn_output", d, q)
    f32("blk.0.ffn_norm.weight", 1.0 + 0.1 * rng.standard_normal(d))
    lin("blk.0.ffn_gate.weight", "ffn_gate", m.n_ff, d)
    lin("blk.0.ffn_up.weight", "ffn_up", m.n_ff, d)
    lin("blk.0.ffn_down.weight", "ffn_down", d, m.n_ff)
    f32("output_norm.weight", 1.0 + 0.1 * rng.standard_normal(d))
    if not m.tied:
        lin("output.weight", "output", N_VOCAB, d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
