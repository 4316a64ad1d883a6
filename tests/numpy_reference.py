"""A plain-numpy forward pass of the decoder families edge builds graphs for (models/archs/: llama, qwen2,
qwen3, phi3, gemma3).

Written from the model definitions (and llama.cpp's reading of their GGUF files), independently of edge's
ONNX builder: the file is read with gguf-py's `GGUFReader`, every tensor is decoded with
`gguf.quants.dequantize`, and the forward runs in float64 over the whole sequence at once (teacher forcing),
so it is the reference edge's fp32 graphs are measured against. Which steps a family has comes from its
`ArchTraits` (edge.models.arch), the one table of what differs:

    x = token_embd[ids]                                   (embed_scale: * sqrt(n_embd))
    per layer:
        h = rms_norm(x) * attn_norm
        q, k, v = h @ Wq^T (+ bq), h @ Wk^T (+ bk), h @ Wv^T (+ bv)      (biases where the file has them)
                  fused_qkv: [q; k; v] = h @ Wqkv^T
        q, k = rms_norm(q) * q_norm, rms_norm(k) * k_norm  per head      (qk_norm)
        q, k = rope(q), rope(k) at absolute positions
               rope_style norm: rotate adjacent pairs (x[2i], x[2i+1]) -- the GGUF layout of llama Q/K
               rope_style neox: rotate halves (x[i], x[i + hd/2])
               theta_i = pos * freq_scale * base^(-2i / hd) / factor_i, cos/sin times attn_factor
               (ggml_rope_ext without YaRN); gemma3: base 10k on sliding-window layers
        a = softmax(q k^T / sqrt(hd) + mask) v, grouped-query (head j reads KV head j // (n_head / n_kv))
        a = a @ Wo^T;  post_norms: a = rms_norm(a) * post_attention_norm
        x = x + a
        h = rms_norm(x) * ffn_norm
        m = (act(h @ Wgate^T) * (h @ Wup^T)) @ Wdown^T     act: SiLU | GELU tanh (gemma3)
            fused_gate_up: [gate; up] = h @ Wup^T
        post_norms: m = rms_norm(m) * post_ffw_norm
        x = x + m
    logits = (rms_norm(x) * output_norm) @ W_head^T      W_head = output.weight, else token_embd (tied)

RoPE scaling as llama.cpp reads it: freq_scale = 1 / {arch}.rope.scaling.factor (linear), attn_factor =
{arch}.rope.scaling.attn_factor, factor_i from rope_freqs.weight (Llama 3.x) or phi3's
rope_factors_long / rope_factors_short (long when the context exceeds rope.scaling.original_context_length).

Gemma 3 GGUF norm weights already hold (1 + w) (llama.cpp's converter adds the 1), so every norm is a plain
multiply. Gemma 3 layers are sliding-window except every 6th (layer % 6 == 5); a query at p sees keys at
p - window < j <= p there.

`streaming=(sink, capacity)` models a KV cache that keeps the first `sink` tokens and the most recent
`capacity - sink` ones (StreamingLLM eviction, with absolute RoPE positions): on global layers a query at p
sees key j iff j <= p and (j < sink or j >= p - (capacity - sink)).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType
from gguf.quants import dequantize

from edge.models.arch import ArchTraits, traits_for

ROPE_PAIRS = {"norm": "adjacent", "neox": "halves"}


@dataclass(frozen=True)
class RefModel:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    eps: float
    rope_base: float
    sliding_window: int | None
    weights: dict[str, np.ndarray]  # float64, numpy shape = reversed GGUF shape ([n_out, n_in] for linears)
    traits: ArchTraits
    freq_scale: float = 1.0
    attn_factor: float = 1.0
    original_context: int = 0  # LongRoPE: long factors past it (0: the training context)
    context_length: int = 0

    def is_local(self, layer: int) -> bool:
        p = self.traits.swa_pattern
        return bool(p) and self.sliding_window is not None and layer % p != p - 1

    def rope_factors(self, context: int) -> np.ndarray | None:
        """llama.cpp's get_rope_factors: rope_freqs, else LongRoPE's long (past the original context) or short."""
        w = self.weights
        if "rope_freqs.weight" in w:
            return w["rope_freqs.weight"]
        long = context > (self.original_context or self.context_length)
        return w.get("rope_factors_long.weight" if long else "rope_factors_short.weight")

    @property
    def vocab_size(self) -> int:
        return int(self.weights["token_embd.weight"].shape[0])


def _scalar(reader: GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    if field is None:
        if default is None:
            raise KeyError(key)
        return default
    assert field.types and field.types[0] != GGUFValueType.ARRAY, key
    return field.contents()


def load(path: str | Path) -> RefModel:
    """Read a decoder GGUF with gguf-py and dequantize every tensor with `gguf.quants.dequantize`."""
    reader = GGUFReader(str(path))
    arch = str(_scalar(reader, "general.architecture"))
    n_embd = int(_scalar(reader, f"{arch}.embedding_length"))
    n_head = int(_scalar(reader, f"{arch}.attention.head_count"))
    weights: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        shape = tuple(reversed([int(d) for d in t.shape]))
        values = dequantize(np.asarray(t.data), t.tensor_type)
        weights[t.name] = np.asarray(values, dtype=np.float64).reshape(shape)
    window = reader.get_field(f"{arch}.attention.sliding_window")
    traits = traits_for(arch)
    assert traits is not None, arch
    factor = float(_scalar(reader, f"{arch}.rope.scaling.factor", 0.0))
    return RefModel(
        arch=arch,
        n_layer=int(_scalar(reader, f"{arch}.block_count")),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=int(_scalar(reader, f"{arch}.attention.head_count_kv", n_head)),
        head_dim=int(_scalar(reader, f"{arch}.attention.key_length", n_embd // n_head)),
        eps=float(_scalar(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        rope_base=float(_scalar(reader, f"{arch}.rope.freq_base", 10000.0)),
        sliding_window=int(window.contents()) if window is not None and traits.swa_pattern else None,
        weights=weights,
        traits=traits,
        freq_scale=1.0 / factor if factor else 1.0,
        attn_factor=float(_scalar(reader, f"{arch}.rope.scaling.attn_factor", 1.0)),
        original_context=int(_scalar(reader, f"{arch}.rope.scaling.original_context_length", 0)),
        context_length=int(_scalar(reader, f"{arch}.context_length")),
    )


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def rope(
    x: np.ndarray,
    positions: np.ndarray,
    base: float,
    pairs: str,
    *,
    freq_scale: float = 1.0,
    factors: np.ndarray | None = None,
    attn_factor: float = 1.0,
) -> np.ndarray:
    """Rotate x [n, heads, hd] by angle pos * freq_scale * base^(-2i/hd) / factors[i] in each pair i: (2i,
    2i+1) or (i, i + hd/2); the result times attn_factor."""
    hd = x.shape[-1]
    freqs = freq_scale * base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)  # [hd/2]
    if factors is not None:
        freqs = freqs / factors
    ang = positions.astype(np.float64)[:, None, None] * freqs[None, None, :]  # [n, 1, hd/2]
    cos, sin = np.cos(ang) * attn_factor, np.sin(ang) * attn_factor
    if pairs == "adjacent":
        a, b = x[..., 0::2], x[..., 1::2]
    elif pairs == "halves":
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
    else:
        raise ValueError(pairs)
    ra, rb = a * cos - b * sin, a * sin + b * cos
    out = np.empty_like(x)
    if pairs == "adjacent":
        out[..., 0::2], out[..., 1::2] = ra, rb
    else:
        out[..., : hd // 2], out[..., hd // 2 :] = ra, rb
    return out


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def visible(
    n: int, *, window: int | None = None, streaming: tuple[int, int] | None = None, start: int = 0
) -> np.ndarray:
    """[n, n] bool: query at position start + i sees key at start + j."""
    p = start + np.arange(n)[:, None]
    j = start + np.arange(n)[None, :]
    ok = j <= p
    if window is not None:
        ok &= p - j < window
    if streaming is not None:
        sink, capacity = streaming
        ok &= (j < sink) | (j >= p - (capacity - sink))
    return ok


def forward(
    model: RefModel,
    ids: Sequence[int],
    *,
    streaming: tuple[int, int] | None = None,
    matmul: Callable[[np.ndarray, str], np.ndarray] | None = None,
    attn_round: Callable[[np.ndarray], np.ndarray] | None = None,
    context: int = 0,
) -> np.ndarray:
    """Logits [len(ids), vocab] (float64) for the sequence at positions 0..n-1, every position scored;
    `context` is the KV cache size the engine was given (it picks LongRoPE's factors).

    Hooks for modelling another engine's roundings (benchmarks/llamacpp_rounding.py, removed at 1363000): `matmul(x, name)`
    computes x @ W^T for the weight `name + ".weight"` (bias added after it), `attn_round` is applied to Q, K
    and V after RoPE and to the attention probabilities."""
    m, w, t = model, model.weights, model.traits
    ids_arr = np.asarray(ids, dtype=np.int64)
    n, hd = len(ids_arr), m.head_dim
    group = m.n_head // m.n_head_kv
    positions = np.arange(n)
    pairs = ROPE_PAIRS[t.rope_style]
    factors = m.rope_factors(context)

    def lin(x: np.ndarray, name: str) -> np.ndarray:
        y = x @ w[name + ".weight"].T if matmul is None else matmul(x, name)
        bias = w.get(name + ".bias")
        return y if bias is None else y + bias

    x = w["token_embd.weight"][ids_arr]
    if t.embed_scale:
        x = x * math.sqrt(m.n_embd)
    for i in range(m.n_layer):
        p = f"blk.{i}."
        h = rms_norm(x, w[p + "attn_norm.weight"], m.eps)
        if p + "attn_qkv.weight" in w:
            q, k, v = np.split(
                lin(h, p + "attn_qkv"), [m.n_head * hd, (m.n_head + m.n_head_kv) * hd], axis=-1
            )
        else:
            q, k, v = lin(h, p + "attn_q"), lin(h, p + "attn_k"), lin(h, p + "attn_v")
        q, k, v = q.reshape(n, m.n_head, hd), k.reshape(n, m.n_head_kv, hd), v.reshape(n, m.n_head_kv, hd)
        if t.qk_norm:
            q = rms_norm(q, w[p + "attn_q_norm.weight"], m.eps)
            k = rms_norm(k, w[p + "attn_k_norm.weight"], m.eps)
        local = m.is_local(i)
        base = t.swa_rope_base if local else m.rope_base
        scaling = {"freq_scale": m.freq_scale, "factors": factors, "attn_factor": m.attn_factor}
        q, k = rope(q, positions, base, pairs, **scaling), rope(k, positions, base, pairs, **scaling)
        if attn_round is not None:
            q, k, v = attn_round(q), attn_round(k), attn_round(v)
        see = visible(
            n,
            window=m.sliding_window if local else None,
            streaming=None if local else streaming,
        )
        k_full = np.repeat(k, group, axis=1)  # [n, n_head, hd]: query head j reads KV head j // group
        v_full = np.repeat(v, group, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k_full) / math.sqrt(hd)
        scores = np.where(see[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        if attn_round is not None:
            probs = attn_round(probs)
        attn = np.einsum("hqk,khd->qhd", probs, v_full).reshape(n, m.n_head * hd)
        attn = lin(attn, p + "attn_output")
        if t.post_norms:
            attn = rms_norm(attn, w[p + "post_attention_norm.weight"], m.eps)
        x = x + attn
        h = rms_norm(x, w[p + "ffn_norm.weight"], m.eps)
        act = {"silu": silu, "gelu_tanh": gelu_tanh}[t.activation]
        if t.fused_gate_up:  # ggml_swiglu: silu(first half) * second half
            gate, up = np.split(lin(h, p + "ffn_up"), 2, axis=-1)
        else:
            gate, up = lin(h, p + "ffn_gate"), lin(h, p + "ffn_up")
        mlp = lin(act(gate) * up, p + "ffn_down")
        if t.post_norms:
            mlp = rms_norm(mlp, w[p + "post_ffw_norm.weight"], m.eps)
        x = x + mlp
    x = rms_norm(x, w["output_norm.weight"], m.eps)
    return lin(x, "output" if "output.weight" in w else "token_embd")
