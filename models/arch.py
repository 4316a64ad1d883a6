"""Decoder hyper-parameters from GGUF metadata, and the per-architecture traits the graph builder needs."""

from __future__ import annotations

import importlib
import math
import pkgutil
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge.errors import ModelFormatError

_BLOCK = re.compile(r"blk\.(\d+)\.")


# Every tensor name the builders know, by role (GGUF's names, shared by all families as in llama.cpp's
# LLM_TENSOR_NAMES); per-layer ones are prefixed with `blk.N.`.
GLOBAL_TENSORS = {
    "embed": "token_embd.weight",
    "output_norm": "output_norm.weight",
    "head": "output.weight",
    "rope_freqs": "rope_freqs.weight",  # llama 3.x: one divisor per rotated pair
    "rope_long": "rope_factors_long.weight",  # phi3 LongRoPE: divisors past the original context
    "rope_short": "rope_factors_short.weight",  # phi3 LongRoPE: divisors within it
}
LAYER_TENSORS = {
    "attn_norm": "attn_norm.weight",
    "q": "attn_q.weight",
    "k": "attn_k.weight",
    "v": "attn_v.weight",
    "qkv": "attn_qkv.weight",  # [q; k; v] in one tensor
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "attn_output": "attn_output.weight",
    "post_attention_norm": "post_attention_norm.weight",
    "ffn_norm": "ffn_norm.weight",
    "gate": "ffn_gate.weight",
    "up": "ffn_up.weight",  # [gate; up] where the family fuses them (no ffn_gate)
    "down": "ffn_down.weight",
    "post_ffw_norm": "post_ffw_norm.weight",
}
LINEARS = ("q", "k", "v", "qkv", "attn_output", "gate", "up", "down")
ROPE_FACTORS = {"none": (), "freqs": ("rope_freqs",), "longrope": ("rope_long", "rope_short")}


@dataclass(frozen=True)
class ArchTraits:
    """What distinguishes one decoder family from another: the shared builder, the tensor checks and the
    numpy reference read only these. One per file in models/archs/, found by the GGUF's architecture name."""

    name: str
    rope_style: str  # "norm": adjacent pairs (llama GGUF layout) | "neox": halves
    activation: str  # "silu" | "gelu_tanh" (gated MLP either way)
    biases: frozenset[str] = frozenset()  # linear roles that may carry a .bias tensor (llama.cpp loads it)
    qk_norm: bool = False  # RMSNorm over each Q and K head before RoPE
    post_norms: bool = False  # norm after attention and after the MLP, before the residual add
    embed_scale: bool = False  # multiply embeddings by sqrt(n_embd)
    fused_qkv: bool = False  # attn_qkv may stand for attn_q/k/v (one layer at a time)
    fused_gate_up: bool = False  # ffn_up holds [gate; up] (2 * n_ff rows) and there is no ffn_gate
    rope_factors: str = "none"  # per-pair frequency divisors it may carry: a key of ROPE_FACTORS
    swa_pattern: int = 0  # every n-th layer global, the rest sliding-window (gemma3: 6)
    swa_rope_base: float = 10000.0
    scale_by_embd_at: tuple[int, ...] = ()  # layer counts whose attention scale is 1/sqrt(n_embd / n_head)

    def __post_init__(self) -> None:
        if self.rope_factors not in ROPE_FACTORS or not self.biases <= set(LINEARS):
            raise ValueError(f"{self.name}: unknown rope_factors or bias roles")

    def layer_roles(self) -> list[str]:
        """The roles of the per-layer tensors the family may hold (not all present in every file)."""
        roles = ["attn_norm", "q", "k", "v", "attn_output", "ffn_norm", "up", "down"]
        roles += ["qkv"] if self.fused_qkv else []
        roles += [] if self.fused_gate_up else ["gate"]
        roles += ["q_norm", "k_norm"] if self.qk_norm else []
        roles += ["post_attention_norm", "post_ffw_norm"] if self.post_norms else []
        return roles


def traits_for(arch: str) -> ArchTraits | None:
    """The family's traits from models/archs/<arch>.py, or None when edge has no builder for it."""
    from edge.models import archs

    if arch not in architectures():
        return None
    module = importlib.import_module(f"{archs.__name__}.{arch}")
    traits = getattr(module, "TRAITS", None)
    if not isinstance(traits, ArchTraits) or traits.name != arch:
        raise TypeError(f"{module.__name__} must define TRAITS = ArchTraits(name={arch!r}, ...)")
    return traits


def architectures() -> list[str]:
    """Names of the families edge builds graphs for: one module each in models/archs/."""
    from edge.models import archs

    return sorted(m.name for m in pkgutil.iter_modules(archs.__path__) if not m.name.startswith("_"))


@dataclass(frozen=True)
class RopeScaling:
    """How llama.cpp scales RoPE for a file (ggml_rope_ext without YaRN): the angle of pair i at position p
    is p * freq_scale * base^(-2i/d) / factor_i, and cos/sin are multiplied by attn_factor."""

    freq_scale: float = 1.0  # linear scaling: 1 / rope.scaling.factor
    attn_factor: float = 1.0  # rope.scaling.attn_factor (phi3 LongRoPE's magnitude correction)
    original_context: int = 0  # rope.scaling.original_context_length (LongRoPE picks long factors past it)


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
    rope_scaling: RopeScaling = RopeScaling()

    def is_local(self, layer: int) -> bool:
        """Sliding-window layer (llama.cpp's swa pattern: every n-th layer is global)."""
        p = self.traits.swa_pattern
        return bool(p) and self.sliding_window is not None and layer % p < p - 1

    def rope_base_for(self, layer: int) -> float:
        return self.traits.swa_rope_base if self.is_local(layer) else self.rope_base

    def long_rope(self, context: int) -> bool:
        """Whether LongRoPE's long factors apply to a KV cache of `context` tokens (llama.cpp: past the
        original context length, else the short ones)."""
        orig = self.rope_scaling.original_context or self.context_length
        return self.traits.rope_factors == "longrope" and context > orig

    def rope_factor_tensor(self, tensor_names: Iterable[str], long_rope: bool) -> str | None:
        """The frequency-factor tensor llama.cpp applies (llama_model::get_rope_factors): rope_freqs when the
        file has it, else LongRoPE's long or short factors."""
        names = set(tensor_names)
        role = (
            "rope_freqs"
            if GLOBAL_TENSORS["rope_freqs"] in names
            else "rope_long"
            if long_rope
            else "rope_short"
        )
        return GLOBAL_TENSORS[role] if GLOBAL_TENSORS[role] in names else None

    @classmethod
    def from_gguf(cls, metadata: Mapping[str, Any], tensor_names: set[str]) -> ArchConfig:
        arch = metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError("general.architecture is missing", hint="this is not a model GGUF file")
        traits = traits_for(arch)
        if traits is None:
            raise ModelFormatError(
                f"architecture {arch!r} has no graph builder",
                hint=f"supported: {', '.join(architectures())}; or run it with --backend llamacpp",
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
        if n_layer in traits.scale_by_embd_at:  # gemma3-27b scales by n_embd / n_head, as llama.cpp does
            scale = 1.0 / math.sqrt(n_embd / n_head)
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
            tied_embeddings=GLOBAL_TENSORS["head"] not in tensor_names,
            traits=traits,
            rope_scaling=rope_scaling(metadata, arch),
        )
        check_understood(cfg, tensor_names)
        return cfg


# What each known tensor a family's builder does not read means, for the message
_NOT_IMPLEMENTED = {
    GLOBAL_TENSORS["rope_freqs"]: "RoPE frequency factors (Llama 3.1 / 3.2 rope scaling)",
    GLOBAL_TENSORS["rope_long"]: "LongRoPE frequency factors (phi3)",
    GLOBAL_TENSORS["rope_short"]: "LongRoPE frequency factors (phi3)",
}


def understood_tensors(cfg: ArchConfig) -> set[str]:
    """Every tensor name the graph builder reads for `cfg` (a linear's .bias where the family has one)."""
    t = cfg.traits
    names = {GLOBAL_TENSORS[r] for r in ("embed", "output_norm", "head", *ROPE_FACTORS[t.rope_factors])}
    per_layer = [LAYER_TENSORS[r] for r in t.layer_roles()]
    per_layer += [LAYER_TENSORS[r].replace(".weight", ".bias") for r in t.biases]
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


def rope_scaling(metadata: Mapping[str, Any], arch: str) -> RopeScaling:
    """The RoPE scaling llama.cpp applies for this file. Linear scaling (a factor, with type linear or no
    type) and an attention factor are implemented; YaRN and the other types change the rotation in ways the
    own graphs do not, so they are refused rather than ignored."""
    kind = metadata.get(f"{arch}.rope.scaling.type")
    factor = metadata.get(f"{arch}.rope.scaling.factor", metadata.get(f"{arch}.rope.scale_linear"))
    attn = metadata.get(f"{arch}.rope.scaling.attn_factor", 1.0)
    orig = metadata.get(f"{arch}.rope.scaling.original_context_length", 0)
    if kind not in (None, "none", "linear"):
        raise ModelFormatError(
            f"{arch}.rope.scaling.type is {kind!r} (factor {factor!r}): this RoPE scaling is not in edge's own "
            "graphs (they implement linear scaling and frequency-factor tensors)",
            hint="run it with --backend llamacpp",
        )
    numbers = {"factor": factor, "attn_factor": attn, "original_context_length": orig}
    for key, value in numbers.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0
        ):
            raise ModelFormatError(f"{arch}.rope.scaling.{key} is {value!r}: not a non-negative number")
    # llama.cpp: type none never scales; a factor of 0 (or none) means 1
    scale = 1.0 if kind == "none" or not factor else 1.0 / float(factor)
    return RopeScaling(freq_scale=scale, attn_factor=float(attn), original_context=int(orig))


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
    """Every tensor the family reads must have the shape the hyper-parameters give it (GGUF order, ne[0]
    first), so that a lying file ends in ModelFormatError here instead of inside a backend's graph compiler."""
    d, v, hd = cfg.n_embd, cfg.n_vocab, cfg.head_dim
    q, kv, ff = cfg.n_head * hd, cfg.n_head_kv * hd, cfg.n_ff
    t = cfg.traits
    outputs = {"q": q, "k": kv, "v": kv, "qkv": q + 2 * kv, "attn_output": d, "gate": ff}
    outputs |= {"up": 2 * ff if t.fused_gate_up else ff, "down": d}
    inputs = {"attn_output": q, "down": ff}
    norms = {"q_norm": hd, "k_norm": hd}
    want: dict[str, tuple[int, ...]] = {
        GLOBAL_TENSORS["embed"]: (d, v),
        GLOBAL_TENSORS["output_norm"]: (d,),
        GLOBAL_TENSORS["head"]: (d, v),
    }
    want |= {GLOBAL_TENSORS[r]: (cfg.rope_dim // 2,) for r in ROPE_FACTORS[t.rope_factors]}
    for i in range(cfg.n_layer):
        for role in t.layer_roles():
            name = f"blk.{i}.{LAYER_TENSORS[role]}"
            if role in LINEARS:
                want[name] = (inputs.get(role, d), outputs[role])
            else:
                want[name] = (norms.get(role, d),)
        for role in t.biases:
            want[f"blk.{i}.{LAYER_TENSORS[role]}".replace(".weight", ".bias")] = (outputs[role],)
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
