"""Decoder hyper-parameters from GGUF metadata, and the per-architecture traits the graph builder needs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge.errors import ModelFormatError


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

        n_embd, n_head = int(req("embedding_length")), int(req("attention.head_count"))
        n_head_kv = int(metadata.get(f"{arch}.attention.head_count_kv", n_head))
        head_dim = int(metadata.get(f"{arch}.attention.key_length", n_embd // n_head))
        if n_head_kv <= 0 or n_head % n_head_kv:
            raise ModelFormatError(f"{n_head} attention heads do not split into {n_head_kv} KV groups")
        n_layer = int(req("block_count"))
        vocab = _vocab_size(metadata, arch)
        window = metadata.get(f"{arch}.attention.sliding_window")
        scale = 1.0 / math.sqrt(head_dim)
        if arch == "gemma3" and n_layer == 62:  # gemma3-27b scales by n_embd / n_head, as llama.cpp does
            scale = 1.0 / math.sqrt(n_embd / n_head)
        return cls(
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
            rope_dim=int(metadata.get(f"{arch}.rope.dimension_count", head_dim)),
            sliding_window=int(window) if isinstance(window, int) and traits.swa_pattern else None,
            attn_scale=scale,
            tied_embeddings="output.weight" not in tensor_names,
            traits=traits,
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
    from models import gemma3, llama, qwen2  # noqa: F401
