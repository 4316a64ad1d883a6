"""Llama (and SmolLM2): RMSNorm, SwiGLU, RoPE on adjacent pairs (GGUF stores Q/K permuted for that)."""

from edge.models.arch import ArchTraits, register

TRAITS = register(ArchTraits(name="llama", rope_style="norm", activation="silu"))
