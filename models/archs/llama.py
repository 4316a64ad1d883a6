"""Llama (SmolLM2, Mistral, Llama 3.x): RMSNorm, SwiGLU, RoPE on adjacent pairs (GGUF stores Q/K permuted for
that); Llama 3.1 / 3.2 files carry their RoPE scaling as rope_freqs.weight (one divisor per pair)."""

from edge.models.arch import LINEARS, ArchTraits

# llama.cpp loads an optional bias for every linear of a llama file
TRAITS = ArchTraits(
    name="llama",
    rope_style="norm",
    activation="silu",
    biases=frozenset(LINEARS) - {"qkv"},
    rope_factors="freqs",
)
