"""models: GGUF files read and checked, the catalog, tokenizers, chat templates, and the decoder graphs built
from them (models/transformer.py)."""
