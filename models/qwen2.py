"""Qwen2 (and Qwen2.5-Coder): llama with Q/K/V biases and RoPE on halves (NeoX)."""

from edge.models.arch import ArchTraits, register

TRAITS = register(ArchTraits(name="qwen2", rope_style="neox", activation="silu", qkv_bias=True))
