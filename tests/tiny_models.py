"""Tiny random decoder GGUFs of every family in models/archs/ written with gguf.GGUFWriter, loadable by
llama.cpp; which tensors a family has comes from its ArchTraits (edge.models.arch).

They carry a small SentencePiece-style vocabulary (unk/bos/eos, the 256 byte tokens llama.cpp requires, and a
few words) so llama.cpp loads them; tests feed token ids directly, so the tokenizer content does not matter.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from edge.models.arch import traits_for

# the biases real files of a family carry (llama.cpp requires them there)
USUAL_BIASES = {"qwen2": ("q", "k", "v")}


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"  # a module of models/archs/
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_vocab: int = 320
    ctx: int = 2048
    rope_base: float = 10000.0
    eps: float = 1e-6
    sliding_window: int = 8  # gemma3 local layers
    weight_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32
    tied: bool = False  # no output.weight: the head reuses token_embd (gemma3 always)
    seed: int = 0
    chat_template: str | None = None  # tokenizer.chat_template, when the test needs one
    bias_roles: tuple[str, ...] | None = (
        None  # linears given a bias; None: the family's usual (qwen2: q, k, v)
    )
    rope_scale: float | None = None  # {arch}.rope.scaling.factor (linear scaling)
    rope_freqs: bool = False  # llama 3.x: a rope_freqs.weight tensor (llama3-style factors)
    # phi3 LongRoPE: rope_factors_long/short tensors, attn_factor and the original context
    long_rope: bool = False
    original_context: int = 32
    # "spm": the tiny SentencePiece-style vocabulary; "qwen": a byte-level BPE one with Qwen3's special tokens
    # (<|im_start|>, <|im_end|>, <think>, </think>, <tool_call>, ...), for a real Qwen chat template
    vocab: str = "spm"


def _add_vocab(w: gguf.GGUFWriter, n_vocab: int) -> None:
    """The tiny sentencepiece-style vocabulary, BOS 1 and EOS 2."""
    tokens, scores, types = _vocab(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


# Qwen3's added tokens and their GGUF types (convert_hf_to_gguf: <|...|> CONTROL, the rest USER_DEFINED)
QWEN_SPECIALS = (
    ("<|endoftext|>", 3),
    ("<|im_start|>", 3),
    ("<|im_end|>", 3),
    ("<tool_call>", 4),
    ("</tool_call>", 4),
    ("<think>", 4),
    ("</think>", 4),
)
# "\n\n" among a few merges; ">{" runs from a close tag's end into an answer (what a thinking gate must refuse)
QWEN_WORDS = ("\u010a\u010a", "th", "Ġw", "or", "ld", ">{")
QWEN_MERGES = ("\u010a \u010a", "t h", "Ġ w", "o r", "l d", "> {")


def byte_chars() -> list[str]:
    """GPT-2's printable character for each byte (byte-level BPE vocabularies spell bytes so)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def qwen_vocab(n: int) -> tuple[list[str], list[int]]:
    """256 byte tokens, a few merged words, Qwen3's special tokens, then filler words up to `n` ids."""
    tokens = [*byte_chars(), *QWEN_WORDS, *(t for t, _ in QWEN_SPECIALS)]
    types = [1] * (256 + len(QWEN_WORDS)) + [ty for _, ty in QWEN_SPECIALS]
    i = 0
    while len(tokens) < n:
        tokens.append(f"Ġq{i}")
        types.append(1)
        i += 1
    return tokens, types


def _add_qwen_vocab(w: gguf.GGUFWriter, n_vocab: int) -> None:
    tokens, types = qwen_vocab(n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(list(QWEN_MERGES))
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))


def _vocab(n: int) -> tuple[list[bytes], list[float], list[int]]:
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    types = [2, 3, 3] + [6] * 256
    i = 0
    while len(tokens) < n:
        tokens.append(f"\u2581w{i}".encode())
        types.append(1)
        i += 1
    scores = [0.0] * 3 + [0.0] * 256 + [-float(k) for k in range(len(tokens) - 259)]
    return tokens, scores, types


def _quant(w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    if qtype == gguf.GGMLQuantizationType.F32:
        return w.astype(np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return w.astype(np.float16)
    return gguf.quants.quantize(w.astype(np.float32), qtype)


def write_tiny_model(path: str | Path, spec: TinySpec = TinySpec()) -> Path:
    """Write a random model of `spec` to `path` and return it. Norm weights stay F32, as llama.cpp writes them."""
    rng = np.random.default_rng(spec.seed)
    path = Path(path)
    arch = spec.arch
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(spec.ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layer)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_layer_norm_rms_eps(spec.eps)
    w.add_rope_freq_base(spec.rope_base)
    traits = traits_for(arch)
    assert traits is not None, arch
    if traits.swa_pattern:
        w.add_sliding_window(spec.sliding_window)
    if spec.rope_scale is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(spec.rope_scale)
    if spec.long_rope:  # what convert_hf_to_gguf writes for Phi-3 128k: no scaling type
        w.add_rope_scaling_orig_ctx_len(spec.original_context)
        scale = spec.ctx / spec.original_context
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(scale) / np.log(spec.original_context))))
    if spec.vocab == "qwen":
        _add_qwen_vocab(w, spec.n_vocab)
    else:
        _add_vocab(w, spec.n_vocab)
        w.add_tokenizer_pre("default")
        w.add_unk_token_id(0)
    w.add_add_bos_token(False)
    if spec.chat_template is not None:
        w.add_chat_template(spec.chat_template)

    d, hd, ff, v = spec.n_embd, spec.head_dim, spec.n_ff, spec.n_vocab
    q = spec.weight_type

    def lin(name: str, n_out: int, n_in: int, scale: float | None = None) -> None:
        s = scale if scale is not None else 1.0 / np.sqrt(n_in)
        w.add_tensor(
            name,
            _quant(rng.normal(0, s, (n_out, n_in)), q),
            raw_dtype=None if q.name in ("F32", "F16") else q,
        )

    def norm(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32))

    def factors(name: str, low: float, high: float) -> None:
        w.add_tensor(name, np.geomspace(low, high, spec.head_dim // 2).astype(np.float32))

    lin("token_embd.weight", v, d, scale=1.0)
    if spec.rope_freqs:  # llama 3.x: high frequencies kept, low ones divided by up to 8
        factors("rope_freqs.weight", 1.0, 8.0)
    if spec.long_rope:
        factors("rope_factors_long.weight", 1.0, 12.0)
        factors("rope_factors_short.weight", 1.0, 1.5)
    qn, kn = spec.n_head * hd, spec.n_head_kv * hd
    bias_roles = USUAL_BIASES.get(arch, ()) if spec.bias_roles is None else spec.bias_roles
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", d)
        if traits.fused_qkv:
            lin(p + "attn_qkv.weight", qn + 2 * kn, d)
        else:
            lin(p + "attn_q.weight", qn, d)
            lin(p + "attn_k.weight", kn, d)
            lin(p + "attn_v.weight", kn, d)
        lin(p + "attn_output.weight", d, qn)
        for role, nm, n in (("q", "attn_q", qn), ("k", "attn_k", kn), ("v", "attn_v", kn)):
            if role in bias_roles:
                w.add_tensor(p + nm + ".bias", (0.1 * rng.standard_normal(n)).astype(np.float32))
        if traits.qk_norm:
            norm(p + "attn_q_norm.weight", hd)
            norm(p + "attn_k_norm.weight", hd)
        if traits.post_norms:
            norm(p + "post_attention_norm.weight", d)
            norm(p + "post_ffw_norm.weight", d)
        norm(p + "ffn_norm.weight", d)
        if traits.fused_gate_up:
            lin(p + "ffn_up.weight", 2 * ff, d)
        else:
            lin(p + "ffn_gate.weight", ff, d)
            lin(p + "ffn_up.weight", ff, d)
        lin(p + "ffn_down.weight", d, ff)
    norm("output_norm.weight", d)
    if not spec.tied and arch != "gemma3":
        lin("output.weight", v, d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_mamba(
    path: str | Path, *, n_layer: int = 2, d: int = 64, d_state: int = 8, seed: int = 0
) -> Path:
    """A random Mamba (v1) GGUF: a recurrent model, whose state llama.cpp cannot cut at a position. Not a
    family of models/archs/ (edge's graphs do not run it); llama.cpp loads it. Shapes as llama.cpp's
    LLM_ARCH_MAMBA reads them (numpy order: GGUF's reversed)."""
    rng = np.random.default_rng(seed)
    d_inner, d_conv, dt_rank, n_vocab = 2 * d, 4, 4, 320
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_context_length(2048)
    w.add_embedding_length(d)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(0)  # as convert_hf_to_gguf writes a Mamba: no FFN, no attention heads
    w.add_head_count(0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_ssm_conv_kernel(d_conv)
    w.add_ssm_inner_size(d_inner)
    w.add_ssm_state_size(d_state)
    w.add_ssm_time_step_rank(dt_rank)
    _add_vocab(w, n_vocab)
    w.add_unk_token_id(0)

    def lin(name: str, n_out: int, n_in: int) -> None:
        w.add_tensor(name, rng.normal(0, 1.0 / np.sqrt(n_in), (n_out, n_in)).astype(np.float32))

    lin("token_embd.weight", n_vocab, d)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(d, np.float32))
        lin(p + "ssm_in.weight", 2 * d_inner, d)
        lin(p + "ssm_conv1d.weight", d_inner, d_conv)
        w.add_tensor(p + "ssm_conv1d.bias", np.zeros(d_inner, np.float32))
        lin(p + "ssm_x.weight", dt_rank + 2 * d_state, d_inner)
        lin(p + "ssm_dt.weight", d_inner, dt_rank)
        w.add_tensor(p + "ssm_dt.bias", np.zeros(d_inner, np.float32))
        # A = -exp(A_log) as the converter stores it: negative, so the state decays
        w.add_tensor(p + "ssm_a", -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1)))
        w.add_tensor(p + "ssm_d", np.ones(d_inner, np.float32))
        lin(p + "ssm_out.weight", d, d_inner)
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    lin("output.weight", n_vocab, d)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def write_qwen2_q4_0(
    path: str | Path, *, d: int, n_layer: int, ff: int, n_head: int, n_head_kv: int, vocab: int, seed: int = 0
) -> Path:
    """A qwen2 GGUF of any shape with random Q4_0 codes (scales kept small so activations stay finite), written
    tensor by tensor: the writer holds one tensor's bytes at a time, so a 7B-shaped file costs little memory
    (benchmarks/build_memory.py --synthetic-7b; the build's memory test)."""
    h, kvh = n_head, n_head_kv
    hd = d // h
    rng = np.random.default_rng(seed)
    q4 = gguf.GGMLQuantizationType.Q4_0
    f32 = gguf.GGMLQuantizationType.F32

    def q4_0(rows: int, cols: int) -> np.ndarray:  # [rows, cols/32 blocks of 18 bytes]
        blocks = np.empty((rows, cols // 32, 18), np.uint8)
        scale = np.full((rows, cols // 32), 0.02 / np.sqrt(cols / 1024), np.float16)
        blocks[..., :2] = scale.view(np.uint8).reshape(rows, cols // 32, 2)
        blocks[..., 2:] = rng.integers(0, 256, (rows, cols // 32, 16), dtype=np.uint8)
        return blocks.reshape(rows, -1)

    shapes: list[tuple[str, tuple[int, ...], gguf.GGMLQuantizationType]] = [
        ("token_embd.weight", (vocab, d), q4),
        ("output_norm.weight", (d,), f32),
        ("output.weight", (vocab, d), q4),
    ]
    for i in range(n_layer):
        p = f"blk.{i}."
        shapes += [
            (p + "attn_norm.weight", (d,), f32),
            (p + "attn_q.weight", (d, d), q4),
            (p + "attn_q.bias", (d,), f32),
            (p + "attn_k.weight", (kvh * hd, d), q4),
            (p + "attn_k.bias", (kvh * hd,), f32),
            (p + "attn_v.weight", (kvh * hd, d), q4),
            (p + "attn_v.bias", (kvh * hd,), f32),
            (p + "attn_output.weight", (d, d), q4),
            (p + "ffn_norm.weight", (d,), f32),
            (p + "ffn_gate.weight", (ff, d), q4),
            (p + "ffn_up.weight", (ff, d), q4),
            (p + "ffn_down.weight", (d, ff), q4),
        ]
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(n_layer)
    w.add_context_length(32768)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(h)
    w.add_head_count_kv(kvh)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    _add_vocab(w, vocab)
    for name, shape, qtype in shapes:  # the header first: every tensor's info, then the data one by one
        nbytes = int(np.prod(shape)) * 4 if qtype == f32 else shape[0] * (shape[1] // 32) * 18
        byte_shape = shape if qtype == f32 else (shape[0], nbytes // shape[0])
        dtype = np.dtype(np.float32 if qtype == f32 else np.uint8)
        w.add_tensor_info(name, byte_shape, dtype, nbytes, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, qtype in shapes:
        if qtype == f32:
            arr = (
                (1.0 + 0.01 * rng.standard_normal(shape)).astype(np.float32)
                if "norm" in name
                else (0.01 * rng.standard_normal(shape)).astype(np.float32)
            )
        else:
            arr = q4_0(*shape)
        w.write_tensor_data(arr)
    w.close()
    return Path(path)
