"""Qwen3 (dense): qwen2 without Q/K/V biases and with an RMSNorm over each Q and K head before RoPE (NeoX);
tied embeddings up to 4B, an output.weight from 8B."""

from edge.models.arch import ArchTraits

TRAITS = ArchTraits(name="qwen3", rope_style="neox", activation="silu", qk_norm=True)
