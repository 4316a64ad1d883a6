"""Qwen2 (Qwen2.5, Qwen2.5-Coder): llama with Q/K/V biases and RoPE on halves (NeoX); tied embeddings up to
1.5B, an output.weight from 3B."""

from edge.models.arch import ArchTraits

TRAITS = ArchTraits(name="qwen2", rope_style="neox", activation="silu", biases=frozenset({"q", "k", "v"}))
