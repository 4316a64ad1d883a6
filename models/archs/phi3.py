"""Phi-3 / Phi-3.5 / Phi-4-mini (dense): Q, K and V in one attn_qkv tensor, gate and up in one ffn_up
([gate; up], SwiGLU), RoPE on halves (NeoX), no biases. 128k variants carry LongRoPE: rope_factors_long /
rope_factors_short tensors and rope.scaling.attn_factor (llama.cpp picks the long table for a context past
rope.scaling.original_context_length). llama.cpp disables Phi's sliding window, so edge does too."""

from edge.models.arch import ArchTraits

TRAITS = ArchTraits(
    name="phi3",
    rope_style="neox",
    activation="silu",
    fused_qkv=True,
    fused_gate_up=True,
    rope_factors="longrope",
)
