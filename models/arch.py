"""Decoder hyper-parameters from GGUF metadata, and the per-architecture traits the graph builder needs."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.errors import ModelFormatError

_BLOCK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class ArchTraits:
    """What distinguishes one decoder family from another; the shared builder reads only these."""

    name: str
    rope_style: str  # "norm": adjacent pairs (llama GGUF layout) | "neox": halves
    activation: str  # "silu" | "gelu_tanh" (gated MLP either way)
    qkv_bias: bool = False
    qk_norm: bool = False
    post_norms: bool = False  # norm after attention and after the MLP, before the residual add
    embed_scale: bool = False  # multiply embeddings by sqrt(n_embd)
    swa_pattern: int = 0  # every n-th layer global, the rest sliding-window (gemma3: 6)
    swa_rope_base: float = 10000.0


TRAITS: dict[str, ArchTraits] = {}


def register(traits: ArchTraits) -> ArchTraits:
    TRAITS[traits.name] = traits
    return traits


@dataclass(frozen=True)
class ArchConfig:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    context_length: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    sliding_window: int | None
    attn_scale: float
    tied_embeddings: bool
    traits: ArchTraits

    def is_local(self, layer: int) -> bool:
        """Sliding-window layer (llama.cpp's swa pattern: every n-th layer is global)."""
        p = self.traits.swa_pattern
        return bool(p) and self.sliding_window is not None and layer % p < p - 1

    def rope_base_for(self, layer: int) -> float:
        return self.traits.swa_rope_base if self.is_local(layer) else self.rope_base

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any], tensor_names: set[str]) -> ArchConfig:
        arch = metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError("general.architecture is missing", hint="this is not a model GGUF file")
        _load_builders()
        traits = TRAITS.get(arch)
        if traits is None:
            raise ModelFormatError(
                f"architecture {arch!r} has no graph builder",
                hint=f"supported: {', '.join(sorted(TRAITS))}; or run it with --backend llamacpp",
            )

        def req(key: str) -> int | float:
            value = metadata.get(f"{arch}.{key}")
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ModelFormatError(f"{arch}.{key} is missing or invalid ({value!r})")
            return value

        def opt_int(key: str, default: int) -> int:
            value = metadata.get(f"{arch}.{key}", default)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ModelFormatError(
                    f"{arch}.{key} should be a positive integer, not {value!r}",
                    hint="per-layer values are not supported by the graph builder; try --backend llamacpp",
                )
            return int(value)

        n_embd, n_head = int(req("embedding_length")), int(req("attention.head_count"))
        n_head_kv = opt_int("attention.head_count_kv", n_head)
        head_dim = opt_int("attention.key_length", n_embd // n_head)
        if n_head % n_head_kv:
            raise ModelFormatError(f"{n_head} attention heads do not split into {n_head_kv} KV groups")
        n_layer = int(req("block_count"))
        check_block_count(metadata, tensor_names)
        vocab = _vocab_size(metadata, arch)
        window = metadata.get(f"{arch}.attention.sliding_window")
        scale = 1.0 / math.sqrt(head_dim)
        if arch == "gemma3" and n_layer == 62:  # gemma3-27b scales by n_embd / n_head, as llama.cpp does
            scale = 1.0 / math.sqrt(n_embd / n_head)
        _check_rope_scaling(metadata, arch)
        cfg = cls(
            arch=arch,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_ff=int(req("feed_forward_length")),
            n_vocab=vocab,
            context_length=int(req("context_length")),
            rms_eps=float(req("attention.layer_norm_rms_epsilon")),
            rope_base=float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
            rope_dim=opt_int("rope.dimension_count", head_dim),
            sliding_window=int(window) if isinstance(window, int) and traits.swa_pattern else None,
            attn_scale=scale,
            tied_embeddings="output.weight" not in tensor_names,
            traits=traits,
        )
        check_understood(cfg, tensor_names)
        return cfg


_LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
# What each known tensor the graph builder does not read means, for the message
_NOT_IMPLEMENTED = {
    "rope_freqs.weight": "RoPE frequency factors (Llama 3.1 / 3.2 rope scaling)",
}


def understood_tensors(cfg: ArchConfig) -> set[str]:
    """Every tensor name the graph builder reads for `cfg` (a linear's .bias wherever the file has one)."""
    names = {"token_embd.weight", "output_norm.weight", "output.weight"}
    per_layer = ["attn_norm.weight", "ffn_norm.weight"]
    per_layer += [f"{n}.{kind}" for n in _LINEARS for kind in ("weight", "bias")]
    if cfg.traits.qk_norm:
        per_layer += ["attn_q_norm.weight", "attn_k_norm.weight"]
    if cfg.traits.post_norms:
        per_layer += ["post_attention_norm.weight", "post_ffw_norm.weight"]
    for i in range(cfg.n_layer):
        names.update(f"blk.{i}.{n}" for n in per_layer)
    return names


def check_understood(cfg: ArchConfig, tensor_names: Iterable[str]) -> None:
    """A tensor the graph builder would not read changes the model (a scaling table, an extra norm): the own
    graph would be silently wrong, so it is refused; llama.cpp may know it."""
    unknown = sorted(set(tensor_names) - understood_tensors(cfg))
    if unknown:
        what = _NOT_IMPLEMENTED.get(unknown[0], "a tensor edge's graph builder does not use")
        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise ModelFormatError(
            f"{cfg.arch} file has tensor {unknown[0]!r}{more}: {what}, not in edge's own graph for {cfg.arch}",
            hint="run it with --backend llamacpp",
        )


def _check_rope_scaling(metadata: Mapping[str, Any], arch: str) -> None:
    """RoPE scaling (linear, yarn, longrope, llama3) changes every position's rotation: not implemented in the
    own graphs, so it is refused rather than ignored."""
    kind = metadata.get(f"{arch}.rope.scaling.type")
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    # a factor without a type is llama.cpp's linear scaling
    scaled = (kind is None and factor not in (None, 0, 1)) if kind in (None, "none") else factor != 1
    if scaled:
        raise ModelFormatError(
            f"{arch}.rope.scaling.type is {kind!r} (factor {factor!r}): RoPE scaling is not in edge's own graphs",
            hint="run it with --backend llamacpp",
        )


def check_block_count(metadata: Mapping[str, Any], tensor_names: Iterable[str]) -> None:
    """`{arch}.block_count` sizes every per-layer structure (and llama.cpp aborts the process on a wrong
    one): it must be a positive integer no larger than the number of `blk.N.` groups of tensors."""
    arch = metadata.get("general.architecture")
    n = metadata.get(f"{arch}.block_count")
    if n is None:
        return  # the loader reports the missing key
    blocks = {m.group(1) for name in tensor_names if (m := _BLOCK.match(name))}
    if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or not 0 < n <= len(blocks):
        raise ModelFormatError(
            f"{arch}.block_count is {n!r} but the file holds tensors of {len(blocks)} blocks",
            hint="the file is corrupt or incomplete",
        )


def check_tensor_shapes(cfg: ArchConfig, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """The tensors every family has must have the shapes the hyper-parameters give them (GGUF order, ne[0]
    first), so that a lying file ends in ModelFormatError here instead of inside a backend's graph compiler."""
    d, v, q, kv = cfg.n_embd, cfg.n_vocab, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    want: dict[str, tuple[int, ...]] = {"token_embd.weight": (d, v), "output_norm.weight": (d,)}
    if not cfg.tied_embeddings:
        want["output.weight"] = (d, v)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        want |= {
            p + "attn_norm.weight": (d,),
            p + "attn_q.weight": (d, q),
            p + "attn_k.weight": (d, kv),
            p + "attn_v.weight": (d, kv),
            p + "attn_output.weight": (q, d),
            p + "ffn_gate.weight": (d, cfg.n_ff),
            p + "ffn_up.weight": (d, cfg.n_ff),
            p + "ffn_down.weight": (cfg.n_ff, d),
        }
    for name, shape in want.items():
        have = shapes.get(name)
        if have is not None and tuple(have) != shape:
            raise ModelFormatError(
                f"tensor {name!r} has shape {list(have)} but the hyper-parameters make it {list(shape)}",
                hint="the file's metadata and tensors disagree: it is corrupt or was converted wrongly",
            )


def _vocab_size(metadata: Mapping[str, Any], arch: str) -> int:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and tokens:
        return len(tokens)
    v = metadata.get(f"{arch}.vocab_size")
    if isinstance(v, int) and v > 0:
        return v
    raise ModelFormatError("the vocabulary size is unknown (no tokenizer.ggml.tokens)")


def _load_builders() -> None:
    # one module per architecture registers its traits on import
    from edge.models import gemma3, llama, qwen2  # noqa: F401
