"""A real model as an F32 GGUF whose weights are on no quantization grid: the residual stream rotated.

The catalog models are all quantized GGUFs: re-quantizing them measures little, since a 4-bit block comes back
exactly onto a 4-bit grid. To measure INT4 / INT8 quantization of float weights on a model that behaves like a
real one (peaked next-token distributions, real activations), the residual stream of a llama / qwen2 model is
rotated by a random orthogonal R (QuaRot, Ashkboos et al. 2024): h -> h R. RMSNorm commutes with R once its
gain is folded into the linears that read it, so the rotated model computes the same function, in float32,
with every weight a dense mix of the originals:

    reads the residual (q, k, v, gate, up, head):  W -> W diag(g) R     (the norm's gain g becomes ones)
    writes the residual (attn_output, ffn_down):   W -> R^T W
    token embedding rows:                          E -> E R
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np

_READS = ("attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up")
_WRITES = ("attn_output", "ffn_down")


def _f32(t: gguf.ReaderTensor) -> np.ndarray:
    return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)


def write_rotated_f32(src: Path, dst: Path, *, seed: int = 0) -> Path:
    """Write `src` (a llama / qwen2 GGUF, any tensor types) to `dst` as the rotated F32 model."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"rotation is written for llama / qwen2 (one RMSNorm per block), not {arch}")
    tensors = {t.name: t for t in reader.tensors}
    d = int(reader.fields[f"{arch}.embedding_length"].contents())
    r = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))[0].astype(np.float64)

    def reads(w: np.ndarray, gain: np.ndarray) -> np.ndarray:
        return ((w.astype(np.float64) * gain[None, :]) @ r).astype(np.float32)

    out: dict[str, np.ndarray] = {}
    embd = _f32(tensors["token_embd.weight"])
    out["token_embd.weight"] = (embd.astype(np.float64) @ r).astype(np.float32)
    head = (
        _f32(tensors["output.weight"]) if "output.weight" in tensors else embd
    )  # tied: an explicit head now
    out["output.weight"] = reads(head, _f32(tensors["output_norm.weight"]))
    out["output_norm.weight"] = np.ones(d, np.float32)
    for name, t in tensors.items():
        parts = name.split(".")
        if parts[0] != "blk":
            continue
        kind = parts[2]
        w = _f32(t)
        if kind in _READS and parts[-1] == "weight":
            norm = "attn_norm" if kind.startswith("attn") else "ffn_norm"
            w = reads(w, _f32(tensors[f"blk.{parts[1]}.{norm}.weight"]))
        elif kind in _WRITES:
            w = (r.T @ w.astype(np.float64)).astype(np.float32)
        elif kind in ("attn_norm", "ffn_norm"):
            w = np.ones_like(w)
        out[name] = w  # q / k / v biases act after the projection: unchanged

    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name in ("general.architecture", "general.file_type") or field.name.startswith("GGUF."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    for name in sorted(out, key=lambda n: (n.startswith("blk."), n)):
        writer.add_tensor(name, out[name])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def llamacpp_quantize(
    src: Path, dst: Path, ftype: str, *, embed_head_q8: bool = False, threads: int = 2
) -> Path:
    """`src` quantized by llama.cpp's own quantizer (llama_model_quantize with its defaults for `ftype`, e.g.
    "Q4_1", "Q4_K_M", "Q8_0"), for comparing quantizers on the same float model. embed_head_q8: the token
    embedding and the output head at Q8_0 (as edge's INT4 policy keeps them at INT8)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads
    if embed_head_q8:
        params.token_embedding_type = params.output_tensor_type = int(gguf.GGMLQuantizationType.Q8_0)
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize to {ftype} failed ({rc})")
    return dst
