"""Gemma 3: embeddings scaled by sqrt(d), QK-norm, norms before and after attention and MLP, GeGLU, five
sliding-window layers (RoPE base 10k) per global layer (RoPE base from the file), tied embeddings.

The GGUF norm weights already hold (1 + w) (llama.cpp's converter adds the 1), so the RMSNorm is plain.
"""

from edge.models.arch import ArchTraits

TRAITS = ArchTraits(
    name="gemma3",
    rope_style="neox",
    activation="gelu_tanh",
    qk_norm=True,
    post_norms=True,
    embed_scale=True,
    swa_pattern=6,
    swa_rope_base=10000.0,
    scale_by_embd_at=(62,),  # gemma3-27b
)
